"""Drop-in for NVRx users, through the public API against a real monitor.

In-process tests run the client in pytest itself against a monitor whose
termination signal is SIGCONT (a detected hang is recorded, nothing dies);
tests that need a kill or a collective start real ranks (gloo on CPU).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types

import pytest
from helpers import REPO_ROOT, free_port, kill_group, python_env, spawn_python, wait_for, wait_for_event

from ft_core.client import RankMonitorClient, RankMonitorClientError
from ft_core.config import FaultToleranceConfig
from ft_core.monitor import read_events

WORKER = os.path.join(REPO_ROOT, "tests", "integration", "core_workers", "nvrx_compat.py")
pytestmark = pytest.mark.timeout(240)


def _cfg(**overrides) -> FaultToleranceConfig:
    # This process is the rank in in-process tests: a detected hang must not kill pytest, so the
    # monitor "terminates" with SIGUSR2, which this module ignores (see _ignore_termination_signal).
    # Every step is timed and learned (no warm-up) unless a test is about warm-up.
    return FaultToleranceConfig(**{"rank_termination_signal": "SIGUSR2", "stack_dump_signal": None,
                                   "num_warmup_iterations": 0, **overrides})


@pytest.fixture(autouse=True)
def _ignore_termination_signal():
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGUSR2, previous)


def _events(monitor, name=None):
    return [e for e in read_events(monitor.events_path)[0] if name is None or e["event"] == name]


@pytest.fixture
def client():
    clients = []

    def make():
        clients.append(RankMonitorClient())
        return clients[-1]

    yield make
    for c in clients:
        c.shutdown_workload_monitoring()


# -- 1. NVRx checkpoints load, before or after init, and reach the monitor ---
def test_nvrx_section_state_loaded_before_init_times_the_rank_from_connect(start_monitor, client):
    monitor = start_monitor(_cfg(rank_section_timeouts={"step": 600.0, "checkpointing": 600.0},
                                  rank_heartbeat_timeout=600.0), attach=True)
    c = client()
    assert c.hb_timeouts is None and c.section_timeouts is None  # NVRx: None until init
    # Exactly as NVRx writes it: "section" only (no heartbeat was calculated), calculated_sections a list.
    c.load_state_dict({"current_timeouts": {"section": {
        "section": {"step": 0.5, "checkpointing": 300.0}, "out_of_section": None,
        "calculated_sections": ["step"], "is_out_of_section_calculated": False}}})
    c.init_workload_monitoring()
    assert c.hb_timeouts.initial == 3600.0 and not c.hb_timeouts.were_calculated
    # The learned "step" applies; "checkpointing" was a copy of NVRx's config: ours wins.
    assert c.section_timeouts.section == {"step": 0.5, "checkpointing": 600.0}
    assert c.section_timeouts.calculated_sections == {"step"}
    c.start_section("step")
    hang = wait_for_event(monitor.events_path, 30, event="hang_detected")
    assert (hang["reason"], hang["section"], hang["timeout"]) == ("section", "step", 0.5)
    assert hang["elapsed"] >= 0.5


def test_nvrx_heartbeat_state_loaded_after_init_applies_at_once(start_monitor, client):
    monitor = start_monitor(_cfg(rank_heartbeat_timeout=600.0), attach=True)
    c = client()
    c.init_workload_monitoring()
    c.send_heartbeat()
    c.load_state_dict({"current_timeouts": {}})  # saved by NVRx before anything was calculated
    assert c.hb_timeouts.subsequent == 600.0
    c.load_state_dict({"current_timeouts": {"heartbeat": {"initial": 30.0, "subsequent": 0.5,
                                                          "were_calculated": True}}})
    assert (c.hb_timeouts.initial, c.hb_timeouts.subsequent, c.hb_timeouts.were_calculated) == (30.0, 0.5, True)
    assert c.state_dict() == {"current_timeouts": {"heartbeat": {"initial": 30.0, "subsequent": 0.5,
                                                                 "were_calculated": True}}}
    hang = wait_for_event(monitor.events_path, 30, event="hang_detected")
    assert (hang["reason"], hang["timeout"]) == ("heartbeat", 0.5)


# -- 2. a bad checkpoint is rejected: no false kill, no disabled detection ---
@pytest.mark.parametrize("bad", ["30", float("nan"), float("inf"), 0.0, -1.0], ids=str)
def test_bad_checkpoint_values_are_rejected_and_config_timeouts_stay(start_monitor, client, bad):
    monitor = start_monitor(_cfg(rank_heartbeat_timeout=1.0, initial_rank_heartbeat_timeout=600.0), attach=True)
    bad_state = {"current_timeouts": {"heartbeat": {"initial": bad, "subsequent": bad, "were_calculated": True}}}
    c = client()
    with pytest.raises(RankMonitorClientError, match=r"current_timeouts\.heartbeat\.initial"):
        c.load_state_dict(bad_state)  # before init: would go to the monitor with the handshake
    c.init_workload_monitoring()
    with pytest.raises(RankMonitorClientError, match=r"current_timeouts\.heartbeat\.initial"):
        c.load_state_dict(bad_state)  # after init: would be sent at once
    assert (c.hb_timeouts.initial, c.hb_timeouts.subsequent) == (600.0, 1.0)
    # A healthy rank is not killed (<= 0) and a silent one still is (NaN/inf would disable it).
    for _ in range(4):
        c.send_heartbeat()
        time.sleep(0.2)
    assert _events(monitor, "hang_detected") == []
    hang = wait_for_event(monitor.events_path, 30, event="hang_detected")
    assert (hang["reason"], hang["timeout"]) == ("heartbeat", 1.0)
    assert _events(monitor, "timeouts_updated") == [] and monitor.is_alive()


# -- 3 and 5. attributes and learning in one process ------------------------
def test_state_dict_has_nvrx_shape_and_learning_merges_like_nvrx(start_monitor, client):
    monitor = start_monitor(_cfg(rank_section_timeouts={"step": 600.0, "eval": 600.0}, safety_factor=2.0,
                                  min_calculated_timeout=0.01), attach=True)
    c = client()
    c.init_workload_monitoring()
    assert c.state_dict() == {"current_timeouts": {}}
    c.load_state_dict({"current_timeouts": {"section": {
        "section": {"step": 4.0, "eval": 600.0}, "out_of_section": None,
        "calculated_sections": ["step"], "is_out_of_section_calculated": False}}})
    for _ in range(2):
        c.start_section("step")
        time.sleep(0.05)
        c.end_section("step")
    # "eval" has no data: skipped. Out of section: the interval still running counts. Asked for
    # explicitly, it is learned as NVRx does (by default only when set at launch: ft_core.learning_rules).
    time.sleep(0.3)
    assert c.calculate_and_set_section_timeouts(calc_out_of_section=True, skip_if_not_ready=True)
    sections = c.section_timeouts
    assert sections.calculated_sections == {"step"} and sections.is_out_of_section_calculated
    # NVRx's average of the loaded 4.0 and 2 x ~0.05 s: not the larger value, not the new one alone.
    assert 0.5 * 4.0 + 0.5 * 0.1 <= sections.section["step"] < 4.0
    assert sections.out_of_section >= 0.3 * 2.0
    assert sections.are_valid and not sections.were_calculated  # "eval" keeps its config value
    state = c.state_dict()
    # No heartbeat was calculated; "job_life" (the job-life maxima) is ours: NVRx ignores it.
    assert set(state["current_timeouts"]) == {"section", "job_life"}
    assert state["current_timeouts"]["section"]["calculated_sections"] == ["step"]
    updated = wait_for(lambda: _events(monitor, "timeouts_updated")[1:], 10, "the learned timeouts")
    assert updated[-1]["timeouts"] == state


# -- 6. sections that are not configured are ignored, as in NVRx ------------
def test_untracked_sections_are_ignored_tracked_misuse_raises(start_monitor, client):
    monitor = start_monitor(_cfg(rank_section_timeouts={"step": 600.0}, rank_out_of_section_timeout=1.0), attach=True)
    c = client()
    c.init_workload_monitoring()
    c.start_section("data")
    c.start_section("data")
    c.end_section("data")
    c.end_section("data")
    c.end_section("never-started")
    c.start_section("step")
    with pytest.raises(RankMonitorClientError, match="already open"):
        c.start_section("step")
    c.end_section("step")
    with pytest.raises(RankMonitorClientError, match="not open"):
        c.end_section("step")
    c.end_all_sections()
    # "data" never reached the monitor: the rank is out of every section there, and times out.
    c.start_section("data")
    hang = wait_for_event(monitor.events_path, 30, event="hang_detected")
    assert hang["reason"] == "out_of_section" and hang["open_sections"] == []


# -- Megatron-LM's unmodified ft_integration: its args appear after the client's init ---
def test_megatron_args_set_after_init_give_the_iteration_of_sections_and_hangs(start_monitor, client,
                                                                               monkeypatch):
    monitor = start_monitor(_cfg(rank_section_timeouts={"step": 0.5}, rank_heartbeat_timeout=600.0), attach=True)
    # Megatron-LM imported its global_vars; ft_integration.setup() connects before initialize_megatron().
    global_vars = types.ModuleType("megatron.training.global_vars")
    global_vars._GLOBAL_ARGS = None
    monkeypatch.setitem(sys.modules, "megatron.training.global_vars", global_vars)
    c = client()
    c.init_workload_monitoring()
    c.send_heartbeat()  # no args yet: no iteration, no error
    global_vars._GLOBAL_ARGS = types.SimpleNamespace(iteration=40)  # after a checkpoint load (NVRx's fallback)
    assert c._current_iteration() == 40
    global_vars._GLOBAL_ARGS.curr_iteration = 41  # the training loop's counter
    c.send_heartbeat()
    global_vars._GLOBAL_ARGS.curr_iteration = 42
    c.start_section("step")
    hang = wait_for_event(monitor.events_path, 30, event="hang_detected")
    assert (hang["section"], hang["iteration"]) == ("step", 42)


# -- 4. warm-up: num_warmup_iters, the "warmup" section timeout -------------
def _run_ranks(monitor, tmp_path, scenario, world_size=1, extra=(), timeout=150):
    """Run the worker on ``world_size`` ranks; return their exit codes."""
    env = {"FT_RANK_MONITOR_IPC_SOCKET": monitor.socket_path, "FT_MONITOR_TOKEN": monitor.token,
           "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [spawn_python([WORKER, scenario, str(tmp_path), *extra],
                          env=python_env(RANK=str(rank), LOCAL_RANK=str(rank), **env))
             for rank in range(world_size)]
    try:
        return [proc.wait(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            kill_group(proc)


def _result(tmp_path, scenario, rank=0):
    return json.loads((tmp_path / f"{scenario}_rank{rank}.json").read_text())


@pytest.mark.parametrize("report_iterations", [True, False], ids=["iterations", "step-count"])
def test_warmup_steps_are_timed_by_the_warmup_section_then_step_is(start_monitor, tmp_path,
                                                                   report_iterations):
    # Monitor: no warm-up; the rank asks for 2 warm-up iterations (NVRx's init_workload_monitoring argument).
    monitor = start_monitor(rank_section_timeouts={"step": 0.3, "warmup": 1.5}, rank_heartbeat_timeout=None,
                            num_warmup_iterations=0)
    extra = ["--num-warmup-iters", "2", "--hang-at-step", "2"]
    codes = _run_ranks(monitor, tmp_path, "warmup", extra=extra + (["--report-iterations"] if report_iterations
                                                                   else []))
    assert codes == [-signal.SIGKILL]
    result = _result(tmp_path, "warmup")
    assert result["num_warmup_iterations"] == 2
    assert result["reached_step"] == 2  # two 0.6 s warm-up steps survived a 0.3 s "step" timeout
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert (hang["section"], hang["timeout"]) == ("step", 0.3)
    assert hang["iteration"] == (102 if report_iterations else None)


def test_a_hang_during_warmup_is_caught_by_the_warmup_timeout(start_monitor, tmp_path):
    monitor = start_monitor(rank_section_timeouts={"step": 0.3, "warmup": 1.5}, rank_heartbeat_timeout=None,
                            num_warmup_iterations=2)
    codes = _run_ranks(monitor, tmp_path, "warmup", extra=["--hang-at-step", "0", "--report-iterations"])
    assert codes == [-signal.SIGKILL]
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert (hang["section"], hang["timeout"], hang["iteration"]) == ("step", 1.5, 100)
    assert hang["elapsed"] >= 1.5


# -- 5. learning with real gloo ranks --------------------------------------
def test_a_rank_without_data_does_not_block_learning(start_monitor, tmp_path):
    monitor = start_monitor(num_warmup_iterations=0,
                            rank_section_timeouts={"step": 600.0, "checkpointing": 600.0},
                            rank_out_of_section_timeout=600.0, safety_factor=2.0, min_calculated_timeout=0.01)
    assert _run_ranks(monitor, tmp_path, "one_rank_without_data", world_size=2) == [0, 0]
    ranks = [_result(tmp_path, "one_rank_without_data", r) for r in range(2)]
    assert ranks[0]["state"] == ranks[1]["state"]
    current = ranks[0]["state"]["current_timeouts"]
    # Only rank 0 checkpointed and sent heartbeats: both ranks learned rank 0's values.
    assert 0.3 * 2.0 <= current["section"]["section"]["checkpointing"] <= ranks[0]["measured"]["checkpointing"] * 2.0
    assert 0.4 * 2.0 <= current["heartbeat"]["subsequent"] <= ranks[0]["measured"]["hb_interval"] * 2.0
    # "step" comes from the slower rank 1.
    assert 0.3 * 2.0 <= current["section"]["section"]["step"] <= ranks[1]["measured"]["step"] * 2.0
    assert current["section"]["calculated_sections"] == ["checkpointing", "step"]


def test_a_merge_never_goes_below_the_slowest_interval_observed(start_monitor, tmp_path):
    monitor = start_monitor(num_warmup_iterations=0,
                            rank_section_timeouts={"step": 600.0}, safety_factor=1.0,
                            min_calculated_timeout=0.01)
    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps({"current_timeouts": {"section": {
        "section": {"step": 0.2}, "out_of_section": None, "calculated_sections": ["step"],
        "is_out_of_section_calculated": False}}}))
    assert _run_ranks(monitor, tmp_path, "merge_floor", world_size=2, extra=["--state", str(previous)]) == [0, 0]
    ranks = [_result(tmp_path, "merge_floor", r) for r in range(2)]
    assert ranks[0]["state"] == ranks[1]["state"]
    step = ranks[0]["state"]["current_timeouts"]["section"]["section"]["step"]
    # NVRx's average would be 0.5 * 0.2 + 0.5 * 0.6 = 0.4: shorter than a step rank 1 already took.
    assert 0.6 <= step <= ranks[1]["measured"]["step"]


def test_a_slow_phase_after_fast_learning_is_not_killed_and_a_hang_still_is(start_monitor, tmp_path):
    monitor = start_monitor(num_warmup_iterations=0,
                            rank_section_timeouts={"step": 600.0}, safety_factor=4.0,
                            min_calculated_timeout=0.05, rank_heartbeat_timeout=None)
    # Cycle 1 learns on 0.4 s steps; its state travels to the next cycles (as in a checkpoint).
    assert _run_ranks(monitor, tmp_path, "slow_phase", world_size=2) == [0, 0]
    saved = _result(tmp_path, "slow_phase")["state"]
    first = saved["current_timeouts"]["section"]["section"]["step"]
    assert first >= 0.4 * 4.0
    state_file = tmp_path / "saved.json"
    state_file.write_text(json.dumps(saved))

    # Cycle 2 learns on 0.02 s steps only (0.08 s alone), then runs 0.4 s steps again: healthy.
    codes = _run_ranks(monitor, tmp_path, "fast_then_slow", world_size=2, extra=["--state", str(state_file)])
    assert codes == [0, 0]
    learned = _result(tmp_path, "fast_then_slow", 1)
    merged = learned["state"]["current_timeouts"]["section"]["section"]["step"]
    # NVRx averages it down (toward 0.08); the job-life floor (4 x the 0.4 s steps the job saw) keeps it.
    assert merged == first
    assert _events(monitor, "hang_detected") == []

    # Cycle 3: the same, but rank 1 really hangs in its first slow step.
    codes = _run_ranks(monitor, tmp_path, "fast_then_slow", world_size=2,
                       extra=["--state", str(state_file), "--hang"])
    assert codes == [0, -signal.SIGKILL]
    hang = wait_for_event(monitor.events_path, 10, event="hang_detected")
    assert (hang["rank"], hang["section"]) == (1, "step")
    assert hang["timeout"] == _result(tmp_path, "fast_then_slow", 1)["state"]["current_timeouts"]["section"][
        "section"]["step"] == first
