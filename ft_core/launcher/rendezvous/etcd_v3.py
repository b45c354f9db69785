"""``--rdzv-backend=etcd-v3``: torch's dynamic rendezvous, the rendezvous store and the job store on etcd v3.

Torch's own etcd backends (``etcd``, ``etcd-v2``) speak etcd's v2 API, which
etcd 3.5 serves only with ``--enable-v2`` and 3.6 no longer serves at all.
This backend keeps torch's :class:`DynamicRendezvousHandler` (the same
rendezvous logic as ``c10d`` and ``etcd-v2``) and moves its state to the v3
API through `etcd3gw <https://opendev.org/openstack/etcd3gw>`_, a maintained
pure-Python client of etcd's v3 JSON gateway (etcd >= 3.4):

* :class:`EtcdV3Client`: every endpoint of ``--rdzv-endpoint=h1:2379,h2:2379``
  (any members of one cluster); a request that finds its member down, or the
  cluster electing a leader, moves to the next member and is retried for up to
  ``unavailable_timeout`` seconds, then fails with an error naming etcd and the
  endpoints. TLS and user/password authentication come from ``--rdzv-conf``
  (:class:`EtcdV3Settings`).
* :class:`JobLease`: every key of the job is attached to one lease that every
  launcher of the job keeps alive. A node's death takes nothing with it; once
  no launcher is left, the job's keys expire by themselves ``lease_ttl``
  seconds later (torch's ``etcd-v2`` gives its state a two-hour TTL instead).
* :class:`EtcdV3RendezvousBackend`: the rendezvous state is one key;
  ``set_state`` is a transaction that compares the key's mod revision (the
  fencing token ``get_state`` returned) and answers with the state in force.
* :class:`EtcdV3Store`: the rendezvous store, the ``torch.distributed.Store`` the rendezvous
  hands out (per-round keys, the address of the cycle's workers' store).

The job store (:class:`~ft_core.launcher.rendezvous.job_store.EtcdV3JobStore`) uses the
same client and lease. Key layout under ``/ft_launcher/<run id>/``: ``lease``
(the lease id), ``rdzv`` (torch's state), ``store/<key>`` and ``job/<key>``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional, TypeVar, Union

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameters,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token, create_handler

from ft_core.launcher.rendezvous.job_store import NAMESPACE, JobStoreUnavailable
from ft_core.utils.validation import ValidationError, int_in_range, one_of, positive_seconds

if TYPE_CHECKING:
    from etcd3gw.client import Etcd3Client
    from torch.distributed.elastic.rendezvous import RendezvousHandler

__all__ = [
    "BACKEND_NAME",
    "EtcdError",
    "EtcdV3Client",
    "EtcdV3RendezvousBackend",
    "EtcdV3Settings",
    "EtcdV3Store",
    "JobLease",
    "create_etcd_v3_handler",
    "job_prefix",
    "parse_endpoints",
    "register",
]

log = logging.getLogger("ft_core.launcher")

T = TypeVar("T")

BACKEND_NAME = "etcd-v3"
DEFAULT_PORT = 2379
#: etcd's gateway path since 3.4 (3.3 used /v3beta): fixed, so no discovery request is needed.
API_PATH = "/v3/"

#: Seconds before looking again: for a key whose watch broke, for the job's lease that just expired.
_POLL_INTERVAL = 0.05


class EtcdError(RuntimeError):
    """etcd answered, and refused (authentication, permission, a lease that expired)."""


@dataclasses.dataclass(frozen=True)
class EtcdV3Settings:
    """How to reach the etcd cluster: ``--rdzv-endpoint`` and the ``--rdzv-conf`` keys below.

    ============================  ====================================================
    ``--rdzv-conf`` key           meaning
    ============================  ====================================================
    ``protocol``                  ``http`` or ``https`` (default ``https`` when
                                  ``ca_cert`` or ``ssl_cert`` is given, else ``http``)
    ``ca_cert``                   CA certificate that signed the members' certificates
    ``ssl_cert``/``ssl_cert_key`` client certificate and its key (etcd's
                                  ``--client-cert-auth``)
    ``user``/``password``         etcd user (etcd's ``auth enable``); or
    ``password_file``             a file holding the password (not on the command line)
    ``read_timeout``              seconds one request may take (default 10)
    ``unavailable_timeout``       seconds to retry while no member answers (default 60)
    ``lease_ttl``                 seconds the job's keys outlive its last launcher
                                  (default 60)
    ============================  ====================================================
    """

    endpoints: tuple[tuple[str, int], ...]
    protocol: str = "http"
    ca_cert: Optional[str] = None
    ssl_cert: Optional[str] = None
    ssl_cert_key: Optional[str] = None
    user: Optional[str] = None
    password: Optional[str] = dataclasses.field(default=None, repr=False)
    read_timeout: float = 10.0
    unavailable_timeout: float = 60.0
    lease_ttl: int = 60

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> EtcdV3Settings:
        """Validate ``--rdzv-endpoint`` and the ``--rdzv-conf`` keys (errors name the key, value and what is allowed)."""
        endpoints = parse_endpoints(params.endpoint)
        ca_cert, ssl_cert, ssl_cert_key = (params.get(key) for key in ("ca_cert", "ssl_cert", "ssl_cert_key"))
        if bool(ssl_cert) != bool(ssl_cert_key):
            raise ValidationError("--rdzv-conf ssl_cert/ssl_cert_key", (ssl_cert, ssl_cert_key), "both or neither")
        tls = bool(ca_cert or ssl_cert)
        protocol = one_of("--rdzv-conf protocol", str(params.get("protocol", "https" if tls else "http")).lower(),
                          ("http", "https"))
        if tls and protocol != "https":
            raise ValidationError("--rdzv-conf protocol", protocol, "https (ca_cert/ssl_cert are given)")
        user, password, password_file = params.get("user"), params.get("password"), params.get("password_file")
        if password_file:
            if password:
                raise ValidationError("--rdzv-conf password_file", password_file, "password or password_file, not both")
            try:
                with open(password_file) as handle:
                    password = handle.read().rstrip("\n")
            except OSError as exc:
                raise ValidationError("--rdzv-conf password_file", password_file, "a readable file",
                                      problem=f"cannot read {password_file!r}: {exc.strerror}") from None
        if bool(user) != bool(password):
            raise ValidationError("--rdzv-conf user/password", user, "both user and password (or password_file), "
                                  "or neither")
        defaults = cls(endpoints)
        return cls(
            endpoints=endpoints, protocol=protocol, ca_cert=ca_cert or None, ssl_cert=ssl_cert or None,
            ssl_cert_key=ssl_cert_key or None, user=user or None, password=password or None,
            read_timeout=positive_seconds("--rdzv-conf read_timeout", params.get("read_timeout", defaults.read_timeout),
                                          coerce=True),
            unavailable_timeout=positive_seconds("--rdzv-conf unavailable_timeout",
                                                 params.get("unavailable_timeout", defaults.unavailable_timeout),
                                                 coerce=True),
            lease_ttl=int_in_range("--rdzv-conf lease_ttl", params.get("lease_ttl", defaults.lease_ttl), 2,
                                   coerce=True))

    @property
    def endpoint_list(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.endpoints)


def parse_endpoints(value: Optional[str]) -> tuple[tuple[str, int], ...]:
    """``host1:2379,host2:2379`` (port 2379 when omitted) as (host, port) pairs (torch's endpoint syntax each)."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    allowed = "comma-separated host:port of etcd members, e.g. 'etcd1:2379,etcd2:2379'"
    endpoints = []
    for item in (value or "").split(","):
        if item.strip():
            try:
                endpoints.append(parse_rendezvous_endpoint(item.strip(), DEFAULT_PORT))
            except ValueError as exc:
                raise ValidationError("--rdzv-endpoint", value, allowed, problem=f"{item.strip()!r}: {exc}") from None
    if not endpoints:
        raise ValidationError("--rdzv-endpoint", value, allowed, problem="no etcd endpoint given")
    return tuple(endpoints)


class EtcdV3Client:
    """etcd3gw clients of every endpoint, used one at a time; see the module docstring.

    :meth:`call` runs one request on the current member; when that member does
    not answer (connection refused, timeout, "no leader", a leader change) it
    moves on to the next one, and after ``unavailable_timeout`` seconds without
    an answer raises :class:`~ft_core.launcher.rendezvous.job_store.JobStoreUnavailable`
    (no request is held past that window). An authentication token that expired
    is renewed once and the request repeated; any other refusal (and a failed
    TLS handshake) raises :class:`EtcdError` at once.
    """

    def __init__(self, settings: EtcdV3Settings) -> None:
        from etcd3gw.client import Etcd3Client

        self.settings = settings
        self._clients = [Etcd3Client(host=host, port=port, protocol=settings.protocol, timeout=settings.read_timeout,
                                     api_path=API_PATH, session=_session(settings))
                         for host, port in settings.endpoints]
        self._current = 0
        self._authenticated: set[int] = set()
        self._lock = threading.Lock()  # guards _current and _authenticated (the keep-alive threads call too)

    def call(self, operation: Callable[[Etcd3Client], T], what: str) -> T:
        """``operation`` on a member that answers; ``what`` names it in errors ("read key ...")."""
        from etcd3gw import exceptions

        unavailable = (exceptions.ConnectionFailedError, exceptions.ConnectionTimeoutError,
                       exceptions.InternalServerError)
        deadline = time.monotonic() + self.settings.unavailable_timeout
        failures = 0
        renewed = False
        while True:
            with self._lock:
                index = self._current
            client = self._clients[index]
            # A member without quorum holds a request until its own timeout: never past the retry window.
            client.timeout = max(0.2, min(self.settings.read_timeout, deadline - time.monotonic()))
            try:
                self._ensure_authenticated(index, client)
                return operation(client)
            except unavailable as exc:
                if "SSLError" in _describe(exc):  # etcd3gw reports a failed TLS handshake as a connection failure
                    raise EtcdError(f"TLS with etcd at {client.host}:{client.port} failed (--rdzv-conf ca_cert, "
                                    f"ssl_cert, ssl_cert_key): {_describe(exc)}") from None
                failures += 1
                last = _describe(exc)
                with self._lock:
                    if self._current == index:
                        self._current = (index + 1) % len(self._clients)
                if failures == 1:
                    log.warning("etcd member %s:%d did not answer (%s); retrying on the members of %s for up to %g s",
                                client.host, client.port, last, self.settings.endpoint_list,
                                self.settings.unavailable_timeout)
            except exceptions.Etcd3Exception as exc:
                if self.settings.user is not None and _is_auth_expired(exc) and not renewed:
                    renewed = True  # a token expires after etcd's --auth-token-ttl of disuse, or with its member
                    with self._lock:
                        self._authenticated.discard(index)
                    continue
                raise EtcdError(f"etcd at {client.host}:{client.port} refused to {what}: {_describe(exc)}") from None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JobStoreUnavailable(
                    f"etcd did not answer for {self.settings.unavailable_timeout:g} s: no member of "
                    f"{self.settings.endpoint_list} could {what} (last error: {last}); is a majority of the "
                    "etcd cluster up?")
            if failures % len(self._clients) == 0:  # every member tried: wait before the next round
                time.sleep(min(0.2, remaining))

    def _ensure_authenticated(self, index: int, client: Etcd3Client) -> None:
        """Log in ``client`` with the user and password (etcd's Authenticate call) once per token."""
        if self.settings.user is None or index in self._authenticated:
            return
        from etcd3gw import exceptions

        client.session.headers.pop("Authorization", None)  # etcd checks a token sent along, even a stale one
        try:
            reply = client.post(client.get_url("/auth/authenticate"),
                                json={"name": self.settings.user, "password": self.settings.password})
        except (exceptions.ConnectionFailedError, exceptions.ConnectionTimeoutError, exceptions.InternalServerError):
            raise  # not an answer: call() moves on to the next member
        except exceptions.Etcd3Exception as exc:
            raise EtcdError(f"etcd at {client.host}:{client.port} refused user {self.settings.user!r} "
                            f"(--rdzv-conf user/password): {_describe(exc)}") from None
        client.session.headers["Authorization"] = reply["token"]
        with self._lock:
            self._authenticated.add(index)

    # -- the few v3 operations the backend, the store and the job store need ------------
    def get(self, key: str) -> Optional[tuple[bytes, int]]:
        """The value of ``key`` and its mod revision, or None when absent."""
        found = self.call(lambda c: c.get(key.encode(), metadata=True), f"read key {key!r}")
        if not found:
            return None
        value, meta = found[0]
        return value, int(meta["mod_revision"])

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """Every key under ``prefix`` with its value (one range read)."""
        found = self.call(lambda c: c.get_prefix(prefix.encode()), f"read keys under {prefix!r}")
        return {bytes(meta["key"]).decode(): bytes(value) for value, meta in found}

    def put(self, key: str, value: bytes, lease: int) -> None:
        """Write ``value`` unconditionally, attached to ``lease``."""
        from etcd3gw.lease import Lease

        self.call(lambda c: c.put(key.encode(), value, lease=Lease(lease, c)), f"write key {key!r}")

    def put_if(self, key: str, value: bytes, lease: int, *, mod_revision: Optional[int] = None,
               expected: Optional[bytes] = None) -> tuple[bool, Optional[tuple[bytes, int]]]:
        """One transaction: write ``value`` if ``key`` is as expected, else read it.

        The condition: ``mod_revision`` (the fencing token), else ``expected``
        (the value), else "absent" (create revision 0). Returns whether the
        write happened, and the key's value and mod revision in force afterwards.
        """
        b64_key = _b64(key.encode())
        if mod_revision is not None:
            compare = {"key": b64_key, "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}
        elif expected is not None:
            compare = {"key": b64_key, "target": "VALUE", "result": "EQUAL", "value": _b64(expected)}
        else:
            compare = {"key": b64_key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        txn = {"compare": [compare],
               "success": [{"request_put": {"key": b64_key, "value": _b64(value), "lease": str(lease)}}],
               "failure": [{"request_range": {"key": b64_key}}]}
        reply = self.call(lambda c: c.transaction(txn), f"update key {key!r}")
        if reply.get("succeeded", False):  # the gateway omits false and zero fields
            return True, (value, int(reply["header"]["revision"]))
        responses: Any = reply.get("responses") or [{}]
        kvs = responses[0].get("response_range", {}).get("kvs") or []
        if not kvs:
            return False, None
        return False, (_unb64(kvs[0].get("value", "")), int(kvs[0]["mod_revision"]))

    def add(self, key: str, amount: int, lease: int) -> int:
        """Add ``amount`` to the decimal integer in ``key`` (absent: 0), comparing the mod revision read."""
        while True:
            current = self.get(key)
            value = (int(current[0]) if current is not None else 0) + amount
            won, _ = self.put_if(key, str(value).encode(), lease, mod_revision=current[1] if current else None)
            if won:
                return value

    def wait_for(self, key: str, timeout: float) -> Optional[bytes]:
        """The value of ``key`` once it exists, or None when ``timeout`` seconds pass first (or the watch breaks).

        A watch from the current revision, then a read: a put before the watch is in the read, a put after it
        reaches the watch. Why not one watch from the revision of an earlier read: etcd serves a watch that starts
        in its history ("unsynced") only on its 100 ms catch-up tick, measured 75-100 ms per wait here.
        """
        return self.call(lambda client: _watch_then_get(self, client, key, timeout), f"wait for key {key!r}")

    def grant_lease(self, ttl: int) -> int:
        return self.call(lambda c: c.lease(ttl).id, "grant a lease")

    def keep_alive(self, lease: int) -> int:
        """Refresh ``lease``; its remaining TTL in seconds, or -1 when it has expired."""
        from etcd3gw.lease import Lease

        return self.call(lambda c: Lease(lease, c).refresh(), "keep the job's lease alive")

    def revoke_lease(self, lease: int) -> None:
        from etcd3gw.lease import Lease

        self.call(lambda c: Lease(lease, c).revoke(), "revoke a lease")


class JobLease:
    """The lease every key of one job is attached to, kept alive by every launcher of the job.

    The first launcher grants it and publishes its id under ``key`` (attached to
    itself); the others find it there. A thread refreshes it every third of its
    TTL, so it expires only ``ttl`` seconds after the last launcher stopped.
    """

    def __init__(self, client: EtcdV3Client, key: str, ttl: int) -> None:
        self._client = client
        self._key = key
        self._ttl = ttl
        self._id: Optional[int] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def id(self) -> int:
        """The lease id (found or granted on first use; then kept alive from a thread)."""
        with self._lock:
            if self._id is None:
                self._id = self._acquire()
                self._thread = threading.Thread(target=self._keep_alive, name="ft-etcd-lease", daemon=True)
                self._thread.start()
            return self._id

    def _acquire(self) -> int:
        while True:
            found = self._client.get(self._key)
            if found is not None:
                lease = int(found[0])
                if self._client.keep_alive(lease) > 0:
                    return lease
                time.sleep(_POLL_INTERVAL)  # it just expired: its key goes with it
                continue
            lease = self._client.grant_lease(self._ttl)
            won, _ = self._client.put_if(self._key, str(lease).encode(), lease)
            if won:
                return lease
            self._client.revoke_lease(lease)  # another launcher published first: use its lease

    def _keep_alive(self) -> None:
        while not self._stop.wait(self._ttl / 3):
            assert self._id is not None
            try:
                if self._client.keep_alive(self._id) <= 0:
                    log.error("the job's etcd lease %x expired (no launcher refreshed it for %d s): the job's "
                              "state in etcd is gone", self._id, self._ttl)
                    return
            except Exception as exc:  # noqa: BLE001 - the requests that need etcd report the outage themselves
                log.warning("could not refresh the job's etcd lease: %s", exc)

    def close(self) -> None:
        """Stop refreshing (the lease lives on for its TTL, or as long as other launchers refresh it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class EtcdV3RendezvousBackend(RendezvousBackend):
    """Torch's rendezvous state in one etcd key; ``set_state`` compares the key's mod revision."""

    def __init__(self, client: EtcdV3Client, key: str, lease: JobLease) -> None:
        self.client = client
        self.key = key
        self.lease = lease

    @property
    def name(self) -> str:
        return BACKEND_NAME

    def get_state(self) -> Optional[tuple[bytes, Token]]:
        try:
            return self.client.get(self.key)
        except JobStoreUnavailable as exc:
            raise RendezvousConnectionError(str(exc)) from exc

    def set_state(self, state: bytes, token: Optional[Token] = None) -> Optional[tuple[bytes, Token, bool]]:
        try:
            revision = int(token) if token is not None else None
        except (TypeError, ValueError):
            revision = -1  # not a token of ours: the comparison fails and the state in force is returned
        try:
            won, current = self.client.put_if(self.key, state, self.lease.id, mod_revision=revision)
        except JobStoreUnavailable as exc:
            raise RendezvousConnectionError(str(exc)) from exc
        return None if current is None else (current[0], current[1], won)


class EtcdV3Store(dist.Store):
    """The rendezvous store: a ``torch.distributed.Store`` in etcd keys under ``prefix``, attached to the job's lease.

    ``get`` and ``wait`` poll until the key exists or the store's timeout passes
    (then ``LookupError``, as torch's ``EtcdStore``).
    """

    def __init__(self, client: EtcdV3Client, prefix: str, lease: JobLease,
                 timeout: Optional[datetime.timedelta] = None) -> None:
        super().__init__()  # the pybind trampoline needs it
        self.client = client
        self.prefix = prefix.rstrip("/") + "/"
        self.lease = lease
        if timeout is not None:
            self.set_timeout(timeout)

    def _key(self, key: str) -> str:
        return self.prefix + key

    def set(self, key: str, value: Union[str, bytes]) -> None:
        self.client.put(self._key(key), _bytes(value), self.lease.id)

    def get(self, key: str) -> bytes:
        return self._wait_get([key], None)[0]

    def check(self, keys: list[str]) -> bool:
        return all(self.client.get(self._key(key)) is not None for key in keys)

    def wait(self, keys: list[str], timeout: Optional[datetime.timedelta] = None) -> None:
        self._wait_get(keys, timeout)

    def add(self, key: str, amount: int) -> int:
        return self.client.add(self._key(key), amount, self.lease.id)

    def compare_set(self, key: str, expected: Union[str, bytes], desired: Union[str, bytes]) -> bytes:
        # c10d's semantics: an empty `expected` means "absent"; the answer is the value in force,
        # or `expected` itself when the key is absent and was expected present.
        wanted, old = _bytes(desired), _bytes(expected)
        won, current = self.client.put_if(self._key(key), wanted, self.lease.id, expected=old or None)
        if won:
            return wanted
        return current[0] if current is not None else old

    def _wait_get(self, keys: Sequence[str], timeout: Optional[datetime.timedelta]) -> list[bytes]:
        limit = (timeout or self.timeout).total_seconds()  # type: ignore[attr-defined]  # a pybind property
        deadline = time.monotonic() + limit
        values: list[bytes] = []
        for key in keys:
            read = self.client.get(self._key(key))  # present (the common case): one read, no watch
            found = read[0] if read is not None else None
            while found is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LookupError(f"key {key!r} not in the etcd store after {limit:g} s")
                found = self.client.wait_for(self._key(key), remaining)
                if found is None:  # timed out, or the watch broke: never a busy loop of watches
                    time.sleep(min(_POLL_INTERVAL, max(0.0, deadline - time.monotonic())))
            values.append(found)
        return values


def _watch_then_get(owner: EtcdV3Client, client: Etcd3Client, key: str, timeout: float) -> Optional[bytes]:
    """:meth:`EtcdV3Client.wait_for` on one member (its connection errors are etcd3gw's, so ``call`` moves on)."""
    import requests
    from etcd3gw import exceptions

    create = {"create_request": {"key": _b64(key.encode()), "filters": ["NODELETE"]}}
    try:  # the read timeout bounds each wait for the next message of the stream
        response = client.session.post(client.get_url("/watch"), json=create, stream=True,
                                       timeout=(client.timeout, max(timeout, 0.01)))
    except requests.exceptions.RequestException as exc:
        raise exceptions.ConnectionFailedError(str(exc)) from None
    with response:
        if response.status_code != requests.codes["ok"]:
            raise exceptions.Etcd3Exception(response.text, response.reason)
        buffered = b""
        try:
            for chunk in response.iter_content(chunk_size=None):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")  # the gateway ends each message with a newline
                for line in filter(None, (line.strip() for line in lines)):
                    result = json.loads(line).get("result", {})
                    if result.get("created"):  # registered: from now on a put reaches this stream
                        found = owner.get(key)
                        if found is not None:
                            return found[0]
                    for event in result.get("events") or []:
                        return _unb64(event["kv"].get("value", ""))
        except requests.exceptions.RequestException:  # the read timeout (or the stream broke): not found in time
            return None
    return None


def job_prefix(run_id: str) -> str:
    """Where every key of job ``run_id`` lives."""
    return f"/{NAMESPACE}/{run_id}"


def create_etcd_v3_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's rendezvous handler registry entry for ``etcd-v3`` (see :func:`register`)."""
    if not params.run_id:
        raise ValidationError("--rdzv-id", params.run_id, "a non-empty job id")
    client = EtcdV3Client(EtcdV3Settings.from_params(params))
    prefix = job_prefix(params.run_id)
    lease = JobLease(client, f"{prefix}/lease", client.settings.lease_ttl)
    backend = EtcdV3RendezvousBackend(client, f"{prefix}/rdzv", lease)
    return create_handler(EtcdV3Store(client, f"{prefix}/store", lease), backend, params)


def register() -> None:
    """Make ``--rdzv-backend=etcd-v3`` known to torch's rendezvous registry (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND_NAME, create_etcd_v3_handler)


def _session(settings: EtcdV3Settings) -> Any:
    """A requests session with the TLS settings, one per endpoint (each holds its own auth token).

    The environment is not trusted: requests lets ``REQUESTS_CA_BUNDLE`` override a
    session's CA (requests issue 3829), which would silently replace ``ca_cert``, and
    etcd members are reached directly, never through an ``HTTP(S)_PROXY``. Without
    ``ca_cert`` the CA bundle of the environment still applies, as in requests.
    """
    import requests

    session = requests.Session()
    session.trust_env = False
    session.verify = (settings.ca_cert or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
                      or True)
    if settings.ssl_cert and settings.ssl_cert_key:
        session.cert = (settings.ssl_cert, settings.ssl_cert_key)
    return session


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _bytes(value: Union[str, bytes]) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _describe(exc: BaseException) -> str:
    detail = getattr(exc, "detail_text", None)
    parts = [str(part) for part in (type(exc).__name__, *exc.args, detail) if part]
    return ": ".join(parts)[:500]


def _is_auth_expired(exc: BaseException) -> bool:
    detail = str(getattr(exc, "detail_text", "") or "")
    return "invalid auth token" in detail or "Unauthorized" in exc.args
