"""examples/megatron/train.py under ft_launcher: a hang in a checkpoint save is caught, the job resumes and ends.

Two gloo ranks train a tensor-parallel megatron-core MLP with dist_checkpointing saves
every 4 iterations. Timeouts are learned in the first cycle (after the first save); the
save of iteration 12 hangs on rank 0 and is caught by the learned ``checkpointing``
timeout; the restarted workers resume from iteration 8 with the timeouts stored in it.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from helpers import REPO_ROOT, python_env
from integration.launcher_helpers import run_job

from ft_core.events import read_events
from ft_core.timeouts import describe_timeouts, timeouts_from_state_dict

TRAIN = os.path.join(REPO_ROOT, "examples", "megatron", "train.py")
HANG_AT, RESUME_AT, TRAIN_ITERS = 12, 8, 20


@pytest.mark.timeout(420)
def test_hang_in_checkpoint_save_is_caught_and_the_job_resumes_with_learned_timeouts(tmp_path):
    save = tmp_path / "ckpt"
    log_dir = tmp_path / "logs"
    command = [
        "-m", "ft_core.launcher", "--nproc-per-node=2", "--max-restarts=2", f"--log-dir={log_dir}",
        "--monitor-interval=0.1", "--workers-stop-timeout=10", "--ft-stack-dump-timeout=1",
        # Imports of torch + megatron take long on a busy machine: "setup" gets room, and a
        # large safety factor keeps learned timeouts of these millisecond steps above scheduling noise.
        "--ft-rank-section-timeouts=setup:600,step:120,eval:120,checkpointing:120",
        "--ft-safety-factor=50",
        # Megatron's --ft-num-warmup-iters=2 is the warm-up here: "step" must be learned by the save
        # of iteration 8, so the monitor adds none of its own (NVRx's default, 5, would postpone it).
        "--ft-num-warmup-iterations=0",
        f"--ft-checkpoint-iteration-file={save / 'latest_checkpointed_iteration.txt'}",
        TRAIN, "--enable-ft", "--calc-ft-timeouts", "--ft-num-warmup-iters=2", "--ft-calc-timeouts-after-iters=2",
        f"--train-iters={TRAIN_ITERS}", f"--save={save}", f"--load={save}", "--save-interval=4",
        "--eval-interval=8", "--step-time=0.05", "--log-interval=4",
        f"--inject-hang-in-checkpoint-at-iter={HANG_AT}",
    ]
    env = python_env(FAULT_TOL_FINISHED_FLAG_FILE=str(tmp_path / "finished"))
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET"):
        env.pop(key, None)
    result = run_job([sys.executable, *command], env, timeout=360, log_path=tmp_path / "launcher.out")
    assert not result.timed_out, result.output[-6000:]
    exit_code, output = result.returncode, result.output
    assert exit_code == 0, output[-6000:]

    events = read_events(str(log_dir / "ft_events.jsonl"))[0]
    hangs = [e for e in events if e["event"] == "hang_detected"]
    assert hangs, output[-6000:]
    assert {(e["reason"], e["section"]) for e in hangs} == {("section", "checkpointing")}
    assert [e["cycle"] for e in events if e["event"] == "restart"] == [0]
    connected = [e["restart_count"] for e in events if e["event"] == "rank_connected"]
    assert sorted(connected) == [0, 0, 1, 1]

    # The restarted workers resumed from the last checkpoint before the hang and finished.
    assert f"resumed from iteration {RESUME_AT}" in output
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == str(TRAIN_ITERS)
    assert (tmp_path / "finished").exists()

    # Timeouts learned in the first cycle were saved in the checkpoint, caught the hang,
    # and were restored from that checkpoint by the second cycle.
    import torch

    common = torch.load(save / f"iter_{RESUME_AT:07d}" / "common.pt", weights_only=True)
    assert common["iteration"] == RESUME_AT
    in_checkpoint = common["ft_state"]["current_timeouts"]
    learned = in_checkpoint["section"]
    assert {"step", "checkpointing"} <= set(learned["calculated_sections"])
    assert learned["section"]["checkpointing"] < 120.0  # learned, not the configured value
    assert {e["timeout"] for e in hangs} == {learned["section"]["checkpointing"]}
    restored = re.findall(r"timeouts restored from the checkpoint: (.*\(\* learned\))", output)
    assert restored == [describe_timeouts(*timeouts_from_state_dict({"current_timeouts": in_checkpoint}))]

    # At the end, ft_state.json holds the final values, merged with the restored ones by NVRx's
    # exponential average: they may go down (faster steps), but never below what a step needed
    # (the merge's floor), which the safety factor of 50 keeps far above the 0.05 s steps.
    final = json.loads((save / "ft_state.json").read_text())["current_timeouts"]["section"]
    assert {"setup", "step", "eval", "checkpointing"} <= set(final["calculated_sections"])
    assert "setup" not in learned["calculated_sections"]  # setup is learned on a resume only
    assert final["section"]["step"] >= 50 * 0.05
