"""A short run of ``benchmarks/goodput.py``: both launchers, one crash, the JSON's fixed keys, nothing left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest
from helpers import REPO_ROOT, python_env

pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(600)]

RUN_KEYS = {"wall_s", "useful_steps", "step_s", "goodput", "stopped_cleanly", "final_step", "restarts", "startup_s",
            "spares_started", "exit_code", "faults", "faults_not_applied", "fault_cost_s", "load_avg_1m"}
FAULT_KEYS = {"id", "kind", "at_s", "delay_s", "rank", "step", "time_s", "recovered", "to_first_step_s",
              "recomputed_steps", "resumed_from", "cost_s"}


def test_a_short_run_applies_the_schedule_to_both_launchers_and_prints_every_key(tmp_path):
    # Seed 5: the one fault of a 20 s run is a crash, which both launchers recover from.
    cmd = [sys.executable, os.path.join(REPO_ROOT, "benchmarks", "goodput.py"), "--duration", "20",
           "--fault-interval", "20", "--seed", "5", "--workdir", str(tmp_path)]
    proc = subprocess.Popen(cmd, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=540)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    result = json.loads(out)
    (scheduled,) = result["schedule"]
    assert scheduled["kind"] == "crash"
    for name in ("ft_launcher", "torchrun"):
        run = result[name]
        assert RUN_KEYS <= set(run), (name, sorted(run))
        (fault,) = run["faults"]
        assert FAULT_KEYS <= set(fault), (name, sorted(fault))
        assert fault["kind"] == "crash", (name, fault)
        assert 0 <= run["goodput"] <= 1, (name, run)
    # What torchrun does after the crash is what is measured (on this machine its restart with a spare waiting can
    # time out in its own rendezvous); ft_launcher's contract: the crash is recovered and the job stops at the end.
    ft = result["ft_launcher"]
    assert ft["faults"][0]["recovered"] and ft["restarts"] == 1, ft
    assert ft["stopped_cleanly"] and ft["exit_code"] == 0 and ft["useful_steps"] > 0, ft
    # Nothing of either job survives the benchmark: every worker that ever recorded itself is gone.
    for name in ("ft_launcher", "torchrun"):
        with open(tmp_path / name / "records.jsonl", encoding="utf-8") as handle:
            pids = {json.loads(line)["pid"] for line in handle if line.strip()}
        assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
