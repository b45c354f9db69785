"""Stand-ins for SLURM's commands, so a batch script runs on this machine as SLURM would run it.

``srun`` starts one copy of its command per node (``SLURM_NNODES``, with
``SLURM_NODEID``/``SLURM_PROCID``) and forwards signals to them, as srun does;
``scontrol show hostnames`` prints the node list, ``scontrol requeue`` is recorded in
``$SCONTROL_LOG``; ``ft_launcher`` is ``python -m ft_core.launcher`` and ``python`` this
interpreter. The launchers and the training they run are real.
"""

from __future__ import annotations

import os
import sys

SRUN = f"""#!{sys.executable}
import os, signal, subprocess, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args.pop(0)
procs = [subprocess.Popen(args, env=dict(os.environ, SLURM_NODEID=str(i), SLURM_PROCID=str(i), SLURM_LOCALID="0",
                                         SLURM_STEP_NUM_NODES=os.environ["SLURM_NNODES"]))
         for i in range(int(os.environ["SLURM_NNODES"]))]
def forward(sig, _frame):
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
codes = [proc.wait() for proc in procs]
sys.exit(max(code if code >= 0 else 128 - code for code in codes))
"""
SCONTROL = """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then echo "$3" | tr ',' '\\n'; else echo "$*" >> "$SCONTROL_LOG"; fi
"""
FT_LAUNCHER = f"""#!/bin/bash
exec {sys.executable} -m ft_core.launcher "$@"
"""
PYTHON = f"""#!/bin/bash
exec {sys.executable} "$@"
"""


def shims(directory) -> str:
    """Write the shims into ``directory`` (created); returns it, to put first on ``PATH``."""
    os.makedirs(directory)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("ft_launcher", FT_LAUNCHER), ("python", PYTHON)):
        path = os.path.join(directory, name)
        with open(path, "w") as handle:
            handle.write(text)
        os.chmod(path, 0o755)
    return str(directory)
