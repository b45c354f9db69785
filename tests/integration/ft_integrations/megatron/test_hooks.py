"""Megatron hooks against a real rank monitor: sections, warm-up, iteration, checkpoints, learning, state."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import time

import pytest
from helpers import kill_group, python_env, spawn_python, wait_for, wait_for_event

from ft_core.client import RankMonitorClientError
from ft_core.config import FaultToleranceConfig
from ft_core.event_file import read_events
from ft_core.utils.deadline import wait_until
from ft_integrations import megatron as ft

SECTIONS = {"setup": 60.0, "step": 60.0, "eval": 60.0, "checkpointing": 60.0}
TOKEN = "megatron-hooks-test-token"
ALL_HOOKS = [
    ("on_training_step_start", (0,)), ("on_training_step_end", ()), ("on_eval_step_start", ()),
    ("on_eval_step_end", ()), ("on_checkpointing_start", ()), ("on_checkpointing_end", (False,)),
    ("on_checkpoint_loaded", (False,)), ("state_dict", ()), ("load_state_dict", ({},)), ("shutdown", ()),
]


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN",
                 "TORCHELASTIC_RESTART_COUNT", ft.FINISHED_FLAG_ENV):
        monkeypatch.delenv(name, raising=False)
    ft.reset_state()
    yield
    ft.reset_state()


@pytest.fixture
def attached_monitor(start_monitor):
    """Start a monitor with ``FaultToleranceConfig(**overrides)`` and point this process at it."""
    # This process is the rank: a (learned, tiny) deadline it misses must not kill pytest, so the
    # termination signal is one it handles for the test.
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)

    def start(**overrides):
        defaults = {"rank_section_timeouts": SECTIONS, "safety_factor": 2.0,
                    "min_calculated_timeout": 0.01,  # the tests compare learned values to sub-second steps
                    "rank_termination_signal": "SIGUSR1",
                    "num_warmup_iterations": 0}  # the monitor's warm-up: the tests count Megatron's own
        return start_monitor(FaultToleranceConfig(**{**defaults, **overrides}), token=TOKEN, attach=True)

    yield start
    signal.signal(signal.SIGUSR1, previous)


def make_args(tmp_path=None, **overrides) -> argparse.Namespace:
    args = ft.add_ft_args(argparse.ArgumentParser()).parse_args(["--enable-ft"])
    args.save = str(tmp_path / "ckpt") if tmp_path is not None else None
    vars(args).update(overrides)
    return args


def events(monitor, name):
    return [e for e in read_events(monitor.events_path)[0] if e["event"] == name]


def run_steps(start: int, count: int) -> None:
    for iteration in range(start, start + count):
        ft.on_training_step_start(iteration)
        ft.on_training_step_end()


# -- without a monitor --------------------------------------------------------
def test_every_hook_is_a_noop_when_ft_is_disabled():
    ft.setup(argparse.Namespace(enable_ft_package=False))
    for name, call_args in ALL_HOOKS:
        getattr(ft, name)(*call_args)
    assert ft.state_dict() == {}
    ft.abort()
    assert ft.get_state().client is None


@pytest.mark.parametrize(("name", "call_args"), ALL_HOOKS)
def test_a_hook_before_setup_is_an_error_that_says_so(name, call_args):
    with pytest.raises(ft.FaultToleranceSetupError, match=rf"{name}\(\) was called before setup\(args\)"):
        getattr(ft, name)(*call_args)


def test_abort_before_setup_is_harmless_and_setup_runs_once():
    ft.abort()  # failure paths must never raise
    ft.setup(argparse.Namespace(enable_ft_package=False))
    with pytest.raises(ft.FaultToleranceSetupError, match="already called"):
        ft.setup(argparse.Namespace(enable_ft_package=False))


def test_enabled_without_a_monitor_fails_clearly():
    with pytest.raises(RankMonitorClientError, match="FT_RANK_MONITOR_IPC_SOCKET is not set"):
        ft.setup(make_args())


# -- with a monitor -----------------------------------------------------------
def test_sections_warmup_iteration_checkpoint_learning_and_shutdown(attached_monitor, tmp_path, monkeypatch):
    monitor = attached_monitor()
    flag = tmp_path / "flags" / "finished"
    monkeypatch.setenv(ft.FINISHED_FLAG_ENV, str(flag))
    ft.setup(make_args(tmp_path, calc_ft_timeouts=True, ft_num_warmup_iters=2, ft_calc_timeouts_after_iters=2))
    state = ft.get_state()
    client = state.client
    wait_for_event(monitor.events_path, 10, event="rank_connected", rank=0)
    assert state.in_setup and client.cfg.rank_section_timeouts == SECTIONS

    # Warm-up steps stay in "setup": slow ones must not be learned as "step".
    for iteration in range(2):
        ft.on_training_step_start(iteration)
        assert state.in_setup and not state.in_step
        time.sleep(0.4)
        ft.on_training_step_end()
    ft.on_training_step_start(2)
    assert state.in_step and not state.in_setup and state.iteration == 2
    ft.on_training_step_end()
    assert not state.in_step
    assert events(monitor, "timeouts_updated") == []  # 1 timed step < --ft-calc-timeouts-after-iters
    run_steps(3, 1)  # 2 timed steps: learn
    update = wait_for_event(monitor.events_path, 10, event="timeouts_updated", rank=0)
    learned = update["timeouts"]["current_timeouts"]["section"]
    assert learned["calculated_sections"] == ["step"]
    assert learned["section"]["step"] < 0.4 * 2.0  # the 0.4 s warm-up steps were not counted
    assert learned["section"]["setup"] == 60.0  # no checkpoint was loaded: setup is not learned

    ft.on_eval_step_start()
    ft.on_eval_step_end()
    ft.on_checkpointing_start()
    ft.on_checkpointing_end(is_async_finalization=False)  # default: steps completed (iteration 3 + 1)
    wait_for_event(monitor.events_path, 10, event="checkpoint_reported", rank=0, iteration=4)
    after_save = wait_for(lambda: events(monitor, "timeouts_updated")[1:], 10, "learning after the first save")
    assert after_save[0]["timeouts"]["current_timeouts"]["section"]["calculated_sections"] == [
        "checkpointing", "eval", "step"]
    saved = json.loads((tmp_path / "ckpt" / ft.FT_STATE_FILENAME).read_text())
    assert saved == ft.state_dict() == after_save[0]["timeouts"]

    ft.on_checkpointing_start()
    ft.on_checkpointing_end(is_async_finalization=True, iteration=8)  # async finalization: explicit iteration
    wait_for_event(monitor.events_path, 10, event="checkpoint_reported", rank=0, iteration=8)
    assert len(events(monitor, "timeouts_updated")) == 2  # learned after the *first* save only

    ft.shutdown(training_finished=True)
    disconnected = wait_for_event(monitor.events_path, 10, event="rank_disconnected", rank=0)
    assert disconnected["graceful"] is True and disconnected["training_finished"] is True  # for ft_launcher
    assert len(events(monitor, "timeouts_updated")) == 3  # the final calculation at shutdown
    assert flag.exists()
    run_steps(5, 1)  # hooks after shutdown are no-ops
    assert ft.state_dict() == {}


def test_state_round_trip_through_the_checkpoint_and_setup_learned_after_a_load(attached_monitor, tmp_path):
    monitor = attached_monitor()
    ft.setup(make_args(calc_ft_timeouts=True, ft_num_warmup_iters=0, ft_calc_timeouts_after_iters=1))
    run_steps(0, 2)
    saved = ft.state_dict()
    assert saved["current_timeouts"]["section"]["calculated_sections"] == ["step"]
    ft.shutdown()

    ft.reset_state()
    ft.setup(make_args(calc_ft_timeouts=True, ft_num_warmup_iters=1, ft_calc_timeouts_after_iters=1))
    client = ft.get_state().client
    assert client.section_timeouts.section["step"] == 60.0  # no state file, nothing loaded yet
    before = len(events(monitor, "timeouts_updated"))
    ft.load_state_dict(saved)
    ft.on_checkpoint_loaded(is_local_chkpt=False)
    assert ft.state_dict() == saved  # the same values, sent to the monitor at once
    restored = wait_for(lambda: events(monitor, "timeouts_updated")[before:], 10, "restored timeouts")
    assert restored[0]["timeouts"] == saved
    run_steps(0, 2)  # warm-up, then one timed step: learn, now including "setup"
    assert "setup" in ft.state_dict()["current_timeouts"]["section"]["calculated_sections"]
    ft.load_state_dict(None)  # a checkpoint without FT state is fine


def test_state_file_in_the_save_dir_is_sent_with_the_handshake(attached_monitor, tmp_path):
    attached_monitor()
    state = {"current_timeouts": {
        "heartbeat": {"initial": 3600.0, "subsequent": 2700.0, "were_calculated": False},
        "section": {"section": {"step": 123.0}, "out_of_section": None, "calculated_sections": ["step"],
                    "is_out_of_section_calculated": False}}}
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / ft.FT_STATE_FILENAME).write_text(json.dumps(state))
    ft.setup(make_args(tmp_path))
    assert ft.get_state().client.section_timeouts.section == {**SECTIONS, "step": 123.0}


def test_invalid_timeouts_in_the_state_file_or_checkpoint_are_ignored_with_a_warning(attached_monitor, tmp_path,
                                                                                      caplog):
    attached_monitor()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / ft.FT_STATE_FILENAME).write_text(json.dumps(
        {"current_timeouts": {"section": {"section": {"step": -1}}}}))
    with caplog.at_level(logging.WARNING, logger="ft_integrations.megatron"):
        ft.setup(make_args(tmp_path))
        ft.load_state_dict({"current_timeouts": {"heartbeat": {"initial": "soon"}}})  # training goes on
    assert ft.get_state().client.section_timeouts.section == SECTIONS  # the configured values
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("ignoring the timeouts in" in w and "section.step: invalid value -1" in w for w in warnings)
    assert any("ignoring the timeouts in the checkpoint" in w and "initial: invalid value 'soon'" in w
               for w in warnings)


def test_abort_disconnects_without_learning(attached_monitor, tmp_path):
    monitor = attached_monitor()
    ft.setup(make_args(tmp_path, calc_ft_timeouts=True, ft_num_warmup_iters=0, ft_calc_timeouts_after_iters=5))
    run_steps(0, 2)
    ft.on_training_step_start(2)
    ft.abort()  # inside an open step, as after an exception
    disconnected = wait_for_event(monitor.events_path, 10, event="rank_disconnected", rank=0)
    assert disconnected["graceful"] is True and "training_finished" not in disconnected  # not a finished run
    assert events(monitor, "timeouts_updated") == []
    assert not (tmp_path / "ckpt" / ft.FT_STATE_FILENAME).exists()
    run_steps(3, 1)  # no-ops afterwards
    ft.abort()


def test_eval_hooks_use_validation_when_only_that_section_is_tracked(attached_monitor):
    attached_monitor(rank_section_timeouts={"step": 60.0, "validation": 60.0})
    ft.setup(make_args(calc_ft_timeouts=True, ft_num_warmup_iters=0))
    assert ft.get_state().eval_section == "validation"
    run_steps(0, 1)
    ft.on_eval_step_start()
    ft.on_eval_step_end()
    client = ft.get_state().client
    ft.shutdown()  # learns: validation was observed
    assert "validation" in client.section_timeouts.calculated_sections


# -- a rank in its own process: what the monitor detects ------------------------------
WORKER = """
import argparse, sys, time
from ft_integrations import megatron as ft
warmup, hang_at, steps, linger = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
ft.setup(argparse.Namespace(enable_ft_package=True, ft_num_warmup_iters=warmup, save=None))
for iteration in range(steps):
    ft.on_training_step_start(iteration)
    if iteration == hang_at:
        time.sleep(600)
    ft.on_training_step_end()
