"""FaultToleranceSession against a real rank monitor: learning schedule, state file, restore, finished flag."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
from helpers import wait_for

from ft_core.config import FaultToleranceConfig
from ft_core.monitor import read_events
from ft_core.timeouts import describe_timeouts, timeouts_from_state_dict
from ft_integrations.session import (
    FINISHED_FLAG_ENV,
    FaultToleranceSession,
    LearningSchedule,
    MonitoringMode,
    Section,
)

pytestmark = pytest.mark.timeout(60)

TOKEN = "session-test-token-0123456789"
SECTIONS = {"setup": 60.0, "step": 60.0, "checkpointing": 60.0}
LEARNED = {"heartbeat": {"initial": 3600.0, "subsequent": 2700.0, "were_calculated": False},
           "section": {"section": {"step": 123.0}, "out_of_section": None, "calculated_sections": ["step"],
                       "is_out_of_section_calculated": False}}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", FINISHED_FLAG_ENV,
                 "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def attached_monitor(start_monitor):
    # This process is the rank: a deadline it misses must not kill pytest. The config rejects
    # signals that do not end a process, so the test ignores the one the monitor sends.
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    def start(**overrides):
        defaults = {"rank_section_timeouts": SECTIONS, "safety_factor": 2.0, "min_calculated_timeout": 0.01,
                    "rank_termination_signal": "SIGUSR2", "stack_dump_signal": None,
                    "num_warmup_iterations": 0}
        return start_monitor(FaultToleranceConfig(**{**defaults, **overrides}), token=TOKEN, attach=True)

    yield start
    signal.signal(signal.SIGUSR2, previous)


class Messages:
    """The session's info and warning channels, as an integration passes them."""

    def __init__(self) -> None:
        self.info: list[str] = []
        self.warn: list[str] = []

    def learned(self) -> list[str]:
        return [m for m in self.info if "learned timeouts" in m]


@pytest.fixture
def sessions():
    made = []

    def make(messages: Messages | None = None, connect: bool = False, writer: bool = True, state_file=None,
             **schedule):
        messages = messages or Messages()
        session = FaultToleranceSession(LearningSchedule(**schedule), state_file=state_file, name="test",
                                        info=messages.info.append, warn=messages.warn.append)
        session.begin_run(writer=writer)
        if connect:
            session.load_state_file()
            session.client.init_workload_monitoring()
        made.append(session)
        return session, messages

    yield make
    for session in made:
        session.client.shutdown_workload_monitoring()


def run_step(session: FaultToleranceSession, seconds: float = 0.0) -> None:
    session.client.start_section(Section.STEP)
    time.sleep(seconds)
    session.client.end_section(Section.STEP)


def updates(monitor) -> list[dict]:
    return [e for e in read_events(monitor.events_path)[0] if e["event"] == "timeouts_updated"]


# -- learning schedule ----------------------------------------------------------
def test_a_given_step_number_learns_once_when_it_reaches_after_steps(attached_monitor, sessions):
    monitor = attached_monitor()
    session, messages = sessions(connect=True, after_steps=3)
    for step in (1, 2):
        run_step(session)
        session.step_completed(step)
    assert session.client.section_timeouts.calculated_sections == set()
    run_step(session)
    session.step_completed(3)
    assert session.client.section_timeouts.calculated_sections == {"step"}
    assert messages.learned() and "after 3 steps" in messages.learned()[0]
    run_step(session)
    session.step_completed(4)
    assert len(wait_for(lambda: updates(monitor), 10, "the update")) == 1  # once per run


def test_a_resumed_run_past_after_steps_learns_only_after_after_steps_steps_of_its_own(attached_monitor, sessions):
    # Learning at a resume's first batch, from one step gap, halved the checkpoint's timeouts (issue 20).
    attached_monitor()
    session, _ = sessions(connect=True, after_steps=3)
    for step in (150, 151):  # Lightning's global step after a resume: already past after_steps
        run_step(session)
        session.step_completed(step)
        assert session.client.section_timeouts.calculated_sections == set()
    run_step(session)
    session.step_completed(152)  # the run's own third step
    assert session.client.section_timeouts.calculated_sections == {"step"}


