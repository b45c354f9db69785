"""``ft_launcher --ft-cfg-path=<a config file written for NVRx>``: the file's timeouts and no-progress rule apply."""

from __future__ import annotations

import os

import pytest
from helpers import REPO_ROOT
from launcher_helpers import exit_event

pytestmark = pytest.mark.timeout(300)

NVRX_CONFIG = os.path.join(REPO_ROOT, "tests", "fixtures", "nvrx_ft_config.yaml")
#: The launcher_helpers FAST_FLAGS without the keys the file sets: a flag would win over the file.
FLAGS = ("--monitor-interval=0.05", "--ft-stack-dump-timeout=0.5", "--workers-stop-timeout=5")


def test_nvrx_config_file_sets_the_timeouts_and_the_no_progress_rule(launchers):
    # Rank 0 reports checkpoint 10, then hangs, in every cycle. The file sets a 4 s heartbeat timeout
    # and max_no_progress_cycles: 1 (no flag does): cycle 0 made progress (the first checkpoint),
    # cycle 1 did not, so the job stops with "do not requeue" after two cycles (the default, 3, would
    # take four).
    node = launchers.start(f"--ft-cfg-path={NVRX_CONFIG}", "--max-restarts=5", base_flags=FLAGS,
                           FT_TEST_FAULT="hang", FT_TEST_FAULT_CYCLES="all", FT_TEST_CHECKPOINT="10")
    assert node.wait(240) == 93, node.output()[-4000:]

    (started,) = node.events("launcher_started")
    config = started["config"]
    assert (config["initial_rank_heartbeat_timeout"], config["rank_heartbeat_timeout"]) == (90.0, 4.0)
    assert config["rank_section_timeouts"] == {"setup": 600.0, "step": 180.0, "checkpointing": None}
    assert (config["safety_factor"], config["log_level"], config["num_warmup_iterations"]) == (4.0, 20, 2)
    assert (config["max_no_progress_cycles"], config["min_progress_iterations"]) == (1, 5)
    # What every rank was told by its monitor: the file's values.
    received = [record["config"] for record in launchers.worker_records("monitor_config")]
    assert len(received) == 4 and {cfg["rank_heartbeat_timeout"] for cfg in received} == {4.0}

    hangs = [e for e in node.events("hang_detected") if e["rank"] == 0]
    assert len(hangs) == 2
    assert all(h["reason"] == "heartbeat" and h["timeout"] == 4.0 and h["elapsed"] >= 4.0 for h in hangs)
    assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
    assert [e["iteration"] for e in node.events("progress")] == [10]
    reason = exit_event(node)["reason"]
    assert reason.startswith("no progress: 1 consecutive faulty cycles") and "progress means +5" in reason
    # The keys NVRx has and ft-suite does not implement: accepted, with one warning at start.
    output = node.output()
    assert output.count("20 key(s) of NVRx's FaultToleranceConfig that ft-suite does not implement are kept") == 1
