"""Where the launchers of a job keep what they share: the job store.

:class:`~ft_core.launcher.coordination.JobCoordinator` needs only a handful of
operations on a few string keys (read, write, compare-and-set, add), all of
which must be atomic across every launcher of the job. :class:`JobStore` is
that contract; two implementations exist:

* :class:`C10dJobStore` over a ``torch.distributed.Store`` (the c10d
  rendezvous' ``TCPStore``, the static backend's store, or a ``HashStore`` in
  tests). With the c10d backend the store is served by **one launcher** (the
  one named in ``--rdzv-endpoint``): the job's shared state dies with it.
* :class:`EtcdJobStore` over python-etcd (``--rdzv-backend=etcd-v2``), with
  etcd's own atomic operations (``prevExist`` / ``prevValue`` / ``prevIndex``
  writes). The state lives in the etcd cluster and survives the loss of any node.
* :class:`EtcdV3JobStore` on etcd's v3 API (``--rdzv-backend=etcd-v3``, see
  :mod:`ft_core.launcher.rendezvous.etcd_v3`): transactions comparing a key's value, creation or mod
  revision; every key is attached to the job's lease.

:func:`open_job_store` picks the implementation from the rendezvous handler,
so the job store always lives wherever torch's rendezvous state lives.
"""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional, Protocol, TypeVar

import torch.distributed as dist

from ft_core.utils.deadline import wait_until

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousHandler

    from ft_core.launcher.rendezvous.etcd_v3 import EtcdV3Client, JobLease

__all__ = [
    "C10dJobStore",
    "EtcdJobStore",
    "EtcdV3JobStore",
    "JobStore",
    "JobStoreUnavailable",
    "job_store_on",
    "open_job_store",
]

log = logging.getLogger("ft_core.launcher")

T = TypeVar("T")

#: Key namespace of the job-wide state, next to torch's own (``torch.rendezvous.*`` in c10d,
#: ``/torch/elastic/*`` in etcd).
NAMESPACE = "ft_launcher"

#: How long an etcd operation is retried while no member answers (a member restarting, a
#: leader election) before the launcher gives up on the job store.
ETCD_UNAVAILABLE_TIMEOUT = 60.0


class JobStoreUnavailable(RuntimeError):
    """The job store did not answer within its retry window."""


