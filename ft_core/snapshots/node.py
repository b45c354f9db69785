"""One rank's snapshots on its node: what the Lightning callback and the client's helpers use.

Example (a custom loop, under ``ft_launcher``; :meth:`ft_core.client.RankMonitorClient.save_snapshot`
and ``load_snapshot`` wrap the same)::

    snapshots = NodeSnapshots.for_rank(rank, world_size, every=50)  # or "auto": from the measured cost
    state = snapshots.resume(disk_step=step_of_the_disk_checkpoint)  # on every rank
    if state is not None:
        model.load_state_dict(state["model"]); step = state["step"]
    ...
    snapshots.maybe_save(step, lambda: {"model": model.state_dict(), "step": step})
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Optional

from ft_core.all_ranks import all_ranks_max, all_ranks_ok
from ft_core.events import ResumeSource
from ft_core.finite import nonfinite_tensors, whole_state
from ft_core.jobdir import MONITOR_SOCKET_ENV
from ft_core.snapshots.interval import AUTO, AutoInterval, SnapshotCost, SnapshotEvery
from ft_core.snapshots.resume import Agreement, agree, choose, record_choice
from ft_core.snapshots.room import StateSize, read_limits, refusal, state_size
from ft_core.snapshots.slots import SLOTS, Snapshot, SnapshotSlots
from ft_core.snapshots.space import snapshot_dir_for_socket
from ft_core.snapshots.writer import SnapshotWriter, copies_done, copy_state, side_stream

__all__ = ["NodeSnapshots", "load_snapshot", "process_snapshots", "save_snapshot"]

log = logging.getLogger("ft_core.snapshots")


class NodeSnapshots:
    """The snapshot slots of global rank ``rank``, their writer thread and the resume decision.

    ``every``: a snapshot every this many steps (0: none), or, with ``auto``, the interval
    :class:`~ft_core.snapshots.interval.AutoInterval` derives from the measured cost (then a
    collective: every rank calls :meth:`due` at every step).
    """

    def __init__(self, slots: SnapshotSlots, socket_path: str, every: int, auto: Optional[AutoInterval] = None
                 ) -> None:
        self.slots = slots
        self.socket_path = socket_path
        self.auto = auto
        self._every = every
        self.writer: Optional[SnapshotWriter] = None
        #: The agreement and choice of the last :meth:`resume`.
        self.agreement: Optional[Agreement] = None
        self.source: Optional[ResumeSource] = None
        self._resumes = 0
        self._last_step: Optional[int] = None
        self._decided_step: Optional[int] = None
        #: The training thread's time for the newest snapshot (building and copying the state).
        self._blocking_s: Optional[float] = None
        #: The last decision's all-reduce (``auto``).
        self._decision_s = 0.0
        #: Snapshots handed to a writer by this process, and the costs of the last ones measured.
        self._submitted = 0
        self._costs: collections.deque[tuple[int, SnapshotCost]] = collections.deque(maxlen=3)
        #: ``auto`` turned snapshots off (no room): the job agreed, and none is taken from then on.
        self._off = False
        #: The last copy handed to the writer, reused by the next one (host memory: one state's size).
        self._staging: Any = None
        #: The CUDA stream the copies of CUDA tensors are made on (made at the first such copy).
        self._stream: Any = None

    @property
    def every(self) -> int:
        """The interval in force (0: no snapshots)."""
        return self.auto.every if self.auto is not None else self._every

    @classmethod
    def for_rank(cls, rank: int, world_size: int, every: SnapshotEvery = AUTO,
                 socket_path: Optional[str] = None) -> Optional[NodeSnapshots]:
        """The rank's snapshots, or None when this run has no launcher-owned snapshot directory."""
        socket_path = socket_path or os.environ.get(MONITOR_SOCKET_ENV)
        if not socket_path:
            return None
        directory = snapshot_dir_for_socket(socket_path)
        if directory is None:
            return None
        slots = SnapshotSlots(directory, rank, world_size)
        return cls(slots, socket_path, 0, AutoInterval()) if every == AUTO else cls(slots, socket_path, int(every))

    @classmethod
    def for_process(cls) -> Optional[NodeSnapshots]:
        """:meth:`for_rank` of this worker (``RANK``, ``WORLD_SIZE`` as torchrun and ft_launcher set them)."""
        return cls.for_rank(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), every=0)

    @property
    def cycle(self) -> int:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)

    def resume(self, disk_step: Optional[int], load: Optional[Callable[[str], Any]] = None,
               weights: Optional[Callable[[Any], Any]] = whole_state) -> Optional[Any]:
        """The agreed snapshot's state when it is newer than ``disk_step`` and loads on every rank; else None.

        A collective: every rank calls it, before training, with the same ``disk_step``. A snapshot
        is guarded as a disk checkpoint is: one that does not load on some rank, or whose
        ``weights(state)`` hold NaN or infinity on some rank (:func:`ft_core.finite.nonfinite_tensors`;
        ``weights=None``: not checked), is skipped like a torn one, and the ranks agree on the next
        older one (or the disk checkpoint); one the fault policy condemned is never offered
        (:mod:`ft_core.snapshots.condemned`). Starts the writer, which first discards the slots not
        resumed from (off this thread: freeing a state's pages is no part of a resume); global rank
        0 records the choice.
        """
        skipped: dict[tuple[int, str], str] = {}
        while True:  # each turn skips one more of the at most SLOTS snapshots a rank holds
            self.agreement = agreement = agree(self.slots, frozenset(skipped))
            source, reason = choose(agreement, disk_step)
            snapshot = agreement.snapshot
            if source is not ResumeSource.SNAPSHOT or snapshot is None:
                state = None
                break
            state, problem = self._load_checked(snapshot, load, weights)
            if all_ranks_ok(problem is None):  # every rank resumes from it, or none does
                break
            skipped[snapshot.step, snapshot.lineage] = f"step {snapshot.step}: {problem or 'rejected by another rank'}"
        if skipped:
            reason += f" (skipped the snapshot of {'; of '.join(skipped.values())})"
        self.source = source
        keep = agreement.snapshot.slot if state is not None and agreement.snapshot is not None else None
        self._start_writer(keep, discard=True)
        if self.slots.rank == 0:
            record_choice(self.socket_path, self.cycle, source, reason, agreement, disk_step)
        log.info("resume: %s (%s)", source.value, reason)
        return state

    def _load_checked(self, snapshot: Snapshot, load: Optional[Callable[[str], Any]],
                      weights: Optional[Callable[[Any], Any]]) -> tuple[Any, Optional[str]]:
        """The state of ``snapshot`` and None, or None and why it must not be resumed from (this rank's view)."""
        path = snapshot.path
        try:
            state = load(path) if load is not None else self.slots.load(snapshot)
        except Exception as exc:  # noqa: BLE001 - a snapshot that does not load is skipped, on every rank
            log.warning("snapshot %s does not load: %s: %s", path, type(exc).__name__, exc)
            return None, f"does not load: {type(exc).__name__}: {exc}"
        bad = nonfinite_tensors(weights(state)) if weights is not None else []
        if bad:
            log.warning("snapshot %s holds non-finite values in %s: not resumed from", path, ", ".join(bad))
            return None, f"non-finite values in {', '.join(bad)}"
        return state, None

    def _start_writer(self, keep: Optional[int], discard: bool = False) -> SnapshotWriter:
        if self.writer is not None:
            self.writer.close()
        self._resumes += 1
        # The lineage: the same on every rank of this cycle, new at every resume (see ft_core.snapshots.slots).
        self.writer = SnapshotWriter(self.slots, f"{self.cycle}.{self._resumes}", keep_slot=keep, discard=discard)
        return self.writer

    def due(self, step: int, every: Optional[int] = None) -> bool:
        """True when a snapshot is due after step ``step`` (every ``every`` steps, default :attr:`every`; once per step).

        With ``auto`` (and no ``every``) a collective at the steps the interval in force makes due:
        there the ranks agree on the interval (:meth:`_decide`), and the snapshot is due when the
        step still is under it and no rank is still writing its previous one.
        """
        if self._off:
            return False
        if every is None and self.auto is not None:
            self.auto.step_ended(step)
            if step <= 0 or step % self.auto.every or step in (self._last_step, self._decided_step):
                return False
            self._decided_step = step
            return self._decide(step)
        every = self.every if every is None else every
        return every > 0 and step > 0 and step % every == 0 and step != self._last_step

    def _decide(self, step: int) -> bool:
        """At a due step of ``auto`` (every rank): agree on the interval, on turning off, on taking this one."""
        assert self.auto is not None
        busy = self.writer is not None and not self.writer.idle
        writer_cost = self.writer.cost() if self.writer is not None else None
        # A worker's first snapshot is no guide to the next ones: it copies into fresh memory and pays for
        # first uses (the pickler's, the RNG states' queries), several times a warm one on a small state.
        # The step also waits for this decision's all-reduce: part of what a snapshot costs it.
        latest = None if writer_cost is None or self._blocking_s is None or self._submitted < 2 \
            else SnapshotCost(self._blocking_s + self._decision_s, *writer_cost)
        if latest is not None and not busy and (not self._costs or self._costs[-1][0] != self._submitted):
            self._costs.append((self._submitted, latest))
        # The median of the last three: one snapshot slowed by a busy moment does not move the interval; a
        # write still running counts with its time so far when that is more.
        costs = sorted((cost for _, cost in self._costs), key=lambda c: c.total_s)
        cost = costs[len(costs) // 2] if costs else None
        if busy and latest is not None and (cost is None or latest.total_s > cost.total_s):
            cost = latest
        started = time.perf_counter()
        proposed, any_busy = all_ranks_max([self.auto.propose(cost), int(busy)])
        self._decision_s = time.perf_counter() - started
        if self.auto.agree(proposed) and self.slots.rank == 0:
            log.info("snapshot_every='auto': a snapshot every %d steps from step %d (rank 0: %s; steps of %.3f s; "
                     "the largest interval any rank asked for)", self.auto.every, step,
                     _described(cost), self.auto.step_s or 0.0)
        return not any_busy and step % self.auto.every == 0

    @property
    def off(self) -> bool:
        """``auto`` turned snapshots off for the job: there was no room for them."""
        return self._off

    def turn_off(self) -> None:
        """No snapshot from now on (``auto`` found no room); the rank.s slots are removed, the buffers freed."""
        self.auto, self._every, self._staging, self._stream, self._off = None, 0, None, None, True
        self.close()
        self.slots.discard()

    def save(self, step: int, state: Any, wait: bool = False, *, started: Optional[float] = None) -> bool:
        """Copy ``state`` (this thread) and have the writer write it (its thread); False when skipped.

        ``wait``: return once it is written (or failed: see ``writer.error``). ``started``: when the
        training thread began building ``state`` (``time.perf_counter()``), part of the snapshot's cost.
        With ``auto``, a collective: the ranks first agree there is room (:meth:`_room`), before any copy.
        """
        if self._off:
            return False
        started = time.perf_counter() if started is None else started
        self._last_step = step
        size = state_size(state)  # metadata only: nothing copied yet
        if self.auto is not None and not self._room(size):
            return False
        writer = self.writer if self.writer is not None else self._start_writer(None)
        if not writer.idle:  # only this thread submits: idle stays true until the submit below
            writer.skip(step)
            return False
        if size.cuda and self._stream is None:
            self._stream = side_stream()
        stream = self._stream if size.cuda else None
        # The writer is done with the previous copy: copy into it (no fresh pages to fault in).
        self._staging = copy_state(state, reuse=self._staging, stream=stream)
        ready = copies_done(stream) if stream is not None else None
        self._blocking_s = time.perf_counter() - started
        submitted = writer.submit(step, self._staging, ready)
        self._submitted += submitted
        if submitted and wait:
            writer.wait()
        return submitted

    def _room(self, size: StateSize) -> bool:
        """``auto``: whether every rank has room for a snapshot of ``size`` (see :mod:`ft_core.snapshots.room`).

        A collective (one all-reduce of two integers), before any copy: when one rank has no room,
        every rank turns snapshots off, and the rank that found none says why in one INFO line.
        """
        held = 0
        for slot in range(SLOTS):
            try:
                held += os.path.getsize(self.slots.state_file(slot))
            except OSError:  # no such slot (or the writer is discarding it)
                pass
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        staged = state_size(self._staging).total if self._staging is not None else 0
        found = refusal(size, ranks, read_limits(self.slots.directory), held=held, staged=staged)
        refused, by = all_ranks_max([int(found is not None), self.slots.rank if found is not None else -1])
        if not refused:
            return True
        if found is not None and by == self.slots.rank:  # one line for the job: the last rank that found no room
            log.info("snapshot_every='auto': in-memory snapshots are off for this job, no copy was made: %s (rank "
                     "%d); see 'Memory' in docs/snapshots.md",
                     found.describe(size, ranks), self.slots.rank)
        self.turn_off()
        return False

    def take(self, step: int, state: Callable[[], Any]) -> bool:
        """:meth:`save` of ``state()``; building it counts in the snapshot's cost."""
        started = time.perf_counter()
        return self.save(step, state(), started=started)

    def maybe_save(self, step: int, state: Callable[[], Any]) -> bool:
        """:meth:`take` when :meth:`due`; the state is built only then."""
        return self.take(step, state) if self.due(step) else False

    def close(self, timeout: Optional[float] = 60.0) -> None:
        """Finish the write in progress and stop the writer (the snapshots stay for the next workers)."""
        if self.writer is not None:
            self.writer.close(timeout)
            self.writer = None


# -- the plain-PyTorch API (``from ft_core import save_snapshot, load_snapshot``) ----------------------
@functools.cache
def process_snapshots() -> Optional[NodeSnapshots]:
    """This worker's :class:`NodeSnapshots` (None when not under ``ft_launcher``), made at the first call."""
    return NodeSnapshots.for_process()


def load_snapshot(disk_step: Optional[int] = None, *,
                  weights: Optional[Callable[[Any], Any]] = whole_state) -> Optional[Any]:
    """The state of the newest snapshot every rank holds when it is newer than ``disk_step``; else None.

    A collective (over the default group when ``torch.distributed`` is initialized): call it on every
    rank before training, with the step of the disk checkpoint the job would resume from (None:
    none). None also when the job was not launched by ``ft_launcher``, which owns the snapshots.
    A snapshot whose ``weights(state)`` (by default every tensor of it) hold NaN or infinity is
    skipped for an older one, as a torn one is; ``weights=None`` skips that check. Arm a
    :class:`~ft_integrations.checkpoint_guard.LossWatch` after a resume from one, as after a disk load.
    """
    snapshots = process_snapshots()
    return snapshots.resume(disk_step, weights=weights) if snapshots is not None else None


def save_snapshot(state_dict: Any, step: int, wait: bool = False) -> bool:
    """Copy ``state_dict`` (tensors to host memory) and write it to the rank.s snapshot slots in a thread.

    Returns at once (with ``wait``: once it is written); False when skipped (the previous snapshot
    is still being written, or there is no snapshot directory: not under ``ft_launcher``).
    """
    snapshots = process_snapshots()
    return snapshots is not None and snapshots.save(int(step), state_dict, wait=wait)


def _described(cost: Optional[SnapshotCost]) -> str:
    if cost is None:
        return "no snapshot measured yet"
    return (f"a snapshot costs {cost.total_s:.3f} s: {cost.blocking_s:.3f} s in the step, {cost.writer_cpu_s:.3f} s "
            f"of the writer's CPU")
