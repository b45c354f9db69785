"""Two gloo ranks with different intervals end with identical learned timeouts."""

from __future__ import annotations

import json
import os

import pytest
from helpers import REPO_ROOT, free_port, kill_group, python_env, spawn_python

from ft_core.config import FaultToleranceConfig
from ft_core.monitor import RankMonitorServer

SCRIPT = os.path.join(REPO_ROOT, "tests", "integration", "core_workers", "learn_timeouts.py")


@pytest.mark.timeout(180)
def test_two_ranks_learn_identical_timeouts_from_the_slowest(tmp_path):
    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 600}, safety_factor=10.0, num_warmup_iterations=0)
    monitor = RankMonitorServer.run_in_subprocess(cfg, str(tmp_path / "job" / "monitor.sock"), token="tok" * 6)
    port = free_port()
    procs = []
    try:
        for rank in range(2):
            env = python_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=str(port), FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path,
                             FT_MONITOR_TOKEN=monitor.token)
            procs.append(spawn_python([SCRIPT, str(tmp_path)], env=env))
        for proc in procs:
            assert proc.wait(timeout=150) == 0
    finally:
        for proc in procs:
            kill_group(proc)
        monitor.stop()
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0]["state"] == results[1]["state"]
    current = results[0]["state"]["current_timeouts"]
    slowest_step = max(r["observed"]["step"] for r in results)
    slowest_gap = max(r["observed"]["hb_interval"] for r in results)
    assert current["section"]["section"]["step"] == pytest.approx(slowest_step * 10.0)
    assert current["section"]["calculated_sections"] == ["step"]
    assert current["heartbeat"]["subsequent"] == pytest.approx(slowest_gap * 10.0)
    assert current["heartbeat"]["were_calculated"] is True
    # Rank 1 slept 0.2 s per step, so the value cannot have come from rank 0.
    assert slowest_step >= 0.2