class JobStore(Protocol):
    """A key-value store shared by every launcher of one job; every operation is atomic.

    Values are non-empty strings. ``get`` never blocks waiting for a key.
    """

    #: True when the store does not live inside any launcher (losing a node loses no state).
    survives_node_loss: bool

    def get(self, key: str) -> Optional[str]:
        """The value of ``key``, or None when it was never set."""
        ...

    def set(self, key: str, value: str) -> None:
        """Write ``value`` unconditionally."""
        ...

    def compare_set(self, key: str, expected: Optional[str], desired: str) -> Optional[str]:
        """Write ``desired`` if ``key`` holds ``expected`` (None: if ``key`` is absent); ``expected != desired``.

        Returns the value in force afterwards: ``desired`` when this call (or an
        identical one) won, else the value another launcher wrote (None if absent).
        """
        ...

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer in ``key`` (absent counts as 0); returns the new value."""
        ...

    @property
    def wakes(self) -> bool:
        """True when :meth:`wait` blocks until a key is set (False: it returns False at once; poll instead)."""
        ...

    def wait(self, key: str, timeout: float) -> bool:
        """Block until ``key`` is set (True), for at most ``timeout`` seconds (False; False on any failure).

        Safe from another thread than the other operations; a wait ends only when the key is set or the
        timeout passes (set the key to end it early).
        """
        ...


class C10dJobStore:
    """:class:`JobStore` on a ``torch.distributed.Store`` (``TCPStore``, ``HashStore``, ``PrefixStore``)."""

    survives_node_loss = False

    def __init__(self, store: dist.Store, connect: Optional[Callable[[], dist.Store]] = None) -> None:
        self._store = store
        #: Opens another connection to the same keys, for a wait that must not hold up the other operations
        #: (None: no waits).
        self._connect = connect

    @property
    def wakes(self) -> bool:
        return self._connect is not None

    def wait(self, key: str, timeout: float) -> bool:
        if self._connect is None:
            return False
        try:
            self._connect().wait([key], datetime.timedelta(seconds=timeout))
        except RuntimeError:  # torch's DistStoreError: the timeout, or the store is gone
            return False
        return True

    def get(self, key: str) -> Optional[str]:
        # check() first: a c10d get() of a missing key blocks for the store's timeout. Keys are
        # never deleted, so nothing can disappear between the two calls.
        if not self._store.check([key]):
            return None
        return self._store.get(key).decode()

    def set(self, key: str, value: str) -> None:
        self._store.set(key, value)

    def compare_set(self, key: str, expected: Optional[str], desired: str) -> Optional[str]:
        # c10d's compare_set treats an empty expected value as "the key is absent"; when the key is
        # absent and `expected` is not empty, it returns `expected` without writing (a present key
        # holding `expected` would have been replaced, so that answer can only mean "absent").
        current = self._store.compare_set(key, expected or "", desired).decode()
        return None if expected and current == expected != desired else current

    def add(self, key: str, amount: int) -> int:
        return int(self._store.add(key, amount))


class EtcdJobStore:
    """:class:`JobStore` on an etcd cluster (v2 API, python-etcd client).

    Keys live under ``prefix`` (``/ft_launcher/<run id>``). Compare-and-set is
    an etcd conditional write, ``add`` a compare-and-set loop on the key's
    modification index. An operation that finds no member answering (a member
    down, a leader election) is retried for up to ``unavailable_timeout``
    seconds on the other members the client knows, then raises
    :class:`JobStoreUnavailable`. A conditional write retried after a lost
    reply is checked against the value in force, so it is never applied twice
    by mistake; an ``add`` retried that way may count twice (used only for
    counters where that is harmless: cycle numbers may skip one).
    """

    survives_node_loss = True

    def __init__(self, client: Any, prefix: str, unavailable_timeout: float = ETCD_UNAVAILABLE_TIMEOUT) -> None:
        import etcd  # python-etcd: the `etcd` extra (untyped: see [tool.mypy] overrides)

        self._etcd = etcd
        self._client = client
        self._prefix = prefix.rstrip("/")
        self._unavailable_timeout = unavailable_timeout

    def _path(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    def _call(self, operation: Callable[[], T]) -> T:
        """Run ``operation``, retrying while etcd is unreachable or electing a leader."""
        etcd = self._etcd
        failure: list[BaseException] = []
        warned: list[bool] = []

        def attempt() -> Optional[tuple[T]]:
            try:
                return (operation(),)
            except (etcd.EtcdConnectionFailed, etcd.EtcdLeaderElectionInProgress) as exc:
                failure[:] = [exc]
            except etcd.EtcdException as exc:
                if type(exc) is not etcd.EtcdException:  # key, value and permission errors are answers
                    raise
                failure[:] = [exc]  # an internal server error (e.g. raft) without a specific type
            if not warned:
                warned.append(True)
                log.warning("etcd job store: %s; retrying for up to %g s", failure[0], self._unavailable_timeout)
            return None

        result = wait_until(attempt, self._unavailable_timeout, interval=0.2)
        if result is None:
            raise JobStoreUnavailable(f"etcd did not answer for {self._unavailable_timeout:g} s "
                                      f"(last error: {failure[0] if failure else 'none'})")
        return result[0]

    def get(self, key: str) -> Optional[str]:
        def read() -> Optional[str]:
            try:
                return str(self._client.read(self._path(key)).value)
            except self._etcd.EtcdKeyNotFound:
                return None

        return self._call(read)

    def set(self, key: str, value: str) -> None:
        self._call(lambda: self._client.write(self._path(key), value))

    def compare_set(self, key: str, expected: Optional[str], desired: str) -> Optional[str]:
        condition = {"prevExist": False} if expected is None else {"prevValue": expected}

        def write() -> Optional[str]:
            try:
                self._client.write(self._path(key), desired, **condition)
                return desired
            except (self._etcd.EtcdAlreadyExist, self._etcd.EtcdCompareFailed, self._etcd.EtcdKeyNotFound):
                return None  # lost: read what is in force

        won = self._call(write)
        return won if won is not None else self.get(key)

    def add(self, key: str, amount: int) -> int:
        path = self._path(key)

        def try_add() -> Optional[int]:
            try:
                node = self._client.read(path)
            except self._etcd.EtcdKeyNotFound:
                try:
                    self._client.write(path, str(amount), prevExist=False)
                    return amount
                except self._etcd.EtcdAlreadyExist:
                    return None
            value = int(node.value) + amount
            try:
                self._client.write(path, str(value), prevIndex=node.modifiedIndex)
                return value
            except self._etcd.EtcdCompareFailed:
                return None

        while True:
            value = self._call(try_add)
            if value is not None:
                return value

    wakes = False  # python-etcd's watch holds a connection per wait and needs an index: the launchers poll

    def wait(self, key: str, timeout: float) -> bool:
        return False


class EtcdV3JobStore:
    """:class:`JobStore` on etcd's v3 API (:class:`~ft_core.launcher.rendezvous.etcd_v3.EtcdV3Client`).

    Keys live under ``prefix``, attached to the job's lease (they expire once no
    launcher of the job is left). Compare-and-set is a transaction comparing the
    value (or, for "absent", the creation revision); ``add`` compares the mod
    revision it read. The client retries on the other members while none
    answers, then raises :class:`JobStoreUnavailable`; as with
    :class:`EtcdJobStore`, a conditional write whose reply was lost is checked
    against the value in force, and an ``add`` retried that way may count twice.
    """

    survives_node_loss = True

    def __init__(self, client: EtcdV3Client, prefix: str, lease: JobLease) -> None:
        self._client = client
        self._prefix = prefix.rstrip("/")
        self._lease = lease

    def _path(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    def get(self, key: str) -> Optional[str]:
        found = self._client.get(self._path(key))
        return None if found is None else found[0].decode()

    def set(self, key: str, value: str) -> None:
        self._client.put(self._path(key), value.encode(), self._lease.id)

    def compare_set(self, key: str, expected: Optional[str], desired: str) -> Optional[str]:
        _, current = self._client.put_if(self._path(key), desired.encode(), self._lease.id,
                                         expected=None if expected is None else expected.encode())
        return None if current is None else current[0].decode()

    def add(self, key: str, amount: int) -> int:
        return self._client.add(self._path(key), amount, self._lease.id)

    wakes = True

    def wait(self, key: str, timeout: float) -> bool:
        try:
            return self._client.wait_for(self._path(key), timeout) is not None
        except Exception as exc:  # noqa: BLE001 - a wake-up only: the caller polls as before
            log.debug("job store wait for %s failed: %s", key, exc)
            return False


def job_store_on(store: dist.Store, run_id: str) -> JobStore:
    """The job store on a rendezvous store: etcd's own operations for torch's ``EtcdStore`` and for etcd-v3."""
    # An etcd store's module is imported by the backend that made it: if it is not, the store is no etcd
    # store, and the launch of a c10d job does not import python-etcd (80 ms before its first workers).
    etcd_v3 = sys.modules.get("ft_core.launcher.rendezvous.etcd_v3")
    if etcd_v3 is not None and isinstance(store, etcd_v3.EtcdV3Store):
        return EtcdV3JobStore(store.client, f"{etcd_v3.job_prefix(run_id)}/job", store.lease)
    etcd_v2 = sys.modules.get("torch.distributed.elastic.rendezvous.etcd_store")
    if etcd_v2 is not None and isinstance(store, etcd_v2.EtcdStore):
        # The same client (and thus the same endpoint, TLS settings and member list) as torch's.
        return EtcdJobStore(store.client, f"/{NAMESPACE}/{run_id}")
    prefix = f"{NAMESPACE}/{run_id}"
    tcp: Any = store  # TCPStore.clone (a checked seam) is missing from torch's type stubs

    def connect() -> dist.Store:  # a TCPStore's wait blocks its connection: a wait gets a connection of its own
        return dist.PrefixStore(prefix, tcp.clone())

    return C10dJobStore(dist.PrefixStore(prefix, store), connect if isinstance(store, dist.TCPStore) else None)


def open_job_store(handler: RendezvousHandler) -> Optional[JobStore]:
    """The job store of a rendezvous handler, or None until its first round (static backend).

    Torch's dynamic rendezvous (c10d, etcd-v2, etcd-v3) keeps one store for all rounds in
    the handler; the static backend has one only once it rendezvoused.
    """
    base = getattr(handler, "_store", None)
    return job_store_on(base, handler.get_run_id()) if isinstance(base, dist.Store) else None
