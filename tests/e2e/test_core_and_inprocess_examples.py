"""examples/core_demo.py (a node monitor without the launcher) and examples/inprocess_restart.py (in-process
restart under plain torchrun) run as their docstrings say, and do what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, python_env


@pytest.mark.timeout(200)
def test_core_demo_catches_the_hung_rank_and_lets_the_other_finish():
    result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "examples", "core_demo.py")],
                            env=python_env(), capture_output=True, text=True, timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "rank 0: training finished" in out and "rank 0: exit code 0" in out, out[-4000:]
    assert "rank 1: training finished" not in out and "(killed by the monitor)" in out
    assert re.search(r"hang: rank 1 in section 'step' at iteration 5, [\d.]+ s > 1.5 s", out), out[-4000:]


@pytest.mark.timeout(300)
def test_inprocess_restart_example_restarts_train_in_the_same_processes_and_finishes(tmp_path):
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
                             os.path.join(REPO_ROOT, "examples", "inprocess_restart.py")],
                            cwd=tmp_path, env=python_env(), capture_output=True, text=True, timeout=280)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "injected fault on rank 1" in out
    started = re.findall(r"\[pid (\d+)\] iteration (\d): rank (\d) of 3", out)
    by_iteration = {it: {rank: pid for pid, i, rank in started if i == it} for it in ("0", "1")}
    assert by_iteration["0"] == by_iteration["1"] and len(by_iteration["0"]) == 3, out[-4000:]  # same processes
    done = re.findall(r"\[pid (\d+)\] done: weights=(\[.*\])", out)
    # 6 steps, each adding the mean of the ranks' gradients (1 + 2 + 3) / 3 = 2: resumed, not restarted from 0.
    assert sorted(pid for pid, _ in done) == sorted(by_iteration["0"].values())
    assert {weights for _, weights in done} == {"[12.0, 12.0, 12.0, 12.0]"}, out[-4000:]
