"""The "training is finished" flag that ends an auto-resume (SLURM requeue) loop.

An integration's global rank 0 creates the file named by
``FAULT_TOL_FINISHED_FLAG_FILE`` when training is complete (``max_steps`` reached,
``shutdown(training_finished=True)``), never on a failure, a preemption or a time
limit. ``ft_launcher`` reads it when a forwarded signal (SLURM's SIGTERM before
preemption or the time limit) stops the job: a finished job exits 0, an unfinished
one 128+N, so the requeue loop knows which one to requeue.

The one home of the flag's rule: the launcher reads it here, and the integrations'
:class:`~ft_integrations.session.FaultToleranceSession` writes it through here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

from ft_core.jobdir import FINISHED_FLAG_ENV

__all__ = ["FINISHED_FLAG_ENV", "finished_flag_path", "mark_training_finished", "training_finished"]


def finished_flag_path(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The flag file named by ``FAULT_TOL_FINISHED_FLAG_FILE``, or None when it is not set."""
    path = (os.environ if environ is None else environ).get(FINISHED_FLAG_ENV, "")
    return path or None


def training_finished(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when the flag file is set and exists."""
    path = finished_flag_path(environ)
    return path is not None and os.path.exists(path)


def mark_training_finished() -> Optional[str]:
    """Create the flag file (and its directory); returns its path, or None when the variable is not set."""
    path = finished_flag_path()
    if path is None:
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8"):
        pass
    return path
