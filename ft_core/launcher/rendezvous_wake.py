"""Torch's dynamic rendezvous woken by the change it waits for, instead of its one-second poll.

A node of torch's dynamic rendezvous (c10d, etcd-v2, etcd-v3) that waits for
the other nodes sleeps one second between two reads of the shared state
(``_DistributedRendezvousOpExecutor.run``: ``_delay(seconds=1)`` on a
``SYNC``). A restart of N nodes waits twice: for the last node to leave the
old round (the next round opens) and for the last one to join it (the round
completes), so every restart paid one to two seconds whatever the backend.

This module keeps torch's rendezvous, its rounds and its rules, and replaces
only that sleep with a wait that ends when the state reaches its next
*phase*. The phase of a state is ``2 x round + complete``: it grows by one
each time a round completes and each time the next round opens, and never
goes back. Every node that writes a state of a later phase than the one it
had read (its write won the compare-and-set) sets one notification key per
phase crossed; a waiting node, holding a state of phase ``p``, blocks on the
key of phase ``p + 1`` for at most the one second torch would have slept,
then reads the state afresh as torch would. So:

* a restart whose nodes all come back (a rank crashed or hung) completes as
  soon as the last node joins: its waits are woken, none times out;
* a membership change (a node lost, a spare taking its place, scale-up) is
  torch's round, unchanged: a spare in the redundancy list or a node waiting
  for the last-call deadline waits on no phase change, and wakes after the
  same second as before;
* nothing new can deadlock: a missed notification (a node without this
  module, a lost connection) costs at most the old poll.

Backends: c10d (a key in the rendezvous TCPStore, waited on through a
second connection, ``TCPStore.clone()``: the waiting connection never holds
up the job store's) and etcd-v3 (a key beside the state, watched from the
revision after the state read). etcd-v2 keeps torch's poll. ``--rdzv-conf
wake_on_change=0`` keeps it on any backend.

Each rendezvous of the launcher logs one line, which ``benchmarks/scale.py`` reads::

    rendezvous round 2 (c10d): 2 of 2 waits woken, 0 timed out, 0 missed a change; 5 state reads,
    4 writes (1 refused), 2 notifications; 7342 bytes

"missed a change": a wait that timed out although the state had reached its next
phase (the read after it found a later one), i.e. the wake-up did not come.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any, Optional, Protocol, Union

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousBackend,
    RendezvousSettings,
    Token,
    _BackendRendezvousStateHolder,
)

from ft_core.launcher.job_store import NAMESPACE

__all__ = ["WAKE_CONF_KEY", "RendezvousCounts", "WakingStateHolder", "install_wake_on_change", "logged_rounds",
           "woken_on_change"]

log = logging.getLogger("ft_core.launcher")

#: Seconds a c10d phase wait blocks in its thread before it is given up (and started again when needed).
BACKGROUND_WAIT = 600.0

#: ``--rdzv-conf`` key turning the wake-up off (``0``/``false``): torch's one-second poll everywhere.
WAKE_CONF_KEY = "wake_on_change"


def phase(state: Any) -> int:
    """``2 x round + complete`` of torch's ``_RendezvousState``: grows by one per completed or opened round."""
    return 2 * int(state.round) + int(bool(state.complete))


@dataclasses.dataclass
class RendezvousCounts:
    """What this node's rendezvous did with the backend (cumulative; subtract two snapshots for one round)."""

    reads: int = 0
    writes: int = 0
    refused_writes: int = 0
    notifications: int = 0
    waits: int = 0
    woken: int = 0
    #: Waits that timed out although the state had moved on (the read after them found a later phase).
    missed: int = 0
    bytes: int = 0

    def since(self, before: RendezvousCounts) -> RendezvousCounts:
        return RendezvousCounts(**{field.name: getattr(self, field.name) - getattr(before, field.name)
                                   for field in dataclasses.fields(self)})

    def copy(self) -> RendezvousCounts:
        return dataclasses.replace(self)


class PhaseKeys(Protocol):
    """The notification keys of one backend: set one per phase reached, wait for one."""

    def notify(self, phase: int) -> int:
        """Set the key of ``phase``; the bytes sent."""

    def wait(self, phase: int, timeout: float, token: Optional[Token]) -> tuple[bool, int]:
        """Block until the key of ``phase`` exists (True) or ``timeout`` seconds passed or it failed (False).

        ``token`` is the state holder's fencing token of the state read (etcd-v3: its mod revision).
        Also returns how many keys the wait wrote.
        """


