"""Rendezvous settings ``ft_launcher`` derives from SLURM, so ``srun ft_launcher ...`` needs no ``--rdzv-*``.

Under SLURM (``SLURM_JOB_ID`` set), what torchrun leaves to the user is filled in,
never what the user gave:

* ``--nnodes`` not given: the nodes of the ``srun`` step (``$SLURM_STEP_NUM_NODES``),
  so ``srun ft_launcher ...`` on N nodes is one N-node job, not N one-node jobs
  sharing a run directory (see :func:`derive_nnodes`);
* ``--rdzv-id`` (torchrun's default ``none``) becomes ``$SLURM_JOB_ID.$SLURM_RESTART_COUNT``
  (``.$SLURM_STEP_ID`` added inside an ``srun`` step): the same on every node of one launch,
  new for every requeue and every step. A run id keeps its state in a store that outlives
  the launchers (etcd: torch's closed rendezvous, the restart budget, the no-progress count,
  the job-wide stop), so a requeued job must not inherit it; what names the job's run
  directory stays ``$SLURM_JOB_ID`` (:func:`launch_rdzv_id`);
* for a multi-node job without ``--rdzv-endpoint``, the rendezvous is c10d on the
  job's first node (``scontrol show hostnames $SLURM_JOB_NODELIST | head -n1``), port
  ``$MASTER_PORT`` when set, else torch's c10d port 29400 — unless the static
  rendezvous was chosen explicitly with ``--master-addr``.

Called after torchrun's own defaults: a single-node run without ``--rdzv-*`` keeps
its private c10d rendezvous with a fresh id.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Optional

from torch.distributed.run import parse_min_max_nnodes

from ft_core.utils.validation import ValidationError, int_in_range

__all__ = ["apply_slurm_defaults", "derive_nnodes", "first_host", "job_id", "launch_rdzv_id"]

JOB_ID_ENV = "SLURM_JOB_ID"
RESTART_COUNT_ENV = "SLURM_RESTART_COUNT"
STEP_ID_ENV = "SLURM_STEP_ID"
#: The nodes of the current ``srun`` step (set by srun only: not in a batch script itself).
STEP_NODES_ENV = "SLURM_STEP_NUM_NODES"

#: torchrun's ``--nnodes`` default, for a launcher whose ``--nnodes`` was not given and is not derived.
TORCHRUN_NNODES = "1:1"
NODELIST_ENVS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
#: torchrun's default for ``--rdzv-id`` and ``--master-addr``: "not given".
_UNSET_RDZV_ID = "none"
_DEFAULT_MASTER_ADDR = "127.0.0.1"
#: torch's c10d rendezvous port when an endpoint names none.
DEFAULT_C10D_PORT = 29400


def derive_nnodes(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """``--nnodes`` from the ``srun`` step when it was not given (None); returns what was set.

    Without it, ``srun --nodes=4 ft_launcher ...`` starts four one-node jobs that share
    one run id and one run directory, each training alone. Otherwise an absent
    ``--nnodes`` is torchrun's ``1:1``. Call before torchrun's rendezvous defaults,
    which depend on the number of nodes.

    Raises:
        ft_core.utils.validation.ValidationError: ``$SLURM_STEP_NUM_NODES`` is not a positive integer.
    """
    env = os.environ if environ is None else environ
    if args.nnodes is not None:
        return []
    args.nnodes = TORCHRUN_NNODES
    step_nodes = env.get(STEP_NODES_ENV)
    if not env.get(JOB_ID_ENV) or not step_nodes:
        return []
    nodes = int_in_range(STEP_NODES_ENV, step_nodes, 1, None, coerce=True)
    if nodes == 1:
        return []
    args.nnodes = str(nodes)
    return [f"--nnodes={nodes}"]


def apply_slurm_defaults(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """Fill in the rendezvous settings of ``args`` from SLURM's environment; returns what was set.

    Raises:
        ft_core.utils.validation.ValidationError: naming the environment variable that is missing or invalid.
    """
    env = os.environ if environ is None else environ
    job_id = env.get(JOB_ID_ENV)
    if not job_id:
        return []
    derived = []
    if args.rdzv_id == _UNSET_RDZV_ID:
        args.rdzv_id = launch_rdzv_id(env)
        derived.append(f"--rdzv-id={args.rdzv_id}")
    _, max_nodes = parse_min_max_nnodes(args.nnodes)
    static_chosen = args.rdzv_backend == "static" and args.master_addr != _DEFAULT_MASTER_ADDR
    if max_nodes > 1 and not args.rdzv_endpoint and not args.standalone and not static_chosen:
        nodelist = next((env[name] for name in NODELIST_ENVS if env.get(name)), None)
        if nodelist is None:
            raise ValidationError(NODELIST_ENVS[0], None, "SLURM's node list, or give --rdzv-endpoint",
                                  problem=f"{JOB_ID_ENV} is set but {NODELIST_ENVS[0]} is not")
        port = int_in_range("MASTER_PORT", env.get("MASTER_PORT", str(DEFAULT_C10D_PORT)), 1, 65535, coerce=True)
        args.rdzv_backend = "c10d" if args.rdzv_backend == "static" else args.rdzv_backend
        args.rdzv_endpoint = f"{first_host(nodelist)}:{port}"
        derived += [f"--rdzv-backend={args.rdzv_backend}", f"--rdzv-endpoint={args.rdzv_endpoint}"]
    return derived


def launch_rdzv_id(env: Mapping[str, str]) -> str:
    """The run id of this launch of a SLURM job: ``<job id>.<requeue number>[.<step id>]``.

    The same on every node of one ``srun`` (they share all three), different for each
    requeue (``SLURM_RESTART_COUNT``, unset in the first run) and each step of the allocation.
    """
    parts = [env[JOB_ID_ENV], env.get(RESTART_COUNT_ENV) or "0"]
    step = env.get(STEP_ID_ENV)
    if step:
        parts.append(step)
    return ".".join(parts)


def job_id(run_id: str, env: Optional[Mapping[str, str]] = None) -> str:
    """The id that names the job across its requeues: ``$SLURM_JOB_ID`` under SLURM, else ``run_id``.

    A launch's run id changes with every requeue (:func:`launch_rdzv_id`); what must
    not change with it (the metrics' ``run_id`` label, so a requeue continues the same
    series) uses this.
    """
    env = os.environ if env is None else env
    return env.get(JOB_ID_ENV) or run_id


def first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist (``node[07-09,12],gpu3`` -> ``node07``).

    ``scontrol show hostnames`` is the authority when it is installed; the expression
    is expanded here otherwise (only the first host is needed).
    """
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                                 timeout=30, check=True).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass  # fall back to our own expansion
    depth, first = 0, nodelist
    for index, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            first = nodelist[:index]
            break
    # Each bracketed range list contributes its first number, zero padding kept.
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first.strip())
    if not host or "[" in host or "]" in host:
        raise ValueError(f"cannot read the first host of SLURM nodelist {nodelist!r}")
    return host
