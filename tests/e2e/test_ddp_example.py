"""examples/ddp_train.py (plain PyTorch DDP with the client) under ft_launcher: the script users copy.

Two gloo ranks learn their section timeouts at the save of step 10; rank 1 then hangs in
step 25 of the first run. The monitor catches it at the learned ``step`` timeout, the
diagnosis names rank 1 (rank 0 only waited in DDP's all-reduce), the launcher restarts
both workers, they resume from the step-20 checkpoint with the timeouts stored in it, and
the job finishes with exit 0 after exactly one restart.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from helpers import REPO_ROOT, python_env
from integration.launcher_helpers import run_job

from ft_core.event_file import read_events

TRAIN = os.path.join(REPO_ROOT, "examples", "ddp_train.py")
HANG_AT, RESUME_AT, STEPS = 25, 20, 40


@pytest.mark.timeout(300)
def test_ddp_example_hang_is_caught_and_the_job_resumes_from_its_checkpoint(tmp_path):
    ckpt, log_dir = tmp_path / "ckpt", tmp_path / "logs"
    command = [
        sys.executable, "-m", "ft_core.launcher", "--nproc-per-node=2", "--max-restarts=2",
        f"--log-dir={log_dir}", "--ft-rank-section-timeouts=setup:600,step:120,checkpointing:120",
        TRAIN, f"--steps={STEPS}", f"--ckpt-dir={ckpt}", "--save-every=10", "--learn-after=10",
        f"--hang-at-step={HANG_AT}",
    ]
    env = python_env()
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET"):
        env.pop(key, None)
    result = run_job(command, env, timeout=240, log_path=tmp_path / "launcher.out")
    assert not result.timed_out and result.returncode == 0, result.output[-6000:]

    events = read_events(str(log_dir / "ft_events.jsonl"))[0]
    hangs = [e for e in events if e["event"] == "hang_detected"]
    assert {(e["section"], e["iteration"]) for e in hangs if e["rank"] == 1} == {("step", HANG_AT)}
    assert [e["culprits"] for e in events if e["event"] == "diagnosis"] == [[1]]
    assert [e["cycle"] for e in events if e["event"] == "restart"] == [0]
    assert result.output.count(f"resumed from step {RESUME_AT}") == 2  # both ranks of the second run
    assert result.output.count(f"training finished at step {STEPS}") == 2

    # The hang was caught by the learned timeout (not the configured 120 s), and the
    # checkpoint the second run resumed from carried that learned value.
    learned = torch.load(ckpt / f"step_{RESUME_AT:07d}.pt", weights_only=True)["ft_state"]["current_timeouts"]
    assert "step" in learned["section"]["calculated_sections"]
    assert {e["timeout"] for e in hangs if e["rank"] == 1} == {learned["section"]["section"]["step"]}
    assert learned["section"]["section"]["step"] < 120