class C10dPhaseKeys:
    """Phase keys in the c10d rendezvous' TCPStore.

    A TCPStore wait that times out logs two C++ warnings, every second for a
    spare waiting hours. So each phase is waited for once, by a thread
    blocked on its own connection (``TCPStore.clone()``, never the job
    store's) for up to :data:`BACKGROUND_WAIT`; the rendezvous waits on that
    thread with torch's one second, and a later wait for the same phase joins
    it. A wait for a phase that the state has since passed (its key not set:
    a writer without the wake-up crossed it) is ended by setting its key.
    """

    def __init__(self, store: Any, run_id: str) -> None:
        self._store = store
        self._prefix = f"{NAMESPACE}/{run_id}/rdzv_phase/"
        self._lock = threading.Lock()
        self._waits: dict[int, threading.Event] = {}  # phase -> set once its key exists
        self._idle: list[Any] = []  # connections whose wait ended with the key

    def notify(self, phase: int) -> int:
        key = f"{self._prefix}{phase}"
        self._store.set(key, b"")
        return len(key)

    def wait(self, phase: int, timeout: float, token: Optional[Token]) -> tuple[bool, int]:
        with self._lock:
            passed = [earlier for earlier, found in self._waits.items() if earlier < phase and not found.is_set()]
            found = self._waits.get(phase)
            if found is None:
                found = self._waits[phase] = threading.Event()
                threading.Thread(target=self._block, args=(phase, found), name="ft-rendezvous-wake",
                                 daemon=True).start()
        for earlier in passed:
            self.notify(earlier)
        return found.wait(timeout), len(passed)

    def _block(self, phase: int, found: threading.Event) -> None:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        try:
            connection = connection or self._store.clone()
            connection.wait([f"{self._prefix}{phase}"], datetime.timedelta(seconds=BACKGROUND_WAIT))
        except RuntimeError:  # torch's DistStoreError: the long timeout, or the store is gone (reads will say)
            with self._lock:
                self._waits.pop(phase, None)  # a later wait for this phase starts anew
            return
        found.set()
        with self._lock:
            self._idle.append(connection)
            for earlier in [earlier for earlier in self._waits if earlier < phase - 2]:
                del self._waits[earlier]  # long reached: nobody waits for them again


class EtcdV3PhaseKeys:
    """Phase keys beside the etcd-v3 rendezvous state, on the job's lease; a wait is one watch."""

    def __init__(self, backend: Any) -> None:
        self._client = backend.client
        self._lease = backend.lease
        self._prefix = backend.key + "_phase/"

    def notify(self, phase: int) -> int:
        key = f"{self._prefix}{phase}"
        self._client.put(key, b"", self._lease.id)
        return len(key)

    def wait(self, phase: int, timeout: float, token: Optional[Token]) -> tuple[bool, int]:
        from etcd3gw.exceptions import WatchTimedOut

        # From the revision after the state read: a key set since (by the write that moved the phase on) is in
        # etcd's history and answers at once; one set before that read would be a phase the read already saw.
        start = int(token) + 1 if isinstance(token, int) else None

        def watch(client: Any) -> bool:
            try:
                client.watch_once(f"{self._prefix}{phase}", timeout, start_revision=start)
            except WatchTimedOut:
                return False
            return True

        try:
            return bool(self._client.call(watch, f"watch key {self._prefix}{phase}")), 0
        except Exception as exc:  # noqa: BLE001 - any failure: the caller sleeps the rest, as torch would
            log.debug("rendezvous wake-up watch failed: %s", exc)
            return False, 0


class _CountingBackend(RendezvousBackend):
    """The handler's backend, counting state reads and writes and their bytes into ``counts``."""

    def __init__(self, backend: RendezvousBackend, counts: RendezvousCounts) -> None:
        self.inner = backend
        self._counts = counts

    @property
    def name(self) -> str:
        return self.inner.name

    def get_state(self) -> Optional[tuple[bytes, Token]]:
        result = self.inner.get_state()
        self._counts.reads += 1
        self._counts.bytes += len(result[0]) if result is not None else 0
        return result

    def set_state(self, state: bytes, token: Optional[Token] = None) -> Optional[tuple[bytes, Token, bool]]:
        result = self.inner.set_state(state, token)
        self._counts.writes += 1
        self._counts.bytes += len(state) + (len(result[0]) if result is not None and not result[2] else 0)
        self._counts.refused_writes += 0 if result is not None and result[2] else 1
        return result


