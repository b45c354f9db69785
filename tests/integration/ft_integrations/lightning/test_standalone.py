"""Not launched by ft_launcher: under plain ``torchrun`` the callback's own node monitor kills a hung rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import free_port  # noqa: E402
from launcher_helpers import run_job  # noqa: E402
from lightning_scripts.harness import SCRIPTS, base_env, reports  # noqa: E402

from ft_core.event_file import read_events  # noqa: E402

CONFIG = {"rank_section_timeouts": {"setup": 120, "step": 5, "checkpointing": 60},
          "rank_out_of_section_timeout": 120, "initial_rank_heartbeat_timeout": None,
          "rank_heartbeat_timeout": None}  # the default warm-up: rank 1 hangs past it, in its 7th step


@pytest.mark.timeout(300)
def test_standalone_monitor_under_torchrun_kills_hung_rank(tmp_path, runtime_dir):
    env = base_env(tmp_path)
    env["XDG_RUNTIME_DIR"] = runtime_dir  # the monitor's private directory goes there
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=0",
           f"--master-port={free_port()}", str(SCRIPTS / "train.py"), "--mode=sections", "--max-steps=10",
           "--standalone=monitor", "--no-calculate-timeouts", f"--config-json={json.dumps(CONFIG)}", "--fault",
           json.dumps({"kind": "hang_step", "rank": 1, "step": 6}), f"--ckpt-dir={tmp_path / 'ckpt'}",
           f"--out-dir={tmp_path}"]
    result = run_job(cmd, env, timeout=240, log_path=tmp_path / "torchrun.log")
    assert not result.timed_out, result.output[-6000:]
    assert result.returncode != 0  # torchrun cannot restart: the job fails instead of hanging
    assert "restarts need ft_launcher" in result.output

    [events_file] = Path(runtime_dir).glob("ft-*/standalone-*/monitor_events.jsonl")
    events = read_events(str(events_file))[0]
    # Rank 1 hangs and rank 0 waits for it in the gradient all-reduce: both miss the step deadline
    # at about the same time. The monitor lives in local rank 0's process tree, so it may be gone
    # before it handles rank 1; torchrun then stops rank 1 because rank 0 failed.
    # (Killing local rank 0 also ends its monitor, possibly before it logs ``rank_terminated``.)
    hangs = [e for e in events if e["event"] == "hang_detected"]
    assert hangs and all((h["reason"], h["section"], h["timeout"]) == ("section", "step", 5.0) for h in hangs)
    assert all("end_step" not in r for r in reports(tmp_path).values())
    assert not (tmp_path / "finished.flag").exists()
