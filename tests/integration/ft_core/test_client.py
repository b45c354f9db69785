"""RankMonitorClient against a real monitor; its default learning: only what can stand for a phase is learned.

The client runs in pytest itself; the monitor's termination signal is SIGUSR2, ignored here, so a
detected hang is recorded (``hang_detected``) and nothing dies. The README's loop under
``ft_launcher`` (a 4 s evaluation after learning) is ``tests/e2e/test_docs_runnable.py``.
"""

from __future__ import annotations

import logging
import signal
import time

import pytest
from helpers import wait_for, wait_for_event

from ft_core.client import RankMonitorClient, RankMonitorClientError
from ft_core.monitor import read_events

pytestmark = pytest.mark.timeout(120)
# Every key below is set at launch; the others are the defaults users get.
LAUNCH = {"rank_termination_signal": "SIGUSR2", "stack_dump_signal": None, "num_warmup_iterations": 0,
          "rank_section_timeouts": {"setup": 600.0, "step": 600.0}}


@pytest.fixture
def client():
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    rank = RankMonitorClient()
    yield rank
    rank.shutdown_workload_monitoring()
    signal.signal(signal.SIGUSR2, previous)


def _run(client: RankMonitorClient, steps: int = 20) -> None:
    """Set up, then ``steps`` fast steps: the gaps between them are microseconds."""
    client.start_section("setup")
    time.sleep(0.05)
    client.end_section("setup")
    for step in range(steps):
        client.set_iteration(step)
        client.start_section("step")
        client.end_section("step")


def _applied(monitor) -> dict:
    """The section timeouts the monitor applied last."""
    updated = wait_for(lambda: [e for e in read_events(monitor.events_path)[0] if e["event"] == "timeouts_updated"],
                       10, "the learned timeouts")
    return updated[-1]["timeouts"]["current_timeouts"]["section"]


def test_a_fresh_start_learns_step_not_setup_and_keeps_the_launch_out_of_section_floor(start_monitor, client,
                                                                                       caplog):
    monitor = start_monitor(attach=True, rank_out_of_section_timeout=600.0, **LAUNCH)
    client.init_workload_monitoring()
    with caplog.at_level(logging.INFO, logger="ft_core.client"):
        client.load_state_dict({})  # a fresh start's ckpt.get("ft_state", {})
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    _run(client)
    assert client.calculate_and_set_section_timeouts(skip_if_not_ready=True)
    applied = _applied(monitor)
    # NVRx learns setup from a start that loaded nothing, and ~1 s out of section from the gaps between steps.
    assert applied["calculated_sections"] == ["step"] and applied["section"]["setup"] == 600.0
    assert applied["out_of_section"] == 600.0


def test_a_resume_learns_setup(start_monitor, client):
    monitor = start_monitor(attach=True, rank_out_of_section_timeout=600.0, **LAUNCH)
    client.load_state_dict({"current_timeouts": {}})  # a checkpoint saved before anything was learned
    client.init_workload_monitoring()
    _run(client)
    assert client.calculate_and_set_section_timeouts(skip_if_not_ready=True)
    assert _applied(monitor)["calculated_sections"] == ["setup", "step"]


def test_learning_does_not_switch_on_an_out_of_section_timeout_disabled_at_launch(start_monitor, client):
    monitor = start_monitor(attach=True, **LAUNCH)  # rank_out_of_section_timeout: the default, none
    client.init_workload_monitoring()
    _run(client)
    assert client.calculate_and_set_section_timeouts(skip_if_not_ready=True)
    applied = _applied(monitor)
    assert applied["out_of_section"] is None and not applied["is_out_of_section_calculated"]


def test_asked_for_explicitly_out_of_section_is_learned_from_what_was_observed_as_in_nvrx(start_monitor, client):
    monitor = start_monitor(attach=True, rank_out_of_section_timeout=600.0, **LAUNCH)
    client.init_workload_monitoring()
    _run(client)
    assert client.calculate_and_set_section_timeouts(calc_out_of_section=True, skip_if_not_ready=True)
    assert _applied(monitor)["out_of_section"] < 600.0