time.sleep(linger)
ft.shutdown()
"""


def run_worker(monitor, *argv: object):
    env = python_env(FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path, FT_MONITOR_TOKEN=TOKEN, RANK="0")
    return spawn_python(["-c", WORKER, *map(str, argv)], env=env)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("hang_at", "section"), [(3, "step"), (1, "setup")])
def test_a_hang_is_caught_in_step_after_warmup_and_in_setup_during_it(attached_monitor, hang_at, section):
    monitor = attached_monitor(rank_section_timeouts={"setup": 1.5, "step": 1.0}, stack_dump_timeout=0.2,
                            rank_termination_signal="SIGKILL")
    proc = run_worker(monitor, 2, hang_at, 5, 0)
    try:
        hang = wait_for_event(monitor.events_path, 60, event="hang_detected")
        assert (hang["reason"], hang["section"], hang["iteration"]) == ("section", section, hang_at)
        assert proc.wait(timeout=30) == -9
    finally:
        kill_group(proc)


@pytest.mark.timeout(120)
def test_heartbeats_are_sent_when_no_section_is_tracked(attached_monitor):
    monitor = attached_monitor(rank_section_timeouts={}, initial_rank_heartbeat_timeout=2.0,
                            rank_heartbeat_timeout=None)
    proc = run_worker(monitor, 0, -1, 1, 3.0)  # one step, then quiet for longer than the initial timeout
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        kill_group(proc)
    assert events(monitor, "hang_detected") == []


# -- straggler phases -----------------------------------------------------------
def test_timed_is_a_noop_when_ft_is_disabled_and_an_error_before_setup():
    with pytest.raises(ft.FaultToleranceSetupError, match=r"timed\(\) was called before setup\(args\)"):
        with ft.timed("data"):
            pass
    ft.setup(argparse.Namespace(enable_ft_package=False))
    with ft.timed("data"):
        pass


def test_timed_phases_reach_the_monitor_as_medians(attached_monitor, tmp_path):
    monitor = attached_monitor(straggler_report_interval=0.2)
    ft.setup(make_args(tmp_path))
    wait_for_event(monitor.events_path, 10, event="rank_connected", rank=0)
    rounds = []

    def one_more_step():
        with ft.timed("data"):
            time.sleep(0.01)
        rounds[:] = events(monitor, "phase_medians")
        return rounds

    assert wait_until(one_more_step, 10, interval=0.0), "no phase_medians round within 10 s"
    assert rounds[0]["medians"][0]["rank"] == 0 and rounds[0]["medians"][0]["phase"] == "data"
    assert rounds[0]["medians"][0]["median"] >= 0.01
    ft.shutdown()


def test_step_durations_reach_the_monitor_as_the_straggler_floor_reference(attached_monitor, tmp_path):
    # The `step` section's durations come back in phase_medians under "step": the launchers' judge
    # never scores it, it sets the relative floor (5 % of the step) of the phases it does score.
    monitor = attached_monitor(straggler_report_interval=0.2)
    ft.setup(make_args(tmp_path, ft_num_warmup_iters=0))
    wait_for_event(monitor.events_path, 10, event="rank_connected", rank=0)
    steps = []

    def one_more_step():
        ft.on_training_step_start(len(steps))
        time.sleep(0.02)
        ft.on_training_step_end()
        steps.append(1)
        return [m for e in events(monitor, "phase_medians") for m in e["medians"] if m["phase"] == "step"]

    medians = wait_until(one_more_step, 10, interval=0.0)
    assert medians, "no step median within 10 s"
    assert medians[0]["rank"] == 0 and 0.02 <= medians[0]["median"] < 10
    ft.shutdown()


@pytest.mark.parametrize("async_save", [True, False], ids=["async_save", "sync_save"])
def test_megatron_lm_progress_is_a_complete_persistent_checkpoint(attached_monitor, tmp_path, async_save):
    # Megatron-LM's semantics (the drop-in): an --async-save save is only scheduled when its
    # on_checkpointing_end(False) comes, and a non-persistent (node-local) save is no progress. Progress
    # is Megatron-LM's tracker, which it writes once a persistent checkpoint is complete.
    monitor = attached_monitor()
    tracker = tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    tracker.parent.mkdir()
    tracker.write_text("2")  # resumed from iteration 2: no progress of this run
    ft.setup(make_args(tmp_path, async_save=async_save), megatron_lm=True)
    wait_for_event(monitor.events_path, 10, event="rank_connected", rank=0)
    run_steps(2, 2)
    ft.on_checkpointing_start()
    ft.on_checkpointing_end(is_async_finalization=False)  # iteration 4 scheduled (async) or node-local (sync)
    for step in range(4, 8):
        run_steps(step, 1)
        if async_save:  # Megatron-LM tries to finalize every iteration; nothing is complete yet
            ft.on_checkpointing_start()
            ft.on_checkpointing_end(is_async_finalization=True)
    ft.on_checkpointing_start()
    if not async_save:
        tracker.write_text("8")  # a synchronous persistent save writes the tracker itself
    ft.on_checkpointing_end(is_async_finalization=False)  # iteration 8: persistent
    if async_save:
        tracker.write_text("8")  # written by the finalization of the async save
        ft.on_checkpointing_start()
        ft.on_checkpointing_end(is_async_finalization=True)
    wait_for_event(monitor.events_path, 10, event="checkpoint_reported", rank=0, iteration=8)
    assert [e["iteration"] for e in events(monitor, "checkpoint_reported")] == [8]