class WakingStateHolder(_BackendRendezvousStateHolder):
    """Torch's state holder that notifies the phases its writes reach and waits for the next one."""

    def __init__(self, backend: RendezvousBackend, settings: RendezvousSettings, keys: PhaseKeys,
                 cache_duration: int = 1) -> None:
        self.counts = RendezvousCounts()
        super().__init__(_CountingBackend(backend, self.counts), settings, cache_duration)
        self._keys = keys
        #: The phase of the state last read from or written to the backend (before torch's local clean-up).
        self._stored_phase = -1
        #: The phase a wait timed out at, until the next read tells whether it missed a change.
        self._polled_at: Optional[int] = None

    def sync(self) -> Optional[bool]:
        written = phase(self._state) if self._dirty else None
        read = self._stored_phase
        has_set = super().sync()
        if has_set and written is not None:
            # The write replaced exactly the state read (compare-and-set): it crossed phases read+1 .. written.
            for reached in range(read + 1, written + 1):
                self.counts.bytes += self._keys.notify(reached)
                self.counts.notifications += 1
        return has_set

    def _sanitize(self) -> None:
        self._stored_phase = phase(self._state)  # before torch drops dead nodes locally (not written yet)
        if self._polled_at is not None:
            self.counts.missed += self._stored_phase > self._polled_at
            self._polled_at = None
        super()._sanitize()

    def wait_for_change(self, timeout: float) -> None:
        """Instead of torch's poll sleep: return when the state's next phase is notified, at most ``timeout``."""
        started = time.monotonic()
        self.counts.waits += 1
        woken, writes = self._keys.wait(self._stored_phase + 1, timeout, self._token)
        self.counts.notifications += writes
        if woken:
            self.counts.woken += 1
        else:
            self._polled_at = self._stored_phase
            time.sleep(max(0.0, timeout - (time.monotonic() - started)))  # a failed wait still paces the polls
        self._last_sync_time = -1  # the next sync reads the backend, not the state cached a moment ago


def _phase_keys(handler: Any) -> Optional[PhaseKeys]:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from ft_core.launcher.etcd_v3 import EtcdV3RendezvousBackend

    backend = handler._state_holder._backend
    if isinstance(backend, C10dRendezvousBackend):
        return C10dPhaseKeys(backend._store, handler.get_run_id())
    if isinstance(backend, EtcdV3RendezvousBackend):
        return EtcdV3PhaseKeys(backend)
    return None


def install_wake_on_change(handler: Any, rdzv_configs: dict[str, Any]) -> bool:
    """Give a dynamic rendezvous handler (c10d, etcd-v3) a :class:`WakingStateHolder`; whether it got one.

    Called once, before the first rendezvous; ``--rdzv-conf wake_on_change=0`` declines.
    """
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from ft_core.utils.validation import boolean

    if not boolean(f"--rdzv-conf {WAKE_CONF_KEY}", rdzv_configs.get(WAKE_CONF_KEY, True), coerce=True):
        return False
    if not isinstance(handler, DynamicRendezvousHandler):
        return False
    keys = _phase_keys(handler)
    if keys is None:
        return False
    old: Any = handler._state_holder  # torch's _BackendRendezvousStateHolder (its backend is checked above)
    holder = WakingStateHolder(old._backend, old._settings, keys, old._cache_duration)
    handler._state_holder = holder
    executor: Any = handler._op_executor
    executor._state_holder = holder
    return True


@contextlib.contextmanager
def woken_on_change(handler: Any) -> Iterator[None]:
    """Within this block (one rendezvous), torch's poll sleeps wait for the next phase; logs the round's counts.

    A handler without a :class:`WakingStateHolder` (other backends, ``wake_on_change=0``) keeps torch's sleep.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    holder = getattr(handler, "_state_holder", None)
    original = dynamic_rendezvous._delay
    if not isinstance(holder, WakingStateHolder):
        yield
        return

    def delay(seconds: Union[float, tuple[float, float]], *args: Any, **kwargs: Any) -> None:
        if isinstance(seconds, tuple):  # a random skew (see .rendezvous_skew): not a wait for other nodes
            original(seconds, *args, **kwargs)
            return
        holder.wait_for_change(float(seconds))

    before = holder.counts.copy()
    dynamic_rendezvous._delay = delay
    try:
        yield
    finally:
        dynamic_rendezvous._delay = original
    done = holder.counts.since(before)
    log.info(_LINE, holder.state.round, handler.get_backend(), done.woken, done.waits, done.waits - done.woken,
             done.missed, done.reads, done.writes, done.refused_writes, done.notifications, done.bytes)


_LINE = ("rendezvous round %d (%s): %d of %d waits woken, %d timed out, %d missed a change; %d state reads, "
         "%d writes (%d refused), %d notifications; %d bytes")
_LINE_PATTERN = re.compile(re.escape(_LINE).replace("%d", r"(\d+)").replace("%s", r"([\w-]+)"))


def logged_rounds(text: str) -> list[tuple[int, RendezvousCounts]]:
    """The (round, counts) of every rendezvous line in a launcher's output, in order (benchmarks, tests)."""
    found = []
    for match in _LINE_PATTERN.finditer(text):
        round_, _, woken, waits, _, missed, reads, writes, refused, notifications, size = match.groups()
        found.append((int(round_), RendezvousCounts(
            reads=int(reads), writes=int(writes), refused_writes=int(refused), notifications=int(notifications),
            waits=int(waits), woken=int(woken), missed=int(missed), bytes=int(size))))
    return found
