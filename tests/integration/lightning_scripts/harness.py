"""The Lightning test scripts: where they are, the environment they run in, the reports they write.

Jobs are run with ``launcher_helpers.run_job`` (no process outlives them)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from helpers import free_port
from launcher_helpers import run_job

from ft_core.event_file import read_events

SCRIPTS = Path(__file__).resolve().parent


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


# -- a 2-rank job of train.py under ft_launcher ------------------------------------------------------
MAX_STEPS = 8
#: Launch-time settings; safety factor 50 keeps learned timeouts far from a busy machine's jitter.
FT_FLAGS = {
    "heartbeats": ["--ft-initial-rank-heartbeat-timeout=120", "--ft-rank-heartbeat-timeout=60"],
    "sections": ["--ft-rank-section-timeouts=setup:120,step:60,checkpointing:60",
                 "--ft-rank-out-of-section-timeout=120", "--ft-rank-heartbeat-timeout=none",
                 "--ft-initial-rank-heartbeat-timeout=none",
                 # Steps are learned after 3 of them (--calc-steps): none may be a warm-up step.
                 "--ft-num-warmup-iterations=0"],
}


def launch(tmp_path: Path, mode: str, fault: dict, *extra: str, max_restarts: int = 2,
           ft_flags: tuple[str, ...] = ("--ft-safety-factor=50",), launcher_flags: tuple[str, ...] = ()):
    return launch_script(tmp_path, "train.py", f"--mode={mode}", f"--max-steps={MAX_STEPS}", "--every-n-steps=2",
                         f"--ckpt-dir={tmp_path / 'ckpt'}", f"--out-dir={tmp_path}", f"--fault={json.dumps(fault)}",
                         *extra, max_restarts=max_restarts, launcher_flags=(*ft_flags, *FT_FLAGS[mode], *launcher_flags))


def launch_script(tmp_path: Path, script: str, *args: str, max_restarts: int = 2,
                  launcher_flags: tuple[str, ...] = FT_FLAGS["heartbeats"]):
    """A 2-rank job of ``SCRIPTS/script`` under ft_launcher: (result, events)."""
    events_file = tmp_path / "ft_events.jsonl"
    cmd = [sys.executable, "-m", "ft_core.launcher", "--nproc-per-node=2", f"--max-restarts={max_restarts}",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--ft-events-file={events_file}",
           *launcher_flags, str(SCRIPTS / script), *args]
    result = run_job(cmd, base_env(tmp_path), timeout=400, log_path=tmp_path / "launcher.log")
    assert not result.timed_out, result.output[-6000:]
    return result, read_events(str(events_file))[0]


def of(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]
