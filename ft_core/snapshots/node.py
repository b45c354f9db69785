"""One rank's snapshots on its node: what the Lightning callback and the client's helpers use.

Example (a custom loop, under ``ft_launcher``; :meth:`ft_core.client.RankMonitorClient.save_snapshot`
and ``load_snapshot`` wrap the same)::

    snapshots = NodeSnapshots.for_rank(rank, world_size, every=50)
    state = snapshots.resume(disk_step=step_of_the_disk_checkpoint)  # on every rank
    if state is not None:
        model.load_state_dict(state["model"]); step = state["step"]
    ...
    snapshots.maybe_save(step, lambda: {"model": model.state_dict(), "step": step})
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any, Optional

from ft_core.events import ResumeSource
from ft_core.jobdir import MONITOR_SOCKET_ENV
from ft_core.snapshots.resume import Agreement, agree, all_ranks_ok, choose, record_choice
from ft_core.snapshots.space import snapshot_dir_for_socket
from ft_core.snapshots.store import SnapshotStore
from ft_core.snapshots.writer import SnapshotWriter, copy_state

__all__ = ["DEFAULT_SNAPSHOT_EVERY", "NodeSnapshots", "load_snapshot", "process_snapshots", "save_snapshot"]

log = logging.getLogger("ft_core.snapshots")

#: The interval recommended when snapshots are turned on without a measurement of one's own: what
#: ``benchmarks/snapshot.py`` found to keep a ~200 MB state within 3 % of 200 ms steps on 2 busy cores
#: (``snapshot_every_for_3pct``; see docs/snapshots.md). Not a default that turns snapshots on: they cost
#: three times the state in host memory, which a job must choose to spend.
DEFAULT_SNAPSHOT_EVERY = 100


class NodeSnapshots:
    """The snapshot store of global rank ``rank``, its writer thread and the resume decision."""

    def __init__(self, store: SnapshotStore, socket_path: str, every: int) -> None:
        self.store = store
        self.socket_path = socket_path
        self.every = every
        self.writer: Optional[SnapshotWriter] = None
        #: The agreement and choice of the last :meth:`resume`.
        self.agreement: Optional[Agreement] = None
        self.source: Optional[ResumeSource] = None
        self._resumes = 0
        self._last_step: Optional[int] = None
        #: The last copy handed to the writer, reused by the next one (host memory: one state's size).
        self._staging: Any = None

    @classmethod
    def for_rank(cls, rank: int, world_size: int, every: int = DEFAULT_SNAPSHOT_EVERY,
                 socket_path: Optional[str] = None) -> Optional[NodeSnapshots]:
        """The rank's snapshots, or None when this run has no launcher-owned snapshot directory."""
        socket_path = socket_path or os.environ.get(MONITOR_SOCKET_ENV)
        if not socket_path:
            return None
        directory = snapshot_dir_for_socket(socket_path)
        if directory is None:
            return None
        return cls(SnapshotStore(directory, rank, world_size), socket_path, every)

    @classmethod
    def for_process(cls) -> Optional[NodeSnapshots]:
        """:meth:`for_rank` of this worker (``RANK``, ``WORLD_SIZE`` as torchrun and ft_launcher set them)."""
        return cls.for_rank(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), every=0)

    @property
    def cycle(self) -> int:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)

    def resume(self, disk_step: Optional[int], load: Optional[Callable[[str], Any]] = None) -> Optional[Any]:
        """The agreed snapshot's state when it is newer than ``disk_step`` and loads on every rank; else None.

        A collective: every rank calls it, before training, with the same ``disk_step``. Discards the
        slots not resumed from and starts the writer; global rank 0 records the choice.
        """
        import torch

        self.agreement = agreement = agree(self.store)
        source, reason = choose(agreement, disk_step)
        state = None
        if agreement.snapshot is not None:  # the same on every rank: so is the collective below
            path = agreement.snapshot.path
            if source is ResumeSource.SNAPSHOT:
                try:
                    state = load(path) if load is not None else torch.load(path, map_location="cpu",
                                                                            weights_only=False)
                except Exception as exc:  # noqa: BLE001 - a snapshot that does not load is skipped, on every rank
                    log.warning("snapshot %s does not load: %s: %s", path, type(exc).__name__, exc)
            # Every rank resumes from it, or none does (a rank that did not load it, or chose its disk
            # checkpoint because it saw another step there).
            if not all_ranks_ok(state is not None) and source is ResumeSource.SNAPSHOT:
                state = None
                source, reason = ResumeSource.DISK, f"{reason}, but not every rank loaded it: resuming from disk"
        self.source = source
        keep = agreement.snapshot.slot if state is not None and agreement.snapshot is not None else None
        self.store.discard(keep=keep)
        self._start_writer(keep)
        if self.store.rank == 0:
            record_choice(self.socket_path, self.cycle, source, reason, agreement, disk_step)
        log.info("resume: %s (%s)", source.value, reason)
        return state

    def _start_writer(self, keep: Optional[int]) -> SnapshotWriter:
        if self.writer is not None:
            self.writer.close()
        self._resumes += 1
        # The lineage: the same on every rank of this cycle, new at every resume (see ft_core.snapshots.store).
        self.writer = SnapshotWriter(self.store, f"{self.cycle}.{self._resumes}", keep_slot=keep)
        return self.writer

    def due(self, step: int, every: Optional[int] = None) -> bool:
        """True when a snapshot is due after step ``step`` (every ``every`` steps, default ``self.every``; once per step)."""
        every = self.every if every is None else every
        return every > 0 and step > 0 and step % every == 0 and step != self._last_step

    def save(self, step: int, state: Any, wait: bool = False) -> bool:
        """Copy ``state`` (this thread) and have the writer write it (its thread); False when skipped.

        ``wait``: return once it is written (or failed: see ``writer.error``).
        """
        writer = self.writer if self.writer is not None else self._start_writer(None)
        self._last_step = step
        if not writer.idle:  # only this thread submits: idle stays true until the submit below
            writer.skip(step)
            return False
        # The writer is done with the previous copy: copy into it (no fresh pages to fault in).
        self._staging = copy_state(state, reuse=self._staging)
        submitted = writer.submit(step, self._staging)
        if submitted and wait:
            writer.wait()
        return submitted

    def maybe_save(self, step: int, state: Callable[[], Any]) -> bool:
        """:meth:`save` of ``state()`` when :meth:`due`; the state is built only then."""
        return self.save(step, state()) if self.due(step) else False

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


def load_snapshot(disk_step: Optional[int] = None) -> Optional[Any]:
    """The state of the newest snapshot every rank holds when it is newer than ``disk_step``; else None.

    A collective (through a gloo group when ``torch.distributed`` is initialized): call it on every
    rank before training, with the step of the disk checkpoint the job would resume from (None:
    none). None also when the job was not launched by ``ft_launcher``, which owns the snapshots.
    """
    snapshots = process_snapshots()
    return snapshots.resume(disk_step) if snapshots is not None else None


def save_snapshot(state_dict: Any, step: int, wait: bool = False) -> bool:
    """Copy ``state_dict`` (tensors to host memory) and write it to the node's snapshot store in a thread.

    Returns at once (with ``wait``: once it is written); False when skipped (the previous snapshot
    is still being written, or there is no store: not under ``ft_launcher``).
    """
    snapshots = process_snapshots()
    return snapshots is not None and snapshots.save(int(step), state_dict, wait=wait)
