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

Within a restart, the nodes of the completed round also write in turn, by
that round's rank (:mod:`.turns`): the next node still to write is told by a
key addressed to it when its turn comes, so their compare-and-set writes of
the one state key follow one another instead of being refused N^2 times. A
turn that does not come within the same second (and no node ahead wrote
meanwhile) is not waited for: the node writes as torch would.

Backends: c10d (a key per phase and one per waiter in the rendezvous
TCPStore, see :class:`C10dPhaseKeys`) and etcd-v3 (a key per phase beside the
state: a watch from now, then a read). etcd-v2 keeps torch's
poll. ``--rdzv-conf wake_on_change=0`` keeps it on any backend.

Each rendezvous of the launcher logs one line, which ``benchmarks/scale.py`` reads::

    rendezvous round 2 (c10d): 2 of 2 waits woken, 0 timed out, 0 missed a change; 5 state reads,
    4 writes (1 refused), 9 wake-up operations; 7342 bytes

"waits" counts the waits for a phase and for a turn; "missed a change": a wait for a
phase that timed out although the state had reached it (the read after it found a
later phase), i.e. the wake-up did not come.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import logging
import os
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

from ft_core.launcher.rendezvous.conf import WAKE_CONF_KEY, switched_on
from ft_core.launcher.rendezvous.job_store import NAMESPACE
from ft_core.launcher.rendezvous.turns import RestartOrder, inbox_name

__all__ = ["LOG_LINE", "RendezvousCounts", "WakingStateHolder", "install_wake_on_change", "logged_rounds",
           "woken_on_change"]

log = logging.getLogger("ft_core.launcher")

#: Seconds a c10d phase wait blocks in its thread before it is given up (and started again when needed).
BACKGROUND_WAIT = 600.0

#: Seconds a write of a restart waits for its turn (torch's poll second), again while the nodes ahead progress...
TURN_WAIT = 1.0
#: ... plus this per node ahead of it: behind a node that does not come, the next in line gives up first (its
#: write is progress to the others, which keep their places) instead of all at once (64 nodes on etcd-v3 whose
#: restart reached them over 9 s on 2 cores: 814 refused writes with the same second for all).
TURN_WAIT_PER_NODE = 0.05



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


def key_name(phase: int, inbox: Optional[str] = None) -> str:
    """The key of ``phase`` (the state reached it), or of ``inbox``'s turn in it (see :mod:`.turns`)."""
    return str(phase) if inbox is None else f"{phase}/turn/{inbox}"


