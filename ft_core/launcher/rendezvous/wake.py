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
had read (its write won the compare-and-set) tells the nodes waiting for each
phase crossed; a waiting node, holding a state of phase ``p``, waits for phase
``p + 1`` for at most the one second torch would have slept, then reads the
state afresh as torch would. So:

* a restart whose nodes all come back (a rank crashed or hung) completes as
  soon as the last node joins: its waits are woken, none times out;
* a membership change (a node lost, a spare taking its place, scale-up) is
  torch's round, unchanged: a spare in the redundancy list or a node waiting
  for the last-call deadline waits on no phase change, and wakes after the
  same second as before;
* nothing new can deadlock: a missed notification (a node without this
  module, a lost connection) costs at most the old poll.

Backends: c10d (a key per phase and one per waiter in the rendezvous
TCPStore, see :class:`C10dPhaseKeys`) and etcd-v3 (a key per phase beside the
state, watched from the revision after the state read). etcd-v2 keeps torch's
poll. ``--rdzv-conf wake_on_change=0`` keeps it on any backend.

Each rendezvous of the launcher logs one line, which ``benchmarks/scale.py`` reads::

    rendezvous round 2 (c10d): 2 of 2 waits woken, 0 timed out, 0 missed a change; 5 state reads,
    4 writes (1 refused), 9 wake-up operations; 7342 bytes

"missed a change": a wait that timed out although the state had reached its next
phase (the read after it found a later one), i.e. the wake-up did not come.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import logging
import os
import random
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

from ft_core.launcher.rendezvous.job_store import NAMESPACE