def test_counted_steps_learn_after_both_warmups_and_warmup_steps_are_not_learned(attached_monitor, sessions):
    attached_monitor(num_warmup_iterations=1)  # the monitor's warm-up adds to the session's
    session, _ = sessions(connect=True, after_steps=2, warmup_steps=2)
    warm = []
    for _ in range(2):  # the session's warm-up: the integration keeps these out of "step"
        warm.append(session.in_warmup())
        session.client.send_heartbeat()
        session.step_completed()
    assert warm == [True, True] and not session.in_warmup()
    run_step(session, 0.5)  # the monitor's warm-up step: slow, and not learned
    session.step_completed()
    run_step(session)
    session.step_completed()  # 4 steps: one timed step only
    assert session.client.section_timeouts.calculated_sections == set()
    run_step(session)
    session.step_completed()  # 2 timed steps
    learned = session.client.section_timeouts
    assert learned.calculated_sections == {"step"}
    assert learned.section["step"] < 0.5 * 2.0  # the slow warm-up step did not count


def test_first_save_learns_once_and_setup_waits_for_a_persistent_checkpoint_load(attached_monitor, sessions):
    monitor = attached_monitor()
    session, _ = sessions(connect=True, after_steps=1000, setup_needs_checkpoint_load=True)
    session.client.start_section(Section.SETUP)
    session.client.end_section(Section.SETUP)
    run_step(session)
    session.client.start_section(Section.CHECKPOINTING)
    session.client.end_section(Section.CHECKPOINTING)
    session.save_completed()
    assert session.client.section_timeouts.calculated_sections == {"checkpointing", "step"}  # no setup
    session.save_completed()
    assert len(wait_for(lambda: updates(monitor), 10, "the update")) == 1  # after the *first* save only

    session.checkpoint_loaded(persistent=False)  # a local checkpoint: still not representative
    session.learn_at_end()
    assert "setup" not in session.client.section_timeouts.calculated_sections
    session.checkpoint_loaded(persistent=True)
    session.learn_at_end()
    assert "setup" in session.client.section_timeouts.calculated_sections


def test_a_fresh_start_keeps_startup_timeouts_and_a_resume_learns_them_never_below_what_it_saw(
        attached_monitor, sessions):
    monitor = attached_monitor()
    # Fresh start: a quick setup, learned steps; setup keeps its configured value.
    fresh, _ = sessions(connect=True, setup_needs_checkpoint_load=True)
    fresh.client.start_section(Section.SETUP)
    fresh.client.end_section(Section.SETUP)
    run_step(fresh)
    fresh.step_completed(1)
    assert fresh.client.section_timeouts.calculated_sections == {"step"}
    assert fresh.client.section_timeouts.section["setup"] == SECTIONS["setup"]
    state = fresh.state_dict()
    fresh.client.shutdown_workload_monitoring()

    # Resume: restored from the fresh start's state, its setup (a checkpoint load) is slower than
    # anything a fresh start would have learned, and it is not killed; it learns setup from itself.
    resumed, _ = sessions(setup_needs_checkpoint_load=True)
    resumed.restore(state)
    resumed.client.init_workload_monitoring()
    resumed.client.start_section(Section.SETUP)
    time.sleep(0.3)
    resumed.checkpoint_loaded(persistent=True)
    resumed.client.end_section(Section.SETUP)
    run_step(resumed)
    resumed.step_completed(2)
    learned = resumed.client.section_timeouts
    assert "setup" in learned.calculated_sections and learned.section["setup"] >= 0.3
    assert [e for e in read_events(monitor.events_path)[0] if e["event"] == "hang_detected"] == []


def test_heartbeat_initial_is_learned_only_by_a_resume(attached_monitor, sessions):
    attached_monitor(rank_section_timeouts={}, initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=60.0)
    session, _ = sessions(connect=True, learns=MonitoringMode.HEARTBEATS, setup_needs_checkpoint_load=True)
    for _ in range(3):
        session.client.send_heartbeat()
    session.learn_at_end()
    hb = session.client.hb_timeouts
    assert hb.were_calculated and hb.subsequent is not None
    assert hb.initial is None  # the configured value (no timeout) stays, and is saved as such
    assert session.state_dict()["current_timeouts"]["heartbeat"]["initial"] is None
    session.checkpoint_loaded(persistent=True)
    session.learn_at_end()
    assert session.client.hb_timeouts.initial is not None


def test_setup_is_learned_in_any_run_without_that_rule(attached_monitor, sessions):
    attached_monitor()
    session, _ = sessions(connect=True)
    session.client.start_section(Section.SETUP)
    session.client.end_section(Section.SETUP)
    session.learn_at_end()
    assert session.client.section_timeouts.calculated_sections == {"setup"}