def test_a_hang_out_of_section_past_the_launch_value_after_learning_is_still_caught(start_monitor, client):
    monitor = start_monitor(attach=True, rank_out_of_section_timeout=1.5, **LAUNCH)
    client.init_workload_monitoring()
    _run(client)
    assert client.calculate_and_set_section_timeouts(skip_if_not_ready=True)
    assert _applied(monitor)["out_of_section"] == 1.5
    # Now the rank hangs outside every section (an evaluation that never returns).
    hang = wait_for_event(monitor.events_path, 30, event="hang_detected")
    assert (hang["reason"], hang["timeout"], hang["iteration"]) == ("out_of_section", 1.5, 19)


def test_patched_heartbeat_frames_keep_a_slow_rank_alive_and_name_the_iteration_of_a_hang(start_monitor, client):
    # Heartbeats carry their iteration patched into one frame (IterationFrame): a rank that sends one every
    # second lives, and the hang that follows is caught at the timeout, naming the last iteration sent. The
    # timeout leaves a loaded machine 4 s of scheduling delay per heartbeat. The rank here is this test's
    # process, whose polling of the events file is storage I/O to the monitor (reads move a file's offset):
    # in CI it extended the deadline to its cap. The extension is not what this test is about: off.
    monitor = start_monitor(attach=True, rank_heartbeat_timeout=5.0, io_progress_cap=None, **LAUNCH)
    client.init_workload_monitoring()
    for iteration in (0, 1, 300, 70000, 2**40):  # frames of every msgpack integer width, each 1 s apart
        client.set_iteration(iteration)
        client.send_heartbeat()
        last = time.time()
        time.sleep(1.0)
    assert not [e for e in read_events(monitor.events_path)[0] if e["event"] == "hang_detected"]
    hang = wait_for_event(monitor.events_path, 30, event="hang_detected")
    assert (hang["reason"], hang["timeout"], hang["iteration"]) == ("heartbeat", 5.0, 2**40)
    # The deadline counts from the last heartbeat sent (from the one before, it would be 1 s earlier).
    assert 4.9 < hang["deadline_time"] - last < 5.9


def test_a_fresh_start_keeps_the_initial_heartbeat_timeout(start_monitor, client):
    monitor = start_monitor(attach=True, **LAUNCH)
    client.init_workload_monitoring()
    for _ in range(3):
        client.send_heartbeat()
    assert client.calculate_and_set_hb_timeouts()
    assert client.hb_timeouts.initial == 3600.0 and client.hb_timeouts.subsequent < 2700.0
    updated = wait_for(lambda: [e for e in read_events(monitor.events_path)[0] if e["event"] == "timeouts_updated"],
                       10, "the learned timeouts")
    assert updated[-1]["timeouts"]["current_timeouts"]["heartbeat"]["initial"] == 3600.0


