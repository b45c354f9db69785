"""The plain client's default learning against a real monitor: only what can stand for a phase is learned.

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

from ft_core.client import RankMonitorClient
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
