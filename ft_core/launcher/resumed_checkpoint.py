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

from ft_core.checkpoint_manifest import mark_bad
from ft_core.events import CheckpointMarkedBad
from ft_core.launcher.agent_state import AgentState
from ft_core.megatron_tracker import (
    TRACKER_FILENAME,
    inferred_resume,
    iteration_of,
    load_dir,
    roll_back,
    tracker_iteration,
)

__all__ = ["ResumedCheckpoint"]

log = logging.getLogger("ft_core.launcher")


class ResumedCheckpoint(AgentState):
    """The agent's view of the checkpoint each cycle resumed from (see the module docstring)."""

    #: Megatron-LM's ``--load`` in the workers' command line and its tracker's iteration when the cycle started.
    _load_dir: Optional[str] = None
    _tracker_at_start: Optional[int] = None

    def _begin_resume(self) -> None:
        """Forget the last cycle's resume; read Megatron-LM's tracker before this cycle's workers start."""
        self._loaded, self._resumed_from_snapshot = None, False
        self._load_dir = load_dir([str(arg) for arg in self._worker_group.spec.args])
        self._tracker_at_start = tracker_iteration(self._load_dir) if self._load_dir else None

    def _resumed_from(self) -> Optional[tuple[str, Optional[int]]]:
        """``(checkpoint, step)`` this cycle's ranks resumed from: as they said, else as inferred; None if unknown.

        None too when a newer in-memory snapshot replaced the disk checkpoint (its content was
        then not what the cycle ran on).
        """
        if self._resumed_from_snapshot:
            return None
        if self._loaded is not None:
            return self._loaded.checkpoint, self._loaded.step
        return inferred_resume(self._load_dir, self._tracker_at_start, (e.first_iteration for e in self._exceptions))

    def _mark_checkpoint_bad(self, cycle: int, checkpoint: str, reason: str) -> None:
        """Carry out the fault policy's rule 1 on this node: the next resume skips ``checkpoint``.

        The path came from a rank's record or the inference: only an absolute path that exists
        here is marked (on another node's local disk it is that node's to mark; every node acts on
        the same decision). When this node's ranks never said what they loaded (unmodified
        Megatron-LM), its tracker is moved back too: nothing else would skip the checkpoint.
        """
        if not (os.path.isabs(checkpoint) and os.path.exists(checkpoint)):
            log.warning("checkpoint %r to be marked bad is not on this node: left to the node that has it", checkpoint)
            return
        mark_bad(checkpoint, reason)
        fallback = "the next resume falls back to an older one"
        if self._loaded is None:
            older = roll_back(checkpoint)
            if older is not None:
                tracker = os.path.join(os.path.dirname(os.path.normpath(checkpoint)), TRACKER_FILENAME)
                fallback = (f"Megatron-LM's {tracker} now names iteration {older} (as it was: "
                            f"{tracker}.bad-{iteration_of(checkpoint)})")
        self._svc.events.write(CheckpointMarkedBad(cycle=cycle, checkpoint=checkpoint, reason=f"{reason}; {fallback}"))
        log.warning("checkpoint %s marked bad, %s: %s", checkpoint, fallback, reason)