def test_client_in_process_sections_state_and_timeouts(start_monitor, monkeypatch):
    # Learns from two steps: no warm-up step may be left out.
    monitor = start_monitor(rank_heartbeat_timeout=60, rank_section_timeouts="step:60,checkpointing:none",
                            safety_factor=2.0, num_warmup_iterations=0)
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", monitor.socket_path)
    monkeypatch.setenv("FT_MONITOR_TOKEN", monitor.token)
    client = RankMonitorClient()
    # Loaded before init: calculated values override the config ones.
    client.load_state_dict({"current_timeouts": {
        "heartbeat": {"initial": 11.0, "subsequent": 12.0, "were_calculated": True},
        "section": {"section": {"step": 13.0}, "out_of_section": None, "calculated_sections": ["step"],
                    "is_out_of_section_calculated": False}}})
    client.init_workload_monitoring()
    try:
        assert (client.hb_timeouts.initial, client.hb_timeouts.subsequent) == (11.0, 12.0)
        assert client.section_timeouts.section == {"step": 13.0, "checkpointing": None}
        client.start_section("step")
        with pytest.raises(RankMonitorClientError, match="already open"):
            client.start_section("step")
        client.start_section("untracked")  # not configured: ignored as in NVRx (no IPC, no checks)
        client.end_section("untracked")
        client.end_section("untracked")
        client.end_section("step")
        with pytest.raises(RankMonitorClientError, match="not open"):
            client.end_section("step")
        client.start_section("step")
        client.start_section("checkpointing")
        client.end_all_sections()
        client.report_checkpoint(42)
        assert client.calculate_and_set_section_timeouts(selected_sections=["step"], calc_out_of_section=False)
        # The calculated value (tiny observed step * 2, raised to min_calculated_timeout 1.0) is
        # averaged with the loaded one, as NVRx merges.
        assert client.section_timeouts.section["step"] == 0.5 * 13.0 + 0.5 * 1.0
        with pytest.raises(RankMonitorClientError, match="not tracked"):
            client.calculate_and_set_section_timeouts(selected_sections=["nope"])
        assert not client.calculate_and_set_hb_timeouts(skip_if_not_ready=True)
        with pytest.raises(RankMonitorClientError, match="two heartbeats"):
            client.calculate_and_set_hb_timeouts()
    finally:
        client.shutdown_workload_monitoring()
    events = wait_for(lambda: [e for e in read_events(monitor.events_path)[0]
                               if e["event"] == "rank_disconnected"] and read_events(monitor.events_path)[0],
                      10, "disconnect")
    assert any(e["event"] == "checkpoint_reported" and e["iteration"] == 42 for e in events)
    updated = [e for e in events if e["event"] == "timeouts_updated"]
    assert updated and updated[-1]["timeouts"]["current_timeouts"]["section"]["section"]["step"] == 7.0
    assert not [e for e in events if e["event"] == "hang_detected"]


def test_fallback_config_fills_only_what_the_launcher_did_not_set(start_monitor, monkeypatch):
    monitor = start_monitor(rank_heartbeat_timeout=50.0, rank_section_timeouts="step:9", safety_factor=5.0)
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", monitor.socket_path)
    monkeypatch.setenv("FT_MONITOR_TOKEN", monitor.token)
    client = RankMonitorClient()
    client.init_workload_monitoring(fallback_config={
        "rank_heartbeat_timeout": 5.0,  # set at launch: ignored
        "safety_factor": 2.0,  # set at launch to the default value: still ignored
        "initial_rank_heartbeat_timeout": 6.0,  # not set at launch: taken
        "rank_section_timeouts": {"step": 1.0, "checkpointing": 30.0},  # merged, launch wins for "step"
    })
    try:
        assert client.cfg.rank_heartbeat_timeout == 50.0
        assert client.cfg.safety_factor == 5.0
        assert client.cfg.initial_rank_heartbeat_timeout == 6.0
        assert client.section_timeouts.section == {"step": 9.0, "checkpointing": 30.0}
    finally:
        client.shutdown_workload_monitoring()
    bad = RankMonitorClient()
    with pytest.raises(RankMonitorClientError, match="rank_section_timeouts.step.*-1"):
        bad.init_workload_monitoring(fallback_config={"rank_section_timeouts": {"step": -1}})
    with pytest.raises(RankMonitorClientError, match="cannot come from a rank"):
        bad.init_workload_monitoring(fallback_config={"rank_termination_signal": "SIGTERM"})
    assert monitor.is_alive()


