"""Run a multi-process job for a test, and make sure nothing it started outlives it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Optional

from launcher_helpers import ProcessTracker

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parents[2]


@dataclasses.dataclass
class JobResult:
    returncode: Optional[int]
    output: str
    timed_out: bool


def run_job(cmd: list[str], env: dict[str, str], timeout: float, log_path: Path) -> JobResult:
    """Run ``cmd`` in its own session; on every path kill what is left and fail on orphans.

    Descendants are sampled while the job runs, so a process that was re-parented to
    init (an orphan) is still noticed at the end.
    """
    tracker = ProcessTracker()
    timed_out = False
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        tracker.add_root(proc.pid)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            leftovers = tracker.finish()
    output = log_path.read_text(encoding="utf-8", errors="replace")
    assert not leftovers, f"processes outlived the job: {leftovers}\n{output[-4000:]}"
    return JobResult(proc.returncode, output, timed_out)


def base_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("FT_", "TORCHELASTIC_", "MASTER_")) or key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            del env[key]
    env["FAULT_TOL_FINISHED_FLAG_FILE"] = str(tmp_path / "finished.flag")
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    return env


def reports(out_dir: Path) -> dict[tuple[int, int], dict]:
    """(rank, cycle) -> the report written by train.py."""
    result = {}
    for path in out_dir.glob("report_r*_c*.json"):
        rank, cycle = path.stem[len("report_r"):].split("_c")
        result[int(rank), int(cycle)] = json.loads(path.read_text())
    return result