def test_out_of_section_waits_for_a_boundary_or_the_end(attached_monitor, sessions):
    attached_monitor(rank_out_of_section_timeout=60.0)
    session, _ = sessions(connect=True, out_of_section_needs_boundary=True)
    run_step(session)
    session.save_completed()
    assert not session.client.section_timeouts.is_out_of_section_calculated
    session.saw_boundary()
    run_step(session)
    session.learn_at_end()
    assert session.client.section_timeouts.is_out_of_section_calculated


def test_out_of_section_disabled_at_launch_stays_disabled_and_a_slow_gap_is_not_killed(attached_monitor, sessions):
    monitor = attached_monitor(min_calculated_timeout=0.01)
    session, _ = sessions(connect=True)
    run_step(session)
    session.learn_at_end()
    assert session.client.section_timeouts.out_of_section is None
    time.sleep(1.0)  # out of every section, far longer than a learned out-of-section timeout would be
    run_step(session)
    assert [e for e in read_events(monitor.events_path)[0] if e["event"] == "hang_detected"] == []


def test_out_of_section_set_at_launch_is_learned_and_a_longer_gap_is_caught(attached_monitor, sessions):
    monitor = attached_monitor(rank_out_of_section_timeout=60.0, min_calculated_timeout=0.3)
    session, _ = sessions(connect=True)
    run_step(session)
    session.learn_at_end()
    learned = session.client.section_timeouts.out_of_section
    assert learned is not None and learned < 60.0
    hang = wait_for(lambda: [e for e in read_events(monitor.events_path)[0] if e["event"] == "hang_detected"],
                    10 + learned, "the out-of-section hang")[0]
    assert (hang["reason"], hang["timeout"]) == ("out_of_section", learned)


def test_heartbeat_schedule_learns_heartbeat_timeouts(attached_monitor, sessions):
    attached_monitor(rank_section_timeouts={}, initial_rank_heartbeat_timeout=60.0, rank_heartbeat_timeout=60.0)
    session, messages = sessions(connect=True, learns=MonitoringMode.HEARTBEATS)
    for _ in range(3):
        session.client.send_heartbeat()
    session.learn_at_end()
    assert session.client.hb_timeouts.were_calculated
    assert messages.learned() == [f"test: learned timeouts at the end of training: "
                                  f"{describe_timeouts(session.client.hb_timeouts, session.client.section_timeouts)}"]
    assert "heartbeat" in messages.learned()[0] and "* first" in messages.learned()[0]  # one line, the learned marked


def test_a_disabled_schedule_never_calculates(attached_monitor, sessions):
    monitor = attached_monitor()
    session, messages = sessions(connect=True, enabled=False)
    run_step(session)
    session.step_completed(1)
    session.save_completed()
    session.learn_at_end()
    assert updates(monitor) == [] and messages.learned() == []


def test_learning_never_fails_training_when_the_monitor_is_gone(attached_monitor, sessions):
    monitor = attached_monitor()
    session, messages = sessions(connect=True)
    run_step(session)
    monitor.stop()
    session.learn_at_end()  # the update cannot be sent: a warning, not an exception
    assert any("timeouts not updated at the end of training" in m for m in messages.warn)


def test_learned_timeouts_are_logged_once_per_change(attached_monitor, sessions, tmp_path):
    # A floor far above the observed times: every calculation gives the same values.
    monitor = attached_monitor(min_calculated_timeout=1000.0)
    state_file = tmp_path / "ft.json"
    session, messages = sessions(connect=True, state_file=state_file)
    run_step(session)
    session.step_completed(1)
    run_step(session)
    session.save_completed()
    assert len(wait_for(lambda: updates(monitor)[1:], 10, "both updates")) == 1  # both were sent...
    assert len(messages.learned()) == 1  # ...and logged once
    assert json.loads(state_file.read_text()) == session.client.state_dict()