__all__ = ["LOG_LINE", "WAKE_CONF_KEY", "RendezvousCounts", "WakingStateHolder", "install_wake_on_change", "logged_rounds",
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
    #: Store operations of the wake-ups: notification and wake-up keys set, waiter lists, etcd watches.
    wake_ops: int = 0
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
    """How one backend tells the nodes waiting for a phase that the state reached it."""

    def notify(self, phase: int) -> tuple[int, int]:
        """Tell the waiters that the state reached ``phase``; the store operations and bytes spent."""

    def wait(self, phase: int, timeout: float, token: Optional[Token]) -> tuple[bool, int]:
        """Block until the key of ``phase`` exists (True) or ``timeout`` seconds passed or it failed (False).

        ``token`` is the state holder's fencing token of the state read (etcd-v3: its mod revision).
        Also returns the store operations spent.
        """

    def cancel(self) -> int:
        """End every wait still blocked (this node's rendezvous is over); the store operations spent."""


class C10dPhaseKeys:
    """Phase keys in the c10d rendezvous' TCPStore, and a wake-up key per waiting node.

    A TCPStore wait that times out logs two C++ warnings (every second, for a
    spare waiting hours), and a wait cannot be cancelled: so each phase is
    waited for once, by a thread blocked on its own connection
    (``TCPStore.clone()``, never the job store's) on a key of its own,
    ``wake/<waiter>``, which the rendezvous thread awaits with torch's one
    second. A waiter appends its name to the phase's list, then looks for the
    phase's key; a node reaching the phase sets the phase's key, then reads the
    list and sets every listed waiter's key: a waiter is either listed before
    that read or sees the key. At the end of its rendezvous a node sets its
    own pending keys, so no thread outlives it (one blocked in a store at exit
    aborts the interpreter).
    """

    def __init__(self, store: Any, run_id: str) -> None:
        self._store = store
        self._prefix = f"{NAMESPACE}/{run_id}/rdzv_phase/"
        self._lock = threading.Lock()
        self._waits: dict[int, tuple[str, threading.Event, threading.Thread]] = {}  # phase -> waiter, found
        self._idle: list[Any] = []  # connections whose wait ended
        self._names = itertools.count()

    def notify(self, phase: int) -> tuple[int, int]:
        key = f"{self._prefix}{phase}"
        self._store.set(key, b"")
        # compare_set(absent, "", "") creates the list empty; present, it answers the list unchanged: one read.
        listed = bytes(self._store.compare_set(f"{key}/waiters", "", ""))
        wake = [f"{self._prefix}wake/{waiter}" for waiter in filter(None, listed.decode().split(","))]
        for waiter_key in wake:
            self._store.set(waiter_key, b"")
        return 2 + len(wake), 2 * len(key) + len(listed) + sum(map(len, wake))

    def wait(self, phase: int, timeout: float, token: Optional[Token]) -> tuple[bool, int]:
        with self._lock:
            passed = [earlier for earlier, (_, found, _) in self._waits.items() if earlier < phase and not found.is_set()]
            for done in [earlier for earlier, (_, found, _) in self._waits.items() if earlier < phase and found.is_set()]:
                del self._waits[done]  # reached: nobody waits for it again
            pending = self._waits.get(phase)
        writes = self.cancel(passed)  # phases the state passed without telling us (a writer without the wake-up)
        if pending is None:
            waiter = f"{os.getpid()}-{id(self)}-{next(self._names)}"
            key = f"{self._prefix}{phase}"
            self._store.append(f"{key}/waiters", f"{waiter},")
            if self._store.check([key]):
                    return True, writes + 2
            found = threading.Event()
            thread = threading.Thread(target=self._block, args=(phase, waiter, found), name="ft-rendezvous-wake",
                                      daemon=True)
            with self._lock:
                pending = self._waits[phase] = (waiter, found, thread)
            thread.start()
            writes += 3  # append, check, the wait
        return pending[1].wait(timeout), writes

    def cancel(self, phases: Optional[list[int]] = None) -> int:
        """End the waits for ``phases`` (default: every one still blocked); the store operations spent."""
        with self._lock:
            ended = [self._waits.pop(phase) for phase in (list(self._waits) if phases is None else phases)]
        ops = 0
        for waiter, found, thread in ended:
            if not found.is_set():
                ops += 1
                try:
                    self._store.set(f"{self._prefix}wake/{waiter}", b"")
                except RuntimeError:  # the store is gone: so is the thread's wait
                    pass
            thread.join(5.0)
        return ops

    def _block(self, phase: int, waiter: str, found: threading.Event) -> None:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        try:
            connection = connection or self._store.clone()
            connection.wait([f"{self._prefix}wake/{waiter}"], datetime.timedelta(seconds=BACKGROUND_WAIT))
        except RuntimeError:  # torch's DistStoreError: the long timeout, or the store is gone (reads will say)
            with self._lock:
                if self._waits.get(phase, (None,))[0] == waiter:
                    del self._waits[phase]  # a later wait for this phase starts anew
            return
        found.set()
        with self._lock:
            self._idle.append(connection)


class EtcdV3PhaseKeys:
    """Phase keys beside the etcd-v3 rendezvous state, on the job's lease; a wait is one watch."""

    def __init__(self, backend: Any) -> None:
        self._client = backend.client
        self._lease = backend.lease
        self._prefix = backend.key + "_phase/"

    def notify(self, phase: int) -> tuple[int, int]:
        key = f"{self._prefix}{phase}"
        self._client.put(key, b"", self._lease.id)
        return 1, len(key)

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
            return bool(self._client.call(watch, f"watch key {self._prefix}{phase}")), 1
        except Exception as exc:  # noqa: BLE001 - any failure: the caller sleeps the rest, as torch would
            log.debug("rendezvous wake-up watch failed: %s", exc)
            return False, 1

    def cancel(self) -> int:
        return 0  # a watch ends with its wait


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
        #: Seconds one state write takes here (a moving average; 2 ms until measured).
        self._write_seconds = 0.002

    def sync(self) -> Optional[bool]:
        written = phase(self._state) if self._dirty else None
        read = self._stored_phase
        started = time.monotonic()
        has_set = super().sync()
        if written is not None:  # a write: how long one takes spreads the joins (see wait_for_change)
            self._write_seconds += (time.monotonic() - started - self._write_seconds) / 4
        if has_set and written is not None:
            # The write replaced exactly the state read (compare-and-set): it crossed phases read+1 .. written.
            for reached in range(read + 1, written + 1):
                ops, size = self._keys.notify(reached)
                self.counts.wake_ops += ops
                self.counts.bytes += size
        return has_set

    def _sanitize(self) -> None:
        self._stored_phase = phase(self._state)  # before torch drops dead nodes locally (not written yet)
        if self._polled_at is not None:
            self.counts.missed += self._stored_phase > self._polled_at
            self._polled_at = None
        super()._sanitize()

    def end_waits(self) -> None:
        """This node's rendezvous is over: nothing of it may still wait."""
        self.counts.wake_ops += self._keys.cancel()

    def wait_for_change(self, timeout: float) -> None:
        """Instead of torch's poll sleep: return when the state's next phase is notified, at most ``timeout``."""
        started = time.monotonic()
        self.counts.waits += 1
        woken, ops = self._keys.wait(self._stored_phase + 1, timeout, self._token)
        self.counts.wake_ops += ops
        if woken:
            self.counts.woken += 1
            if (self._stored_phase + 1) % 2 == 0:
                # The next round opened: every node woken writes its join into the one state key, whose
                # compare-and-set admits one writer at a time; all at once, k nodes spend up to k^2/2 refused
                # writes. Spread over 2 x max_nodes x a write's time (at most torch's 1 s). Not enough:
                # measured, refused writes still grow as N^2 (the leaves are not spread; docs/scale.md).
                spread = min(timeout, 2 * self._settings.max_nodes * self._write_seconds)
                time.sleep(random.uniform(0.0, spread))
        else:
            self._polled_at = self._stored_phase
            time.sleep(max(0.0, timeout - (time.monotonic() - started)))  # a failed wait still paces the polls
        self._last_sync_time = -1  # the next sync reads the backend, not the state cached a moment ago


def _phase_keys(handler: Any) -> Optional[PhaseKeys]:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from ft_core.launcher.rendezvous.etcd_v3 import EtcdV3RendezvousBackend

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
    Torch's sleep is a module function: one rendezvous per process at a time (a launcher's).
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    holder = getattr(handler, "_state_holder", None)
    original = dynamic_rendezvous._delay
    if not isinstance(holder, WakingStateHolder):
        yield
        return

    def delay(seconds: Union[float, tuple[float, float]], *args: Any, **kwargs: Any) -> None:
        if isinstance(seconds, tuple):  # a random skew (see .skew): not a wait for other nodes
            original(seconds, *args, **kwargs)
            return
        holder.wait_for_change(float(seconds))

    before = holder.counts.copy()
    dynamic_rendezvous._delay = delay
    try:
        yield
    finally:
        dynamic_rendezvous._delay = original
        holder.end_waits()
    done = holder.counts.since(before)
    log.info(LOG_LINE, holder.state.round, handler.get_backend(), done.woken, done.waits, done.waits - done.woken,
             done.missed, done.reads, done.writes, done.refused_writes, done.wake_ops, done.bytes)


#: The line each rendezvous logs (``%`` fields: round, backend, then the counts); read back by :func:`logged_rounds`.
LOG_LINE = ("rendezvous round %d (%s): %d of %d waits woken, %d timed out, %d missed a change; %d state reads, "
            "%d writes (%d refused), %d wake-up operations; %d bytes")
_LOG_LINE_PATTERN = re.compile(re.escape(LOG_LINE).replace("%d", r"(\d+)").replace("%s", r"([\w-]+)"))


def logged_rounds(text: str) -> list[tuple[int, RendezvousCounts]]:
    """The (round, counts) of every rendezvous line in a launcher's output, in order (benchmarks, tests)."""
    found = []
    for match in _LOG_LINE_PATTERN.finditer(text):
        round_, _, woken, waits, _, missed, reads, writes, refused, wake_ops, size = match.groups()
        found.append((int(round_), RendezvousCounts(
            reads=int(reads), writes=int(writes), refused_writes=int(refused), wake_ops=int(wake_ops),
            waits=int(waits), woken=int(woken), missed=int(missed), bytes=int(size))))
    return found
