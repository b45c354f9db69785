"""Run a multi-process job for a test, and make sure nothing it started outlives it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

import psutil

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    seen: set[psutil.Process] = set()
    timed_out = False
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None:
                try:
                    seen.update(psutil.Process(proc.pid).children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            leftovers = _reap(seen)
    output = log_path.read_text(encoding="utf-8", errors="replace")
    assert not leftovers, f"processes outlived the job: {leftovers}\n{output[-4000:]}"
    return JobResult(proc.returncode, output, timed_out)


def _reap(seen: set[psutil.Process], grace: float = 15.0) -> list[str]:
    """Wait for the job's descendants to exit; kill and report those still alive after ``grace``."""
    _gone, alive = psutil.wait_procs(list(seen), timeout=grace)
    leftovers = []
    for proc in alive:
        try:
            leftovers.append(f"pid {proc.pid} {' '.join(proc.cmdline())[:200]}")
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return leftovers


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