# -- state file and checkpoint restore ------------------------------------------
def test_state_file_round_trip_rides_the_next_handshake(attached_monitor, sessions, tmp_path):
    attached_monitor()
    state_file = tmp_path / "sub" / "ft.json"
    reader, _ = sessions(connect=True, writer=False, state_file=state_file)
    run_step(reader)
    reader.learn_at_end()
    assert not state_file.exists()  # only the writer rank writes
    writer, _ = sessions(connect=True, state_file=state_file)
    run_step(writer)
    writer.learn_at_end()
    saved = json.loads(state_file.read_text())
    assert saved == writer.client.state_dict()

    fresh, messages = sessions(state_file=state_file)
    assert fresh.load_state_file() and fresh.has_state
    fresh.client.init_workload_monitoring()
    assert fresh.client.section_timeouts.to_dict() == saved["current_timeouts"]["section"]
    assert messages.info == [f"test: timeouts restored from {state_file}: "
                             f"{describe_timeouts(*timeouts_from_state_dict(saved))}"]
    assert "'section'" not in messages.info[0]  # a line for people, not a nested dict


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (json.dumps({"current_timeouts": LEARNED})[:40], "Unterminated string|Expecting"),  # truncated write
        (b"\xff\xfe\x00garbage", "codec can't decode"),
        ("[1, 2]", "a fault tolerance state dict"),
        (json.dumps({"current_timeouts": {**LEARNED, "section": {**LEARNED["section"], "section": {"step": "x"}}}}),
         r"current_timeouts.section.section.step: invalid value 'x'"),
        (json.dumps({"current_timeouts": {**LEARNED, "heartbeat": {"initial": -5}}}),
         r"current_timeouts.heartbeat.initial: invalid value -5"),
        (json.dumps({"current_timeouts": {"section": {"section": {}, "calculated_sections": ["step"]}}}),
         r"calculated_sections: invalid value 'step'; allowed: names of sections that have a timeout"),
        (None, "Is a directory"),
    ],
    ids=["truncated", "not-utf8", "not-a-state-dict", "wrong-type", "negative", "dangling-name", "directory"],
)
def test_a_bad_state_file_warns_and_falls_back_to_the_configured_timeouts(attached_monitor, sessions, tmp_path,
                                                                          content, message):
    state_file = tmp_path / "ft.json"
    if content is None:
        state_file.mkdir()
    elif isinstance(content, bytes):
        state_file.write_bytes(content)
    else:
        state_file.write_text(content)
    session, messages = sessions(state_file=state_file)
    assert session.load_state_file() is False
    assert len(messages.warn) == 1 and f"test: ignoring the timeouts in {state_file}: " in messages.warn[0]
    assert re.search(message, messages.warn[0]), messages.warn[0]
    assert not session.has_state and session.state_dict() == {}
    attached_monitor()
    session.client.init_workload_monitoring()
    assert session.client.section_timeouts.section == SECTIONS  # the configured values


def test_a_missing_state_file_is_a_first_run(sessions, tmp_path):
    session, messages = sessions(state_file=tmp_path / "none.json")
    assert session.load_state_file() is False
    assert messages.warn == messages.info == []


def test_restore_from_a_checkpoint_applies_at_once_or_warns(attached_monitor, sessions):
    monitor = attached_monitor()
    session, messages = sessions(connect=True)
    assert session.restore({"current_timeouts": {}}) is True  # NVRx's form while nothing was calculated
    assert session.restore({"timeouts": LEARNED}) is False
    assert len(messages.warn) == 1
    assert messages.warn[0].startswith("test: ignoring the timeouts in the checkpoint: not a fault tolerance "
                                       "state dict (expected {'current_timeouts': ")
    assert session.client.section_timeouts.section["step"] == 60.0
    assert session.restore({"current_timeouts": LEARNED}) is True
    assert session.client.section_timeouts.section["step"] == 123.0
    assert wait_for(lambda: updates(monitor)[1:], 10, "the restored values")[0]["timeouts"] == \
        session.client.state_dict()
    described = describe_timeouts(session.client.hb_timeouts, session.client.section_timeouts)
    assert messages.info[-1] == f"test: timeouts restored from the checkpoint: {described}"
    assert "step 123 s*" in described


def test_state_dict_is_empty_until_connected_or_restored(sessions):
    session, _ = sessions()
    assert session.state_dict() == {}
    session.restore({"current_timeouts": LEARNED})
    assert session.state_dict()["current_timeouts"]["section"]["section"] == {"step": 123.0}


# -- finished flag ------------------------------------------------------------------
def test_finished_flag_is_created_by_the_writer_only(sessions, tmp_path, monkeypatch):
    flag = tmp_path / "flags" / "done"
    reader, _ = sessions(writer=False)
    writer, messages = sessions()
    assert writer.write_finished_flag() is None  # FAULT_TOL_FINISHED_FLAG_FILE not set
    monkeypatch.setenv(FINISHED_FLAG_ENV, str(flag))
    assert reader.write_finished_flag() is None and not flag.exists()
    assert writer.write_finished_flag() == str(flag) and flag.exists()
    assert messages.info == [f"test: training is complete; created {flag}"]
