"""The Lightning test scripts: where they are, the environment they run in, the reports they write.

Jobs are run with ``launcher_helpers.run_job`` (no process outlives them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

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
