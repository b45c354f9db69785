"""How a launcher ends: its exit code, why, and what becomes of the rendezvous (the rules SLURM requeues by)."""

from __future__ import annotations

import dataclasses
import enum
import re
import signal
import textwrap
from typing import Optional

from ft_core.autoresume import finished_flag_path, training_finished

__all__ = ["DEFAULT_NO_RESTART_EXIT_CODE", "EXIT_CODES", "LEFT_UNFINISHED_EXIT_CODE", "ExitCode", "Outcome",
           "RendezvousEnd",
           "exit_codes_help", "exit_codes_markdown", "exit_status", "left_job_outcome", "signal_outcome"]

#: Exit code of a launcher whose node left an unfinished job (excluded): requeue, as for 128+N (EX_TEMPFAIL).
LEFT_UNFINISHED_EXIT_CODE = 75
#: "Do not requeue": no progress, the same fault again and again, or ShutdownWorkload (--ft-no-restart-exit-code).
DEFAULT_NO_RESTART_EXIT_CODE = 93


@dataclasses.dataclass(frozen=True)
class ExitCode:
    """One row of the launcher's exit-code contract (``ft_launcher --help`` and ``docs/launcher.md``)."""

    code: str
    #: When the launcher exits with it (Markdown: ``--help`` shows it without the backticks and emphasis).
    when: str


#: The one list of the launcher's exit codes: ``--help``'s epilog and the docs table are generated from it.
EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode("0", "all workers finished successfully; or training is finished (`$FAULT_TOL_FINISHED_FLAG_FILE` "
                  "exists, or every rank of the job reported it when it shut its client down) and a worker failed "
                  "anyway, e.g. SIGABRT at interpreter exit (a warning; never restarted); or a signal arrived, or "
                  "this node was excluded, when training was already finished; or this node was a hot spare the "
                  "job did not need"),
    ExitCode("1", "the restart budget is spent (a fault after `--max-restarts` restarts, counted for the whole "
                  "job), or the launcher itself failed (e.g. rendezvous timeout)"),
    ExitCode(str(LEFT_UNFINISHED_EXIT_CODE),
             "this node left a job that is not finished: it was excluded (`ExcludeThisNode`, "
             "`--ft-straggler-action=exclude-node`) and the job goes on without it, or ends with it: **requeue** "
             "(never 0, which SLURM would read as a finished job)"),
    ExitCode(str(DEFAULT_NO_RESTART_EXIT_CODE),
             "do not requeue: no progress, the same deterministic fault `--ft-max-identical-faults` times in a "
             "row, or a rank requested `ShutdownWorkload` (every node exits with it); the code is "
             "`--ft-no-restart-exit-code`"),
    ExitCode("128+N", "stopped by signal N (143 = SIGTERM, 130 = SIGINT) before training was finished: **requeue**"),
)


def exit_codes_markdown() -> str:
    """The exit-code table of ``docs/launcher.md`` (``tools/exit_codes_table.py`` writes it there)."""
    return "| code | when |\n|---|---|\n" + "".join(f"| {row.code} | {row.when} |\n" for row in EXIT_CODES)


def exit_codes_help(width: int = 100) -> str:
    """The ``exit codes:`` section of ``ft_launcher --help``: the same rows in plain text."""
    lines = ["exit codes:"]
    for row in EXIT_CODES:
        plain = re.sub(r"\*\*|`", "", row.when)
        lines += textwrap.wrap(plain, width, initial_indent=f"  {row.code:<6} ", subsequent_indent=" " * 9,
                               break_on_hyphens=False)
    return "\n".join(lines) + "\n"


class RendezvousEnd(str, enum.Enum):
    """What a launcher that ends does with the rendezvous."""

    CLOSE = "close"  # end it for every node (and release the hot spares)
    LEAVE = "leave"  # remove only this node (excluded: the others go on)
    KEEP = "keep"  # leave it alone (a signal: the other nodes decide for themselves)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How this launcher ends: its exit code, why, and what to do with the rendezvous."""

    exit_code: int
    reason: str
    rendezvous: RendezvousEnd = RendezvousEnd.CLOSE


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
        return Outcome(0, f"{reason}; training is finished ({finished_flag_path()} exists)", RendezvousEnd.LEAVE)
    return Outcome(LEFT_UNFINISHED_EXIT_CODE, f"{reason}; this node left an unfinished job", RendezvousEnd.LEAVE)


def signal_outcome(sig: signal.Signals, detail: str, workers_finished: bool = False) -> Outcome:
    """How a launcher stopped by a forwarded signal exits: the rule a requeue loop relies on.

    SLURM sends SIGTERM before preemption or the time limit; the workers save and exit 0, but the
    job is not done. So the launcher exits 128+N (143 for SIGTERM: requeue) unless training is
    finished: the finished flag exists (:mod:`ft_core.autoresume`) or every worker had already
    exited 0 before the signal (``workers_finished``).
    """
    if workers_finished:
        return Outcome(0, f"{sig.name} received after every worker had finished ({detail})", RendezvousEnd.KEEP)
    if training_finished():
        return Outcome(0, f"{sig.name} received; training is finished ({finished_flag_path()} exists)", RendezvousEnd.KEEP)
    return Outcome(128 + sig.value, f"{sig.name} received; training not finished ({detail})", RendezvousEnd.KEEP)
