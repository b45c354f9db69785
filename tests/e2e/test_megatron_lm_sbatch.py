"""examples/megatron/pretrain_gpt.sbatch, run as SLURM would run it, with Megatron-LM's own FT module.

The training script is the Megatron-LM-shaped ``megatron_lm/pretrain.py`` driven by
``nvrx_client_integration`` (Megatron-LM's ``ft_integration`` call pattern, which imports
``nvidia_resiliency_ext.fault_tolerance``): the sbatch's one ``PYTHONPATH`` line
(``ft_integrations.nvrx_alias``) must make that import resolve to ft-suite with no edit of
the training code. Two "nodes" (SLURM shims), one rank each, tensor-parallel over both.
Rank 1 hangs in step 20 of the first run, after ``step`` was learned at the save of 16:
the hang is caught, the workers restart from iteration 16 and finish, the script exits 0
without a requeue.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers import REPO_ROOT, free_port, python_env
from integration.launcher_helpers import ProcessTracker
from slurm_shims import shims

from ft_core.event_file import read_events

SCRIPT = os.path.join(REPO_ROOT, "examples", "megatron", "pretrain_gpt.sbatch")
PRETRAIN = os.path.join(REPO_ROOT, "tests", "e2e", "megatron_lm", "pretrain.py")


@pytest.mark.timeout(400)
def test_megatron_lm_sbatch_with_the_nvrx_import_alias_recovers_from_a_hang(tmp_path):
    job_dir, requeues = tmp_path / "job", tmp_path / "scontrol.log"
    env = python_env(
        PATH=f"{shims(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="5151",
        SLURM_NNODES="2", SLURM_JOB_NODELIST="localhost", SLURM_SUBMIT_DIR=REPO_ROOT, JOB_DIR=str(job_dir),
        NPROC_PER_NODE="1", MASTER_PORT=str(free_port()), SCONTROL_LOG=str(requeues), PYTHONWARNINGS="ignore",
        PRETRAIN=PRETRAIN, PRETRAIN_FT_INTEGRATION="nvrx-client",
        MODEL_ARGS="--train-iters 30 --save-interval 8 --step-time 0.05 --ft-num-warmup-iters 1 "
                   "--inject-hang-in-step-at-iter 20 --inject-rank 1")
    # The repository is on PYTHONPATH (ft-suite "installed"); the shim must come from the sbatch line.
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET", "SLURM_RESTART_COUNT"):
        env.pop(key, None)
    tracker = ProcessTracker()
    try:
        with open(tmp_path / "job.out", "wb") as out:
            proc = subprocess.Popen(["bash", SCRIPT], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        tracker.add_root(proc.pid)
        try:
            code = proc.wait(timeout=360)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(30)
        output = (tmp_path / "job.out").read_text(errors="replace")
        assert code == 0 and "training finished" in output, output[-6000:]
        assert not requeues.exists(), output[-4000:]
        # Megatron-LM's `from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient` got ours.
        assert output.count("FT: initialized with ft_core.client.RankMonitorClient") == 4, output[-6000:]
        hangs, restarts = [], []
        for node in (0, 1):
            events = read_events(str(job_dir / "logs" / f"ft_events.requeue0.node{node}.jsonl"))[0]
            hangs += [e for e in events if e["event"] == "hang_detected" and e["rank"] == 1]
            restarts += [e["cycle"] for e in events if e["event"] == "restart"]
        # (The iteration is Megatron-LM's global args' curr_iteration, which this stand-in has not.)
        assert [e["section"] for e in hangs] == ["step"], output[-6000:]
        assert set(restarts) == {0}
        assert (job_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "30"
    finally:
        leftovers = tracker.finish()
    assert not leftovers, leftovers
