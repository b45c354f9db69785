"""examples/slurm/lightning_autoresume.sbatch, run as SLURM would run it, on this machine.

``srun``, ``scontrol`` and ``ft_launcher`` are shims on PATH (there is no SLURM here; see slurm_shims.py):
the launchers and the training are real.
"""

from __future__ import annotations

import os
import signal
import subprocess

import psutil
import pytest
from helpers import REPO_ROOT, free_port, python_env, wait_for
from integration.launcher_helpers import ProcessTracker
from slurm_shims import shims

from ft_core.launcher.observability.report import build_report, find_event_files, load_records
from ft_core.monitor import read_events

SCRIPT = os.path.join(REPO_ROOT, "examples", "slurm", "lightning_autoresume.sbatch")

def run_job(env: dict[str, str], tracker: ProcessTracker, output, preempt_when=None) -> int:
    """Run the batch script once; with ``preempt_when``, SIGTERM its launchers once that file exists."""
    with open(output, "wb") as out:
        proc = subprocess.Popen(["bash", SCRIPT], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    tracker.add_root(proc.pid)
    try:
        if preempt_when is not None:
            wait_for(lambda: os.path.exists(preempt_when) or proc.poll() is not None, 300, f"{preempt_when}")
            assert proc.poll() is None, open(output, errors="replace").read()[-4000:]
            # The launchers themselves (``-m ft_core.launcher``), not their pre-warmed worker factories.
            launchers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                         if "ft_core.launcher" in p.cmdline()]
            assert len(launchers) == 2
            for launcher in launchers:  # what #SBATCH --signal=TERM@120 does: signal the job step's tasks
                launcher.send_signal(signal.SIGTERM)
        return proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.mark.timeout(600)
def test_sbatch_requeues_a_preempted_job_and_stops_once_training_is_finished(tmp_path):
    job_dir = tmp_path / "job"
    requeues = tmp_path / "scontrol.log"
    env = python_env(PATH=f"{shims(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="4242",
                     SLURM_NNODES="2", SLURM_JOB_NODELIST="localhost", SLURM_SUBMIT_DIR=REPO_ROOT,
                     SLURM_JOB_NAME="ft-lightning", JOB_DIR=str(job_dir), NPROC_PER_NODE="1",
                     MASTER_PORT=str(free_port()), SCONTROL_LOG=str(requeues), PYTHONWARNINGS="ignore")
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET", "SLURM_RESTART_COUNT"):
        env.pop(key, None)
    tracker = ProcessTracker()
    last = job_dir / "checkpoints" / "last.ckpt"
    try:
        # First run: preempted (SIGTERM to the launchers) after its first checkpoint.
        run_job(env, tracker, tmp_path / "run0.out", preempt_when=last)
        out = (tmp_path / "run0.out").read_text(errors="replace")
        assert requeues.read_text().split("\n")[0] == "requeue 4242", out[-4000:]
        for node in (0, 1):
            events = read_events(str(job_dir / "logs" / f"ft_events.requeue0.node{node}.jsonl"))[0]
            started = [e for e in events if e["event"] == "launcher_started"]
            assert started[0]["run_id"] == "4242.0"  # --rdzv-id: SLURM_JOB_ID, requeue 0 (fresh state per launch)
            assert [e["exit_code"] for e in events if e["event"] == "exit"] == [128 + signal.SIGTERM]
        assert not (job_dir / "finished.flag").exists()

        # The requeued run (SLURM_RESTART_COUNT=1) resumes from the checkpoint and finishes.
        import torch

        step = torch.load(last, weights_only=False, map_location="cpu")["global_step"]
        env.update(SLURM_RESTART_COUNT="1", MAX_STEPS=str(step + 10))
        assert run_job(env, tracker, tmp_path / "run1.out") == 0
        out = (tmp_path / "run1.out").read_text(errors="replace")
        assert "training finished" in out and (job_dir / "finished.flag").exists(), out[-4000:]
        assert requeues.read_text().count("requeue") == 1
        assert "Restoring states from the checkpoint" in out
        # The job's log directory kept both runs: the report sees two attempts of one run.
        files = find_event_files([str(job_dir / "logs")])
        assert len(files) == 4
        report = build_report(load_records(files))
        assert report.attempts == 2 and report.run_ids == ["4242.0", "4242.1"]
        assert "goodput report: 4 event log(s), 2 attempt(s)" in out
    finally:
        leftovers = tracker.finish()
    assert not leftovers, leftovers