def test_state_dict_after_shutdown_and_reinit_keeps_learned_values(start_monitor, monkeypatch):
    # Learns from one step: no warm-up.
    monitor = start_monitor(rank_section_timeouts="step:60", safety_factor=2.0, num_warmup_iterations=0)
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", monitor.socket_path)
    monkeypatch.setenv("FT_MONITOR_TOKEN", monitor.token)
    client = RankMonitorClient()
    client.load_state_dict({"current_timeouts": {
        "heartbeat": {"initial": None, "subsequent": None, "were_calculated": False},
        "section": {"section": {"step": 0.001}, "out_of_section": None, "calculated_sections": ["step"],
                    "is_out_of_section_calculated": False}}})
    assert client.state_dict()["current_timeouts"]["section"]["section"]["step"] == 0.001
    client.init_workload_monitoring()
    client.start_section("step")
    client.end_section("step")
    client.calculate_and_set_section_timeouts(calc_out_of_section=False)
    learned = client.section_timeouts.section["step"]
    assert learned == 1.0  # a tiny observed step is raised to min_calculated_timeout
    client.shutdown_workload_monitoring()
    assert client.state_dict()["current_timeouts"]["section"]["section"]["step"] == learned
    client.init_workload_monitoring()  # a new cycle: the learned value goes with the handshake
    try:
        assert client.section_timeouts.section["step"] == learned
    finally:
        client.shutdown_workload_monitoring()


def test_heartbeats_learn_the_same_gaps_as_timeouts_calc(start_monitor, monkeypatch):
    """The hot path consults TimeoutsCalc only for a new largest gap: what is learned must not change."""
    from ft_core import client as client_module
    from ft_core.timeouts_calc import TimeoutsCalc

    monitor = start_monitor(rank_heartbeat_timeout=60, safety_factor=2.0, min_calculated_timeout=0.001)
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", monitor.socket_path)
    monkeypatch.setenv("FT_MONITOR_TOKEN", monitor.token)
    clock = [1000.0]
    monkeypatch.setattr(client_module, "_monotonic", lambda: clock[0])
    client = RankMonitorClient()
    client.init_workload_monitoring()
    clock[0] = client._session.calc.start_time  # TimeoutsCalc started on the real clock
    reference = TimeoutsCalc(safety_factor=2.0, start_time=client._session.calc.start_time, min_timeout=0.001)
    try:
        # Gaps growing, shrinking, equal and growing again; the first one is the initial delay.
        for gap in (4.0, 1.0, 3.0, 0.5, 3.0, 2.0, 7.0, 0.1):
            clock[0] += gap
            client.send_heartbeat()
            reference.update_on_heartbeat(hb_time=clock[0])
        assert (client._session.calc.first_hb_delay, client._session.calc.max_hb_interval) == (4.0, 7.0)
        # calc_initial=True: the initial delay too (by default only a resumed run learns it).
        assert client.calculate_and_set_hb_timeouts(calc_initial=True)
        expected = reference.calculate_hb_timeouts(client_module.HeartbeatTimeouts(60.0, 60.0))
        assert (client.hb_timeouts.initial, client.hb_timeouts.subsequent) == (expected.initial, expected.subsequent)
        assert (client.hb_timeouts.initial, client.hb_timeouts.subsequent) == (8.0, 14.0)
    finally:
        client.shutdown_workload_monitoring()


def test_phase_samples_go_out_in_one_send_and_the_monitor_reads_each_one(start_monitor, monkeypatch):
    import dataclasses

    monitor = start_monitor(attach=True, straggler_report_interval=0.2, **LAUNCH)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    sends: list[int] = []
    session = client._session
    client._session = dataclasses.replace(session, send=lambda frame: sends.append(len(frame)) or session.send(frame))
    try:
        client.record_phases([("data", 0.01), ("forward", 0.02), ("forward", 0.04)])
        assert len(sends) == 1
        with pytest.raises(RankMonitorClientError, match="record_phase"):  # checked first: nothing of it is sent
            client.record_phases([("data", 0.01), ("data", -1.0)])
        assert len(sends) == 1
        medians = wait_for(lambda: [m for e in read_events(monitor.events_path)[0] if e["event"] == "phase_medians"
                                    for m in e["medians"]], 10, "the round's medians")
    finally:
        client.shutdown_workload_monitoring()
    assert {(m["phase"], round(m["median"], 6)) for m in medians} == {("data", 0.01), ("forward", 0.03)}