class PhaseKeys(Protocol):
    """How one backend tells the nodes waiting for a phase that the state reached it (or a node that its turn came)."""

    def notify(self, phase: int, inbox: Optional[str] = None) -> tuple[int, int]:
        """Tell the waiters that the state reached ``phase`` (or ``inbox`` that its turn in it came).

        Returns the store operations and bytes spent.
        """

    def wait(self, phase: int, timeout: float, inbox: Optional[str] = None) -> tuple[bool, int]:
        """Block until the key of ``phase`` (of ``inbox``'s turn in it) exists (True), or ``timeout`` seconds passed
        or it failed (False). Also returns the store operations spent."""

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
    that read or sees the key. A turn's key (its one waiter: the node it is
    addressed to) goes the same way. At the end of its rendezvous a node sets
    its own pending keys, so no thread outlives it (one blocked in a store at
    exit aborts the interpreter).
    """

    def __init__(self, store: Any, run_id: str) -> None:
        self._store = store
        self._prefix = f"{NAMESPACE}/{run_id}/rdzv_phase/"
        self._lock = threading.Lock()
        # (order, key name) -> waiter, found. Order: 2p for a turn in phase p, 2p - 1 for the wait for phase p
        # (held at p - 1): waits come in that order, and a wait ends every pending one of a lower order.
        self._waits: dict[tuple[int, str], tuple[str, threading.Event, threading.Thread]] = {}
        self._idle: list[Any] = []  # connections whose wait ended
        self._names = itertools.count()

    def notify(self, phase: int, inbox: Optional[str] = None) -> tuple[int, int]:
        key = f"{self._prefix}{key_name(phase, inbox)}"
        self._store.set(key, b"")
        # compare_set(absent, "", "") creates the list empty; present, it answers the list unchanged: one read.
        listed = bytes(self._store.compare_set(f"{key}/waiters", "", ""))
        wake = [f"{self._prefix}wake/{waiter}" for waiter in filter(None, listed.decode().split(","))]
        for waiter_key in wake:
            self._store.set(waiter_key, b"")
        return 2 + len(wake), 2 * len(key) + len(listed) + sum(map(len, wake))

    def wait(self, phase: int, timeout: float, inbox: Optional[str] = None) -> tuple[bool, int]:
        slot = (2 * phase - (inbox is None), key_name(phase, inbox))
        with self._lock:
            passed = [earlier for earlier, (_, found, _) in self._waits.items() if earlier[0] < slot[0] and not found.is_set()]
            for done in [earlier for earlier, (_, found, _) in self._waits.items() if earlier[0] < slot[0] and found.is_set()]:
                del self._waits[done]  # reached: nobody waits for it again
            pending = self._waits.get(slot)
        # Phases the state passed without telling us (a writer without the wake-up), turns that did not come.
        writes = self.cancel(passed)
        if pending is None:
            waiter = f"{os.getpid()}-{id(self)}-{next(self._names)}"
            key = f"{self._prefix}{slot[1]}"
            self._store.append(f"{key}/waiters", f"{waiter},")
            if self._store.check([key]):
                    return True, writes + 2
            found = threading.Event()
            thread = threading.Thread(target=self._block, args=(slot, waiter, found), name="ft-rendezvous-wake",
                                      daemon=True)
            with self._lock:
                pending = self._waits[slot] = (waiter, found, thread)
            thread.start()
            writes += 3  # append, check, the wait
        return pending[1].wait(timeout), writes

    def cancel(self, slots: Optional[list[tuple[int, str]]] = None) -> int:
        """End the waits of ``slots`` (default: every one still blocked); the store operations spent."""
        with self._lock:
            ended = [self._waits.pop(slot) for slot in (list(self._waits) if slots is None else slots)]
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

    def _block(self, slot: tuple[int, str], waiter: str, found: threading.Event) -> None:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        try:
            connection = connection or self._store.clone()
            connection.wait([f"{self._prefix}wake/{waiter}"], datetime.timedelta(seconds=BACKGROUND_WAIT))
        except RuntimeError:  # torch's DistStoreError: the long timeout, or the store is gone (reads will say)
            with self._lock:
                if self._waits.get(slot, (None,))[0] == waiter:
                    del self._waits[slot]  # a later wait for this phase starts anew
            return
        found.set()
        with self._lock:
            self._idle.append(connection)


class EtcdV3PhaseKeys:
    """Phase keys beside the etcd-v3 rendezvous state, on the job's lease; a wait is a watch and a read.

    (:meth:`EtcdV3Client.wait_for`: a watch from the current revision, then a read of the key. A watch from the
    revision of the state read would need no read, but etcd answers such a watch only on its 100 ms catch-up tick.)
    """

    def __init__(self, backend: Any) -> None:
        self._client = backend.client
        self._lease = backend.lease
        self._prefix = backend.key + "_phase/"

    def notify(self, phase: int, inbox: Optional[str] = None) -> tuple[int, int]:
        key = f"{self._prefix}{key_name(phase, inbox)}"
        self._client.put(key, b"", self._lease.id)
        return 1, len(key)

    def wait(self, phase: int, timeout: float, inbox: Optional[str] = None) -> tuple[bool, int]:
        try:
            return self._client.wait_for(f"{self._prefix}{key_name(phase, inbox)}", timeout) is not None, 2
        except Exception as exc:  # noqa: BLE001 - any failure: the caller sleeps the rest, as torch would
            log.debug("rendezvous wake-up watch failed: %s", exc)
            return False, 2

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
    """Torch's state holder that notifies the phases its writes reach and waits for the next one.

    In a restart (between :meth:`begin` and :meth:`end_waits`) it also writes in its turn (:mod:`.turns`).
    """

    def __init__(self, backend: RendezvousBackend, settings: RendezvousSettings, keys: PhaseKeys, node: Any,
                 cache_duration: int = 1) -> None:
        self.counts = RendezvousCounts()
        super().__init__(_CountingBackend(backend, self.counts), settings, cache_duration)
        self._keys = keys
        self._order = RestartOrder(node)
        self._inbox = inbox_name(node)
        #: The phase of the state last read from or written to the backend (before torch's local clean-up).
        self._stored_phase = -1
        #: The phase a wait timed out at, until the next read tells whether it missed a change.
        self._polled_at: Optional[int] = None
        #: Whether writes wait for their turn: only within a rendezvous (not torch's keep-alive thread's writes).
        self._ordered = False
        #: From the state last read or written: the nodes ahead of this one in its turn, and the next one after it.
        self._ahead: frozenset[Any] = frozenset()
        self._successor: Optional[Any] = None
        #: The phase in which this node holds its turn (it may write), and the last phase whose turn it passed on.
        self._turn = -1
        self._passed = -1
        #: (phase, nodes ahead) when its last wait for its turn began: the same after a whole wait, it goes.
        self._waited_for: Optional[tuple[int, frozenset[Any]]] = None

    def sync(self) -> Optional[bool]:
        if self._dirty and self._await_turn():
            # The write was computed on a state read before the wait: read it afresh instead, and torch computes
            # the write again on it (as after a refused write, without the refused write).
            self._dirty = False
            self._last_sync_time = -1
            super().sync()
            return False
        written = phase(self._state) if self._dirty else None
        read = self._stored_phase
        has_set = super().sync()
        if has_set and written is not None:
            # The write replaced exactly the state read (compare-and-set): it crossed phases read+1 .. written.
            for reached in range(read + 1, written + 1):
                ops, size = self._keys.notify(reached)
                self.counts.wake_ops += ops
                self.counts.bytes += size
        return has_set

    def _sanitize(self) -> None:
        state = self._state
        self._stored_phase = phase(state)  # before torch drops dead nodes locally (not written yet)
        if self._polled_at is not None:
            self.counts.missed += self._stored_phase > self._polled_at
            self._polled_at = None
        self._order.observe(state)
        self._ahead, self._successor = self._order.ahead(state), self._order.successor(state)
        super()._sanitize()

    def _await_turn(self) -> bool:
        """Before a write in a restart: wait until it is this node's turn; whether it waited (the state is stale)."""
        held = self._stored_phase
        if not self._ordered or self._turn == held:
            return False
        if not self._ahead or self._waited_for == (held, self._ahead):  # first in line, or no progress in a wait
            self._turn = held
            return False
        self._waited_for = (held, self._ahead)
        self.counts.waits += 1
        woken, ops = self._keys.wait(held, TURN_WAIT + TURN_WAIT_PER_NODE * len(self._ahead), self._inbox)
        self.counts.wake_ops += ops
        if woken:
            self.counts.woken += 1
            self._turn = held
        return True

    def _pass_turn(self) -> None:
        """This node's writes of its turn are done: the next node still to write may write."""
        if self._turn != self._stored_phase or self._passed == self._turn:
            return  # no turn held in this phase (or the own write moved the phase on: nobody waits in the old one)
        self._passed = self._turn
        if self._successor is not None:
            ops, size = self._keys.notify(self._turn, inbox_name(self._successor))
            self.counts.wake_ops += ops
            self.counts.bytes += size

    def begin(self) -> None:
        """This node's rendezvous starts: its writes of a restart take their turn."""
        self._ordered = True

    def end_waits(self) -> None:
        """This node's rendezvous is over: nothing of it may still wait, and its turn goes on."""
        self._pass_turn()
        self._ordered = False
        self.counts.wake_ops += self._keys.cancel()

    def wait_for_change(self, timeout: float) -> None:
        """Instead of torch's poll sleep: return when the state's next phase is notified, at most ``timeout``."""
        self._pass_turn()  # waiting: done writing in this phase
        started = time.monotonic()
        self.counts.waits += 1
        woken, ops = self._keys.wait(self._stored_phase + 1, timeout)
        self.counts.wake_ops += ops
        if woken:
            self.counts.woken += 1
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

    if not switched_on(rdzv_configs, WAKE_CONF_KEY):
        return False
    if not isinstance(handler, DynamicRendezvousHandler):
        return False
    keys = _phase_keys(handler)
    if keys is None:
        return False
    old: Any = handler._state_holder  # torch's _BackendRendezvousStateHolder (its backend is checked above)
    holder = WakingStateHolder(old._backend, old._settings, keys, handler._this_node, old._cache_duration)
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
    holder.begin()
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
