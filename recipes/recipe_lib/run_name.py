"""The run name that keys a recipe's run directory (checkpoints, logs).

A run directory must identify the run: the same across in-job restarts by
``ft_launcher`` and across requeues of a SLURM job (so a restarted worker resumes
from the run's own checkpoint), and different for every other run (so a run never
resumes from someone else's). Hence ``run_name`` defaults to, in this order:

* ``$SLURM_JOB_ID``: kept by ``scontrol requeue``, the same on every node;
* ``$TORCHELASTIC_RUN_ID``: ``ft_launcher``/``torchrun``'s ``--rdzv-id``, the same for
  every worker of every cycle of the launch (torchrun's unset value ``none`` is ignored);
* otherwise a fresh name for this process (``local-<8 hex digits>``): a plain
  ``python recipes/train.py`` run is a new run unless ``run_name=`` names an old one.

Never a timestamp: two ranks, or a restarted worker, would not agree on it.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from typing import Optional

__all__ = ["RUN_NAME_PATTERN", "check_run_name", "default_run_name"]

#: One directory name: no separators, no leading dot.
RUN_NAME_PATTERN = re.compile(r"[A-Za-z0-9_=+-][A-Za-z0-9._=+-]*")
_LOCAL_RUN_NAME = f"local-{uuid.uuid4().hex[:8]}"


def default_run_name(environ: Optional[Mapping[str, str]] = None) -> str:
    """The run name when ``run_name=`` is not given (see the module docstring)."""
    env = os.environ if environ is None else environ
    for key in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = env.get(key, "")
        if value and value != "none":
            return value
    return _LOCAL_RUN_NAME


def check_run_name(name: str) -> str:
    """Reject a run name that is not one directory name; the error names the key and what is allowed."""
    if not RUN_NAME_PATTERN.fullmatch(name or ""):
        raise ValueError(f"run_name: invalid value {name!r}; allowed: one directory name of letters, digits "
                         "and . _ - = + (not starting with a dot)")
    return name
