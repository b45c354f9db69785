"""examples/megatron/train.py under ft_launcher: a hang in a checkpoint save is caught, bad checkpoints are skipped.

Two gloo ranks train a tensor-parallel megatron-core MLP with dist_checkpointing saves
every 4 iterations. Timeouts are learned in the first cycle (after the first save); the
save of iteration 12 hangs on rank 0 and is caught by the learned ``checkpointing``
timeout; the restarted workers resume from iteration 8 with the timeouts stored in it.
Beside it (issue 25): torn, NaN and NaN-loss ``iter_N`` checkpoints are skipped, and a
deterministic fault stops the job with 93 after two cycles.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from helpers import REPO_ROOT, python_env
from integration.launcher_helpers import run_job

from ft_core.event_file import read_events
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
    # The sections as the checkpoint holds them (the heartbeat part is the monitor's, not checkpointed here).
    sections = describe_timeouts(*timeouts_from_state_dict({"current_timeouts": in_checkpoint})).split(", heartbeat")[0]
    assert len(restored) == 1 and restored[0].startswith(sections + ", heartbeat"), restored

    # At the end, ft_state.json holds the final values, merged with the restored ones by NVRx's
    # exponential average: they may go down (faster steps), but never below what a step needed
    # (the merge's floor), which the safety factor of 50 keeps far above the 0.05 s steps.
    final = json.loads((save / "ft_state.json").read_text())["current_timeouts"]["section"]
    assert {"setup", "step", "eval", "checkpointing"} <= set(final["calculated_sections"])
    assert "setup" not in learned["calculated_sections"]  # setup is learned on a resume only
    assert final["section"]["step"] >= 50 * 0.05


# -- bad checkpoints and deterministic faults (issue 25) -------------------------------------------------
def run_example(tmp_path, *script_args: str, max_restarts: int = 3):
    """examples/megatron/train.py, 2 ranks under ft_launcher; ``(result, events, save dir)``."""
    save, log_dir = tmp_path / "ckpt", tmp_path / "logs"
    command = ["-m", "ft_core.launcher", "--nproc-per-node=2", f"--max-restarts={max_restarts}",
               f"--log-dir={log_dir}", "--monitor-interval=0.1", "--workers-stop-timeout=10",
               "--ft-rank-section-timeouts=setup:600,step:120,eval:120,checkpointing:120",
               "--ft-prewarm-modules=torch,megatron.core",  # each cycle's workers start with it imported
               TRAIN, "--enable-ft", f"--save={save}", f"--load={save}", "--log-interval=4", *script_args]
    env = python_env()
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET"):
        env.pop(key, None)
    result = run_job([sys.executable, *command], env, timeout=300, log_path=tmp_path / "launcher.out")
    assert not result.timed_out, result.output[-6000:]
    return result, read_events(str(log_dir / "ft_events.jsonl"))[0], save


def of(events, name):
    return [e for e in events if e["event"] == name]


@pytest.mark.timeout(360)
def test_torn_nan_and_nan_loss_iter_dirs_are_skipped_each_for_at_most_one_restart(tmp_path):
    # ~45 s (3 cycles, most of it start-up). Cycle 0 saves 4; 8 with weights x 1e30 (finite: it verifies and
    # loads, but the loss is infinite); 12 with NaN weights in every rank's shard (NVRx issue 349); 16, of
    # which a file is cut in half once its manifest is written (a torn file). Rank 0 crashes at 17.
    # Cycle 1: the verified load rejects 16 (manifest: size) and 12 (finite check) on both ranks at no
    # restart's cost and agrees on 8; its first step's loss is infinite: on_training_step_end(loss=...) raises
    # NonFiniteLossError, abort() reports it, the launcher marks iter_8 bad (the one extra restart).
    # Cycle 2 skips 16, 12 and 8 and finishes from 4.
    result, events, save = run_example(tmp_path, "--train-iters=20", "--save-interval=4",
                                       "--inject-huge-weights-at-iter=8", "--inject-nan-weights-at-iter=12",
                                       "--inject-truncate-checkpoint-at-iter=16", "--inject-crash-at-iter=17")
    assert result.returncode == 0, result.output[-6000:]
    assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1, 2]
    iters = {n: str(save / f"iter_{n:07d}") for n in (4, 8, 12, 16, 20)}
    prints = of(events, "fault_fingerprint")
    assert [(p["kind"], p.get("resumed_from"), p.get("resumed_step")) for p in prints] == \
        [("exception", None, None), ("nonfinite_loss", iters[8], 8)]
    (marked,) = of(events, "checkpoint_marked_bad")
    assert marked["checkpoint"] == iters[8] and "non-finite loss 0 step(s) after resuming" in marked["reason"]
    rejected = {(e["cycle"], e["rank"], e["checkpoint"]): e["reason"] for e in of(events, "checkpoint_rejected")}
    assert rejected.keys() == {(cycle, rank, iters[n]) for rank in (0, 1) for cycle, n in
                               ((1, 16), (1, 12), (2, 16), (2, 12), (2, 8))}
    for cycle, rank in ((1, 0), (1, 1), (2, 0), (2, 1)):
        assert "bytes, the manifest says" in rejected[(cycle, rank, iters[16])]
        assert rejected[(cycle, rank, iters[12])].startswith("non-finite values in ")
    assert all(rejected[(2, rank, iters[8])].startswith("marked bad: ") for rank in (0, 1))
    loaded = {(e["cycle"], e["rank"]): (e["checkpoint"], e["step"]) for e in of(events, "checkpoint_loaded")}
    assert loaded == {(1, 0): (iters[8], 8), (1, 1): (iters[8], 8), (2, 0): (iters[4], 4), (2, 1): (iters[4], 4)}
    assert "resumed from iteration 4" in result.output
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "20"
    from ft_core.checkpoint_manifest import verify

    # Saved again from 4 in cycle 2, with new manifests; iter_8's old mark does not condemn its new content.
    assert [verify(iters[n]) for n in (8, 12, 16, 20)] == [None] * 4


@pytest.mark.timeout(360)
def test_a_deterministic_value_error_at_iteration_30_on_rank_1_stops_after_two_cycles_with_93(tmp_path):
    # ~20 s. A save every 16 iterations: cycle 1 resumes from 16 and fails at 30, 14 steps after the resume.
    # Within suspect_checkpoint_steps (10) of a resume the repeated fault would count against the checkpoint
    # first (marked bad, one more restart from an older one); beyond it, with no new checkpoint in between,
    # it is the same deterministic fault twice: stop with the do-not-requeue code, not 5 more restarts.
    result, events, _save = run_example(tmp_path, "--train-iters=40", "--save-interval=16",
                                        "--inject-value-error-at-iter=30", "--inject-rank=1", max_restarts=6)
    assert result.returncode == 93, result.output[-6000:]
    assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1]
    prints = of(events, "fault_fingerprint")
    assert [(p["kind"], p["culprits"], p["iteration"], p["exception_type"]) for p in prints] == \
        [("exception", [1], 30, "ValueError")] * 2
    assert prints[1]["resumed_step"] == 16 and of(events, "checkpoint_marked_bad") == []
    (end,) = of(events, "exit")
    assert end["reason"].startswith("ValueError at train.py:") and "on rank 1 at iteration 30" in end["reason"]
