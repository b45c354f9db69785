"""Megatron-LM's ``ft_integration`` call sites on megatron-core under ft_launcher (2 gloo ranks).

``megatron_lm/pretrain.py`` is a pretrain()/train()/evaluate()/save_checkpoint() loop that calls
``ft_integrations.megatron.ft_integration`` where Megatron-LM calls its own module. Timeouts
are learned as Megatron-LM learns them (after each synchronous save, ``step`` after 16
iterations, ``setup`` after a persistent load, out-of-section at shutdown), with eval steps
inside ``step``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
from helpers import REPO_ROOT, python_env
from integration.launcher_helpers import run_job

from ft_core.event_file import read_events

PRETRAIN = os.path.join(REPO_ROOT, "tests", "e2e", "megatron_lm", "pretrain.py")


def _launch(tmp_path: Any, ft_flags: list[str], script_flags: list[str], **env_vars: str) -> tuple[int, str, list]:
    save, log_dir = tmp_path / "ckpt", tmp_path / "logs"
    command = [
        "-m", "ft_core.launcher", "--nproc-per-node=2", "--max-restarts=1", f"--log-dir={log_dir}",
        "--monitor-interval=0.1", "--workers-stop-timeout=10", "--ft-stack-dump-timeout=1",
        # Megatron-LM's --ft-num-warmup-iters is the warm-up: the monitor adds none of its own.
        "--ft-num-warmup-iterations=0", *ft_flags,
        PRETRAIN, "--enable-ft-package", "--ft-num-warmup-iters=1", f"--save={save}", f"--load={save}",
        "--step-time=0.05", "--eval-iters=2", *script_flags,
    ]
    env = python_env(**env_vars)
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET"):
        env.pop(key, None)
    result = run_job([sys.executable, *command], env, timeout=240, log_path=tmp_path / "launcher.out")
    assert not result.timed_out, result.output[-6000:]
    exit_code, output = result.returncode, result.output
    return exit_code, output, read_events(str(log_dir / "ft_events.jsonl"))[0]


@pytest.mark.timeout(300)
def test_learned_timeouts_catch_a_hang_and_the_resumed_healthy_run_is_not_killed(tmp_path):
    # Cycle 0 learns step and checkpointing at the save of iteration 16 (16 iterations seen), then
    # hangs in step 18: only the learned step timeout (about a second; configured 120 s) catches it
    # in time. Cycle 1 loads checkpoint 16 and ft_state.json, runs 20 healthy steps with evaluations
    # under those timeouts, and learns setup and out-of-section at shutdown.
    exit_code, output, events = _launch(
        tmp_path,
        ["--ft-rank-section-timeouts=setup:600,step:120,checkpointing:120",
         "--ft-rank-out-of-section-timeout=120", "--ft-safety-factor=30"],
        ["--calc-ft-timeouts", "--train-iters=36", "--save-interval=8", "--eval-interval=4",
         "--inject-hang-in-step-at-iter=18"])
    assert exit_code == 0, output[-6000:]
    hangs = [e for e in events if e["event"] == "hang_detected"]
    restarts = [e for e in events if e["event"] == "restart"]
    assert [e["cycle"] for e in restarts] == [0], output[-6000:]
    # Caught in a step by the learned timeout (the other rank, blocked in the same step's
    # tensor-parallel collective, may be reported too), with the iteration from Megatron-LM's global
    # args, which initialize_megatron() set after ft_integration.setup().
    assert hangs and {(e["reason"], e["section"]) for e in hangs} == {("section", "step")}, output[-6000:]
    assert {e["iteration"] for e in hangs} == {18}, hangs
    assert all(e["timeout"] < 60 for e in hangs), hangs
    # The resumed run, with evaluations inside "step" under the learned timeouts, is not killed.
    assert all(e["time"] < restarts[0]["time"] for e in hangs), hangs
    assert "resumed from iteration 16" in output
    state = json.loads((tmp_path / "ckpt" / "ft_state.json").read_text())["current_timeouts"]["section"]
    assert set(state["calculated_sections"]) == {"setup", "step", "checkpointing"}, state
    assert state["is_out_of_section_calculated"], state
    assert state["section"]["step"] < 60, state  # learned from the steps, not the configured 120


@pytest.mark.timeout(300)
def test_ft_sim_fault_desc_drill_hangs_a_rank_which_is_caught_and_restarted(tmp_path):
    exit_code, output, events = _launch(
        tmp_path, ["--ft-rank-section-timeouts=setup:600,step:3,checkpointing:120"],
        ["--train-iters=60", "--save-interval=10", "--eval-interval=5"],
        FT_SIM_FAULT_DESC="rank_hung;1;1.0")
    assert exit_code == 0, output[-6000:]
    hangs = [e for e in events if e["event"] == "hang_detected"]
    # The drill stops rank 1 at a random point, possibly between steps (no out-of-section timeout
    # here); rank 0 then expires in its step, blocked in the collective. Whoever expires, the
    # diagnosis names the rank the drill hung.
    assert hangs and {e["reason"] for e in hangs} == {"section"}, output[-6000:]
    assert all(isinstance(e["iteration"], int) for e in hangs), hangs  # Megatron-LM's args, set after setup()
    assert [(d["culprits"], d["waiting"]) for d in events if d["event"] == "diagnosis"] == [([1], [0])], output[-6000:]
    assert [e["cycle"] for e in events if e["event"] == "restart"] == [0]
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "60"
