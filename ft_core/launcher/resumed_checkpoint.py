"""Which checkpoint a cycle resumed from, and condemning it (``FtElasticAgent``'s part).

The fault policy's bad-checkpoint rule (:mod:`ft_core.fault_policy`) needs the
checkpoint each faulty cycle resumed from. The integrations say it (their ranks'
``checkpoint_loaded`` record); an unmodified Megatron-LM job (its own
``ft_integration``, through the NVRx alias) does not, so the launcher infers it
from Megatron-LM's tracker in the worker's ``--load`` directory as the cycle
started, confirmed by the first iteration its ranks reported
(:func:`ft_core.megatron_tracker.inferred_resume`). A condemned checkpoint is
marked bad; the integrations then skip it, and for a Megatron-LM job that never
said what it loaded the tracker is moved back to the newest older checkpoint not
marked bad (:func:`ft_core.megatron_tracker.roll_back`), which Megatron-LM loads.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

from ft_core.events import CheckpointMarkedBad
from ft_core.launcher.agent_state import AgentState
from ft_core.launcher.bad_marks import mark_bad_here
from ft_core.megatron_tracker import (
    TRACKER_FILENAME,
    inferred_resume,
    iteration_of,
    load_dir,
    roll_back,
    tracker_iteration,
)
from ft_core.snapshots.condemned import parse_snapshot_name

__all__ = ["ResumedCheckpoint"]

log = logging.getLogger("ft_core.launcher")


class ResumedCheckpoint(AgentState):
    """The agent's view of the checkpoint each cycle resumed from (see the module docstring)."""

    #: Megatron-LM's ``--load`` in the workers' command line and its tracker's iteration when the cycle started.
    _load_dir: Optional[str] = None
    _tracker_at_start: Optional[int] = None

    def _begin_resume(self) -> None:
        """Forget the last cycle's resume; read Megatron-LM's tracker before this cycle's workers start."""
        self._loaded, self._resumed_snapshot = None, None
        self._load_dir = load_dir([str(arg) for arg in self._worker_group.spec.args])
        self._tracker_at_start = tracker_iteration(self._load_dir) if self._load_dir else None

    def _resumed_from(self) -> Optional[tuple[str, Optional[int]]]:
        """``(checkpoint, step)`` this cycle's ranks resumed from: as they said, else as inferred; None if unknown.

        The in-memory snapshot when one replaced the disk checkpoint (whose content was then not
        what the cycle ran on): its name (``snapshot:<step>:<lineage>``), never the disk checkpoint.
        """
        if self._resumed_snapshot is not None:
            name = self._resumed_snapshot.snapshot
            return None if name is None else (name, self._resumed_snapshot.step)
        if self._loaded is not None:
            return self._loaded.checkpoint, self._loaded.step
        return inferred_resume(self._load_dir, self._tracker_at_start, (e.first_iteration for e in self._exceptions))

    def _mark_checkpoint_bad(self, cycle: int, checkpoint: str, reason: str) -> None:
        """Carry out the fault policy's rule 1 on this node: the next resume skips ``checkpoint`` (or snapshot).

        :func:`.bad_marks.mark_bad_here` marks what this node holds. When this node's ranks never
        said what they loaded (unmodified Megatron-LM), its tracker is moved back too: nothing else
        would skip the checkpoint.
        """
        if not mark_bad_here(checkpoint, reason, self._svc.monitor.socket_path):
            return
        if self._loaded is None and self._resumed_snapshot is None and parse_snapshot_name(checkpoint) is None:
            older = roll_back(checkpoint)
            if older is not None:
                tracker = os.path.join(os.path.dirname(os.path.normpath(checkpoint)), TRACKER_FILENAME)
                reason = (f"{reason}; Megatron-LM's {tracker} now names iteration {older} (as it was: "
                          f"{tracker}.bad-{iteration_of(checkpoint)})")
                log.warning("Megatron-LM's %s moved back to iteration %d, past %s", tracker, older, checkpoint)
        self._svc.events.write(CheckpointMarkedBad(cycle=cycle, checkpoint=checkpoint, reason=reason))
