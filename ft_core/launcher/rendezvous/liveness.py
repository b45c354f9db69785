"""A lost node leaves torch's rendezvous in seconds: a liveness beat per launcher, read while a round is deserted.

When a node dies (its machine lost, its launcher killed), the ranks of the other nodes fail
at their next collective and their launchers leave the round to form the next one. The dead
node cannot leave: torch's dynamic rendezvous drops it only when its keep-alive has expired
(``keep_alive_interval x keep_alive_max_attempt``: 5 s x 3 by default), so the nodes and a hot
spare wait 10 to 15 s for a node that will never come (``benchmarks/goodput.py`` measured
12.7 s from a node's loss to the next step). Torch's keep-alive cannot simply be made faster:
each one writes the whole state (N entries) with a compare-and-set, so N nodes beating every
second write N^2 entries a second and refuse each other's writes.

This module keeps torch's rendezvous and its keep-alive, and adds evidence that is cheap to
give and to read:

* every launcher *beats*: a thread writes a counter of its own, one small key of the
  rendezvous store (c10d) or of etcd (etcd-v3), six times per ``lost_after`` (every 0.5 s by
  default: :func:`~.conf.beat_interval`);
* a node that waits for the next round while the last complete round is being deserted (it
  is not a member any more, and fewer members remain than the round had) reads the counters
  of the members that remain (one store operation, at its reads of the state but at most
  once per beat interval);
* a member whose counter this node read unchanged over ``lost_after`` seconds of its own
  clock (:data:`~.conf.LOST_AFTER`, 3 s: six beats) stopped beating for that long: it is removed from
  the round, as torch's own clean-up removes a node whose keep-alive expired, and the next
  round opens without it.

Why no healthy node is removed: a live launcher beats from a thread of its own whatever
its workers do (a hung rank, a slow save, a long termination), so its counter changes
between two reads ``lost_after`` apart; a counter unchanged over that span was not written
in it, a fact of the store's order of operations, not of two clocks (nothing compares one
node's clock with another's). A node with no counter (a launcher without this module, or
one that has not beaten yet) is never judged: torch's keep-alive decides, as before. The
rule acts only on a round its other members have already left, so at worst a launcher
stalled for ``lost_after`` seconds in the middle of a restart is replaced by a spare (or
rejoins the round still open), as torch would do after its keep-alive; it never stops a
running job.

``--rdzv-conf lost_after=<seconds>`` sets the span (at least :data:`~.conf.MIN_LOST_AFTER`; a job of
thousands of nodes on etcd may lengthen it to write fewer beats);
``lost_after=0`` turns the rule off (torch's keep-alive alone). Backends: c10d and etcd-v3;
etcd-v2 keeps torch's keep-alive.

Each removal logs one line (:data:`LOST_LINE`)::

    rendezvous round 3: node 127.0.0.1_4242_0 lost: its liveness beat did not change for 3.1 s;
    removed from the round (torch's keep-alive would wait until 15 s after its last heartbeat)
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional, Protocol

from ft_core.launcher.rendezvous.conf import beat_interval, lost_after
from ft_core.launcher.rendezvous.job_store import NAMESPACE
from ft_core.launcher.rendezvous.turns import inbox_name

__all__ = ["LOST_LINE", "LOST_MARK", "BeatEvidence", "BeatWriter", "LostMembers", "install_lost_members"]

log = logging.getLogger("ft_core.launcher")

#: Seconds of failing beats before the writer warns (a job's end can take the store away first).
FAILING_QUIET = 5.0
#: What a node that removed a member writes over its counter: the spare that takes the place need not wait for it
#: (:mod:`.members_first`), and a node whose removal was refused by a concurrent write removes it at its next read.
#: A launcher alive after all writes its next count over it within a beat.
LOST_MARK = b"lost"
#: Logged once per node removed (``%`` fields: round, node, seconds unchanged, torch's keep-alive expiry in seconds).
LOST_LINE = ("rendezvous round %d: node %s lost: its liveness beat did not change for %.1f s; removed from the round "
             "(torch's keep-alive would wait until %.0f s after its last heartbeat)")


class Beats(Protocol):
    """One backend's beat keys: this node writes its own, and reads those of other nodes."""

    def write(self, count: int) -> None:
        """Set this node's counter to ``count``."""

    def read(self, names: Iterable[str]) -> dict[str, Optional[bytes]]:
        """The counters of the nodes ``names`` (None: the node never beat)."""

    def mark_lost(self, name: str) -> None:
        """Set the counter of the node ``name`` to :data:`LOST_MARK` (it beats over it if it is alive after all)."""

    def close(self) -> None:
        """Release what :meth:`write` holds."""


