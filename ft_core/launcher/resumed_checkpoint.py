"""Which checkpoint a cycle resumed from (a pure function of what the node saw), and condemning it (an action).

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
from collections.abc import Sequence
from typing import Optional

from ft_core.events import CheckpointMarkedBad
from ft_core.launcher.bad_marks import mark_bad_here
from ft_core.launcher.cycle_observations import CycleObservations
from ft_core.megatron_tracker import (
    TRACKER_FILENAME,
    inferred_resume,
    iteration_of,
    load_dir,
    roll_back,
    tracker_iteration,
)
from ft_core.snapshots.condemned import parse_snapshot_name

__all__ = ["mark_checkpoint_bad", "megatron_load_at_start", "resumed_from"]

log = logging.getLogger("ft_core.launcher")


def megatron_load_at_start(worker_args: Sequence[object]) -> tuple[Optional[str], Optional[int]]:
    """Megatron-LM's ``--load`` in the workers' command line and its tracker's iteration, read before they start."""
    directory = load_dir([str(arg) for arg in worker_args])
    return directory, tracker_iteration(directory) if directory else None


def resumed_from(seen: CycleObservations) -> Optional[tuple[str, Optional[int]]]:
    """``(checkpoint, step)`` the cycle's ranks resumed from: as they said, else as inferred; None if unknown.

    The in-memory snapshot when one replaced the disk checkpoint (whose content was then not
    what the cycle ran on): its name (``snapshot:<step>:<lineage>``), never the disk checkpoint.
    The inference (unmodified Megatron-LM) looks only at whether the checkpoint directory exists.
    """
    if seen.resumed_snapshot is not None:
        name = seen.resumed_snapshot.snapshot
        return None if name is None else (name, seen.resumed_snapshot.step)
    if seen.loaded is not None:
        return seen.loaded.checkpoint, seen.loaded.step
    return inferred_resume(seen.load_dir, seen.tracker_at_start, (e.first_iteration for e in seen.exceptions))


def mark_checkpoint_bad(seen: CycleObservations, cycle: int, checkpoint: str, reason: str,
                        monitor_socket: str) -> Optional[CheckpointMarkedBad]:
    """Carry out the fault policy's rule 1 on this node: the next resume skips ``checkpoint`` (or snapshot).

    :func:`.bad_marks.mark_bad_here` marks what this node holds (``monitor_socket``: its
    snapshots' monitor). When this node's ranks never said what they loaded (unmodified
    Megatron-LM), its tracker is moved back too: nothing else would skip the checkpoint.
    Returns the record to write, None when this node holds nothing to mark.
    """
    if not mark_bad_here(checkpoint, reason, monitor_socket):
        return None
    if seen.loaded is None and seen.resumed_snapshot is None and parse_snapshot_name(checkpoint) is None:
        older = roll_back(checkpoint)
        if older is not None:
            tracker = os.path.join(os.path.dirname(os.path.normpath(checkpoint)), TRACKER_FILENAME)
            reason = (f"{reason}; Megatron-LM's {tracker} now names iteration {older} (as it was: "
                      f"{tracker}.bad-{iteration_of(checkpoint)})")
            log.warning("Megatron-LM's %s moved back to iteration %d, past %s", tracker, older, checkpoint)
    return CheckpointMarkedBad(cycle=cycle, checkpoint=checkpoint, reason=reason)
