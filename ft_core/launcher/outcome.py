"""How a launcher ends: its exit code, why, and what becomes of the rendezvous (the rules SLURM requeues by)."""

from __future__ import annotations

import dataclasses
import signal
from typing import Optional

from ft_core.autoresume import finished_flag_path, training_finished

__all__ = ["LEFT_UNFINISHED_EXIT_CODE", "Outcome", "exit_status", "left_job_outcome", "signal_outcome"]

#: Exit code of a launcher whose node left an unfinished job (excluded): requeue, as for 128+N (EX_TEMPFAIL).
LEFT_UNFINISHED_EXIT_CODE = 75


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How this launcher ends: its exit code, why, and what to do with the rendezvous."""

    exit_code: int
    reason: str
    #: "close" ends the rendezvous for every node (and releases hot spares), "leave" removes
    #: only this node, "keep" leaves it alone (signal: the other nodes decide for themselves).
    rendezvous: str = "close"


def exit_status(returncode: int) -> tuple[Optional[int], Optional[str]]:
    """(exit code, None) for a process that exited, (None, signal name) for one a signal killed."""
    return (returncode, None) if returncode >= 0 else (None, signal.Signals(-returncode).name)


def left_job_outcome(reason: str) -> Outcome:
    """How a launcher whose node left the job (excluded) exits: 0 only if training is finished.

    The job goes on without this node, but this launcher did not see it finish: it exits
    :data:`LEFT_UNFINISHED_EXIT_CODE`, which a requeue loop requeues (anything but 0 and the
    no-restart code), never 0, which SLURM would read as a finished job.
    """
    if training_finished():
        return Outcome(0, f"{reason}; training is finished ({finished_flag_path()} exists)", "leave")
    return Outcome(LEFT_UNFINISHED_EXIT_CODE, f"{reason}; this node left an unfinished job", "leave")


def signal_outcome(sig: signal.Signals, detail: str, workers_finished: bool = False) -> Outcome:
    """How a launcher stopped by a forwarded signal exits: the rule a requeue loop relies on.

    SLURM sends SIGTERM before preemption or the time limit; the workers save and exit 0, but the
    job is not done. So the launcher exits 128+N (143 for SIGTERM: requeue) unless training is
    finished: the finished flag exists (:mod:`ft_core.autoresume`) or every worker had already
    exited 0 before the signal (``workers_finished``).
    """
    if workers_finished:
        return Outcome(0, f"{sig.name} received after every worker had finished ({detail})", "keep")
    if training_finished():
        return Outcome(0, f"{sig.name} received; training is finished ({finished_flag_path()} exists)", "keep")
    return Outcome(128 + sig.value, f"{sig.name} received; training not finished ({detail})", "keep")