class C10dBeats:
    """Counters in the c10d rendezvous' TCPStore; the beat thread writes on a connection of its own."""

    def __init__(self, store: Any, run_id: str, name: str) -> None:
        self._store = store
        self._prefix = f"{NAMESPACE}/{run_id}/alive/"
        self._name = name
        self._writer: Any = None

    def write(self, count: int) -> None:
        if self._writer is None:
            self._writer = self._store.clone()  # a slow state read of the rendezvous never delays a beat
        self._writer.set(self._prefix + self._name, str(count))

    def read(self, names: Iterable[str]) -> dict[str, Optional[bytes]]:
        names = list(names)
        keys = [self._prefix + name for name in names]
        if self._store.check(keys):  # every node beat: one read of all (multi_get blocks on an absent key)
            return {name: bytes(value) or None for name, value in zip(names, self._store.multi_get(keys))}
        # compare_set(absent, "", "") creates the key empty and answers "": no blocking read of an absent key.
        return {name: bytes(self._store.compare_set(key, "", "")) or None for name, key in zip(names, keys)}

    def mark_lost(self, name: str) -> None:
        self._store.set(self._prefix + name, LOST_MARK)

    def close(self) -> None:
        self._writer = None


class EtcdV3Beats:
    """Counters beside the etcd-v3 rendezvous state, on the job's lease; one range read for all of them."""

    def __init__(self, backend: Any, name: str) -> None:
        self._client = backend.client
        self._lease = backend.lease
        self._prefix = backend.key + "_alive/"
        self._name = name

    def write(self, count: int) -> None:
        self._client.put(self._prefix + self._name, str(count).encode(), self._lease.id)

    def read(self, names: Iterable[str]) -> dict[str, Optional[bytes]]:
        found = self._client.get_prefix(self._prefix)
        return {name: found.get(self._prefix + name) for name in names}

    def mark_lost(self, name: str) -> None:
        self._client.put(self._prefix + name, LOST_MARK, self._lease.id)

    def close(self) -> None:
        pass


@dataclasses.dataclass
class BeatEvidence:
    """What this node read of other nodes' counters: each one's value and when (its monotonic clock) it first read it."""

    seen: dict[str, tuple[bytes, float]] = dataclasses.field(default_factory=dict)

    def observe(self, values: Mapping[str, Optional[bytes]], now: float) -> None:
        """Record one read of counters (None: never beat; its record is dropped, there is nothing to judge)."""
        for name, value in values.items():
            if value is None:
                self.seen.pop(name, None)
            elif name not in self.seen or self.seen[name][0] != value:
                self.seen[name] = (value, now)

    def unchanged_for(self, name: str, now: float) -> Optional[float]:
        """Seconds over which ``name``'s counter was read unchanged (None: no counter read)."""
        if name not in self.seen:
            return None
        return now - self.seen[name][1]

    def lost(self, names: Iterable[str], now: float, after: float) -> dict[str, float]:
        """The nodes of ``names`` whose counter was read unchanged for ``after`` seconds or more, or read as
        :data:`LOST_MARK` (another node's verdict), with the span this node read it unchanged."""
        spans = {name: self.unchanged_for(name, now) for name in names}
        return {name: span for name, span in spans.items()
                if span is not None and (span >= after or self.seen[name][0] == LOST_MARK)}


def deserted_remaining(state: Any, node: Any, members: set[Any]) -> frozenset[Any]:
    """The members of the complete round ``state`` still in it while it is being deserted, else nothing.

    Deserted: ``node`` is not a member any more and fewer remain than ``members`` (every participant of this
    round ``node`` saw). Pure: the caller adds ``state``'s participants to ``members`` first.
    """
    if not state.complete or node in state.participants or len(state.participants) >= len(members):
        return frozenset()
    return frozenset(state.participants)


