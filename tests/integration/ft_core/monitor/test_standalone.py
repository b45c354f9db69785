"""The standalone node monitor without Lightning: plain torch and the Megatron hooks under plain torchrun."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT, free_port
from launcher_helpers import run_job
from lightning_scripts.harness import base_env

from ft_core.event_file import read_events

SCRIPT = Path(REPO_ROOT) / "tests" / "integration" / "core_workers" / "standalone_train.py"
# The default warm-up (5 steps, timed by the generous ``setup`` budget): the hang test hangs past it.
CONFIG = {"rank_section_timeouts": {"setup": 120, "step": 3}, "initial_rank_heartbeat_timeout": None,
          "rank_heartbeat_timeout": None}


def _torchrun(tmp_path: Path, runtime_dir: str, via: str, *extra: str) -> tuple:
    env = base_env(tmp_path)
    env["XDG_RUNTIME_DIR"] = runtime_dir  # the monitor's private directory goes there
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=0",
           f"--master-port={free_port()}", str(SCRIPT), f"--via={via}", f"--config-json={json.dumps(CONFIG)}",
           f"--out={tmp_path}", *extra]
    result = run_job(cmd, env, timeout=240, log_path=tmp_path / "torchrun.log")
    assert not result.timed_out, result.output[-6000:]
    return result, sorted(Path(runtime_dir).glob("ft-*/standalone-*"))


@pytest.mark.timeout(300)
def test_plain_torch_hang_is_killed_by_the_standalone_monitor(tmp_path, runtime_dir):
    result, job_dirs = _torchrun(tmp_path, runtime_dir, "client", "--hang-rank=1", "--steps=8", "--hang-step=6")
    assert result.returncode != 0  # torchrun cannot restart: the job fails instead of hanging
    [job_dir] = job_dirs  # local rank 0 was killed (it waited in the all-reduce): its files stay
    events = read_events(str(job_dir / "monitor_events.jsonl"))[0]
    assert sorted(e["rank"] for e in events if e["event"] == "rank_connected") == [0, 1]
    # Rank 1 hangs and rank 0 waits for it in the all-reduce: both miss the step deadline.
    hangs = [e for e in events if e["event"] == "hang_detected"]
    assert hangs and all((h["reason"], h["section"], h["timeout"]) == ("section", "step", 3.0) for h in hangs)
    assert not list(tmp_path.glob("done_r*"))


@pytest.mark.timeout(300)
def test_megatron_hooks_slow_but_healthy_run_finishes_under_the_standalone_monitor(tmp_path, runtime_dir):
    # Steps take 2/3 of their 3 s timeout: slow, but never a hang.
    result, job_dirs = _torchrun(tmp_path, runtime_dir, "megatron", "--enable-ft", "--ft-num-warmup-iters=1", "--steps=4",
                                 "--step-time=2.0")
    assert result.returncode == 0, result.output[-6000:]
    assert sorted(p.name for p in tmp_path.glob("done_r*")) == ["done_r0", "done_r1"]
    assert "hung" not in result.output
    assert job_dirs == []  # a clean stop removes the monitor's directory