class BeatWriter:
    """The thread that beats for this launcher, from install to :meth:`close`."""

    def __init__(self, beats: Beats, interval: float) -> None:
        self._beats = beats
        self._interval = interval
        self._stop = threading.Event()
        self._failing = False
        self.count = 0
        self._thread = threading.Thread(target=self._run, name="ft-rendezvous-beat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failing_since: Optional[float] = None
        while True:
            self.count += 1
            try:
                self._beats.write(self.count)
                if self._failing:
                    log.info("rendezvous liveness beat written again")
                failing_since, self._failing = None, False
            except Exception as exc:  # noqa: BLE001 - a store away for a while: keep beating, say so once
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                # Not at once: at a job's end the c10d store's host may leave a moment before this launcher.
                if not self._failing and now - failing_since >= FAILING_QUIET:
                    log.warning("rendezvous liveness beat failing for %.0f s (retrying every %g s): %s",
                                now - failing_since, self._interval, exc)
                    self._failing = True
            if self._stop.wait(self._interval):
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self._beats.close()


class LostMembers:
    """The rule on one handler's state holder: torch's clean-up, then the removal of lost members (module docstring)."""

    def __init__(self, holder: Any, node: Any, beats: Beats, lost_after: float,
                 clock: Callable[[], float] = time.monotonic, interval: Optional[float] = None) -> None:
        self._holder = holder
        self._clock = clock
        self._node = node
        self._beats = beats
        self.lost_after = lost_after
        self.evidence = BeatEvidence()
        self._round = -1
        self._members: set[Any] = set()
        #: (round, node name, seconds unchanged) of every member this node removed.
        self.removed: list[tuple[int, str, float]] = []
        self._interval = beat_interval(lost_after) if interval is None else interval
        #: This node's clock at its last read of the counters (a verdict is given only on a fresh read).
        self._read_at = -float("inf")
        self._sanitize = holder._sanitize
        holder._sanitize = self.sanitize
        self.writer = BeatWriter(beats, self._interval)

    def sanitize(self) -> None:
        """Torch's ``_sanitize`` (dead keep-alives), then lost members of a deserted round removed from the state."""
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _remove_participant_epilogue

        self._sanitize()
        state = self._holder._state
        if not state.complete:
            return
        if state.round != self._round:
            self._round, self._members = state.round, set()
        self._members |= set(state.participants)
        remaining = deserted_remaining(state, self._node, self._members)
        if not remaining:
            return
        now = self._clock()
        if now - self._read_at < self._interval:
            return  # read once per beat at most (every state read of every waiting node would be N^2 reads)
        self._read_at = now
        read = self._read(remaining)
        if read is None:
            return  # no read, no evidence: torch's keep-alive decides
        names, values = read
        self.evidence.observe(values, now)
        lost = self.evidence.lost(names, now, self.lost_after)
        settings = self._holder._settings
        for name, span in lost.items():
            member = names[name]
            del state.participants[member]
            state.last_heartbeats.pop(member, None)
            state.wait_list.discard(member)
            state.redundancy_list.discard(member)
            self.removed.append((state.round, name, span))
            self._mark_lost(name)
            log.info(LOST_LINE, state.round, name, span,
                     (settings.keep_alive_interval * settings.keep_alive_max_attempt).total_seconds())
        if lost:
            _remove_participant_epilogue(state, settings)

    def marked_lost(self, members: Iterable[Any]) -> frozenset[Any]:
        """Those of ``members`` (nodes) whose counter holds :data:`LOST_MARK`: one read; nothing when it fails."""
        read = self._read(members)
        if read is None:
            return frozenset()  # no read, no evidence: they are waited for as before
        names, values = read
        return frozenset(names[name] for name, value in values.items() if value == LOST_MARK)

    def _read(self, members: Iterable[Any]) -> Optional[tuple[dict[str, Any], dict[str, Optional[bytes]]]]:
        """(node of each counter name, the counters read) of ``members``; None when the read failed."""
        names = {inbox_name(member): member for member in members}
        try:
            return names, self._beats.read(names)
        except Exception as exc:  # noqa: BLE001 - a store away for a while: the callers decide without evidence
            log.debug("rendezvous liveness read failed: %s", exc)
            return None

    def _mark_lost(self, name: str) -> None:
        try:
            self._beats.mark_lost(name)
        except Exception as exc:  # noqa: BLE001 - the removal stands; a spare waits its grace for the member
            log.debug("rendezvous liveness mark failed: %s", exc)

    def close(self) -> None:
        """Stop beating (the launcher is leaving)."""
        self.writer.close()


def _beats(handler: Any) -> Optional[Beats]:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from ft_core.launcher.rendezvous.etcd_v3 import EtcdV3RendezvousBackend

    backend = handler._state_holder._backend
    backend = getattr(backend, "inner", backend)  # the wake-up's counting wrapper
    name = inbox_name(handler._this_node)
    if isinstance(backend, C10dRendezvousBackend):
        return C10dBeats(backend._store, handler.get_run_id(), name)
    if isinstance(backend, EtcdV3RendezvousBackend):
        return EtcdV3Beats(backend, name)
    return None


def install_lost_members(handler: Any, rdzv_configs: Mapping[str, Any]) -> Optional[LostMembers]:
    """Give a dynamic rendezvous handler (c10d, etcd-v3) the rule and start beating; None when off or not supported.

    Called once before the first rendezvous, after :func:`~.wake.install_wake_on_change` (which replaces the state
    holder). ``--rdzv-conf lost_after=0`` declines (:func:`~.conf.lost_after`).
    """
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    span = lost_after(rdzv_configs)
    if span == 0 or not isinstance(handler, DynamicRendezvousHandler):
        return None
    beats = _beats(handler)
    if beats is None:
        return None
    return LostMembers(handler._state_holder, handler._this_node, beats, span)
