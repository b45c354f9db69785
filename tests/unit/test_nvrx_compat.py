"""NVRx compatibility of the client's state and data classes, without a monitor.

The fixtures below are written by hand in the exact form NVRx's
``RankMonitorClient.state_dict()`` produces: ``{"current_timeouts": {}}``
until something was calculated; ``"heartbeat"`` only once heartbeat timeouts
were calculated (``dataclasses.asdict(HeartbeatTimeouts)``); ``"section"``
only once a section or the out-of-section timeout was calculated
(``dataclasses.asdict(SectionTimeouts)`` with ``calculated_sections`` as a
sorted list). NVRx's own config values ride along in ``"section"``.
"""

from __future__ import annotations

import json
import logging
import math

import pytest

from ft_core.client import LauncherUnavailableError, RankMonitorClient, RankMonitorClientError
from ft_core.data import WorkloadAction, WorkloadControlRequest
from ft_core.timeouts import (
    HeartbeatTimeouts,
    InvalidTimeoutsError,
    SectionTimeouts,
    apply_calculated,
    timeouts_from_state_dict,
    timeouts_state_dict,
)
from ft_core.timeouts_calc import SectionAction, TimeoutsCalc, TimeoutsCalcError

NVRX_NOTHING_CALCULATED = {"current_timeouts": {}}
NVRX_HEARTBEAT_ONLY = {"current_timeouts": {
    "heartbeat": {"initial": 310.5, "subsequent": 42.25, "were_calculated": True}}}
NVRX_SECTION_ONLY = {"current_timeouts": {
    "section": {"section": {"setup": 600.0, "step": 12.5, "checkpointing": None},
                "out_of_section": 30.0, "calculated_sections": ["step"], "is_out_of_section_calculated": True}}}
NVRX_BOTH = {"current_timeouts": {
    **NVRX_HEARTBEAT_ONLY["current_timeouts"], **NVRX_SECTION_ONLY["current_timeouts"]}}


# -- 1. NVRx state dicts load (any subset of current_timeouts) ---------------
@pytest.mark.parametrize("state", [NVRX_NOTHING_CALCULATED, NVRX_HEARTBEAT_ONLY, NVRX_SECTION_ONLY, NVRX_BOTH],
                         ids=["nothing", "heartbeat", "section", "both"])
def test_nvrx_state_dicts_load_before_init_and_come_back_unchanged(state):
    client = RankMonitorClient()
    client.load_state_dict(json.loads(json.dumps(state)))  # exactly what a JSON checkpoint gives back
    assert client.state_dict() == state


def test_partial_states_apply_only_what_they_carry():
    config_hb = HeartbeatTimeouts(3600.0, 2700.0)
    config_sections = SectionTimeouts({"setup": 60.0, "step": 180.0, "checkpointing": None}, None)
    hb, sections = apply_calculated(config_hb, config_sections, NVRX_HEARTBEAT_ONLY)
    assert hb == HeartbeatTimeouts(310.5, 42.25, True)
    assert sections == config_sections
    hb, sections = apply_calculated(config_hb, config_sections, NVRX_SECTION_ONLY)
    assert hb == config_hb
    # Only calculated values apply: NVRx's "setup: 600" is a copy of its config, ours says 60.
    assert sections.section == {"setup": 60.0, "step": 12.5, "checkpointing": None}
    assert sections.out_of_section == 30.0
    assert sections.calculated_sections == {"step"} and sections.is_out_of_section_calculated
    assert apply_calculated(config_hb, config_sections, NVRX_NOTHING_CALCULATED) == (config_hb, config_sections)


def test_a_state_without_current_timeouts_is_ignored_with_a_warning(caplog):
    client = RankMonitorClient()
    client.load_state_dict(NVRX_SECTION_ONLY)
    with caplog.at_level(logging.WARNING, logger="ft_core.client"):
        client.load_state_dict({"model": {}, "optimizer": {}})
    assert "current_timeouts" in caplog.text and "nothing loaded" in caplog.text
    assert client.state_dict() == NVRX_SECTION_ONLY  # what was loaded before is kept


def test_partial_loads_before_init_accumulate_like_nvrx():
    client = RankMonitorClient()
    client.load_state_dict(NVRX_HEARTBEAT_ONLY)
    client.load_state_dict(NVRX_SECTION_ONLY)
    client.load_state_dict(NVRX_NOTHING_CALCULATED)
    assert client.state_dict() == NVRX_BOTH


# -- 2. validation: nothing that could kill falsely or disable detection -----
BAD_VALUES = [("a string", "30"), ("NaN", math.nan), ("infinity", math.inf), ("zero", 0), ("negative", -5.0),
              ("a bool", True), ("a list", [1.0])]


@pytest.mark.parametrize(("what", "value"), BAD_VALUES, ids=[w for w, _ in BAD_VALUES])
@pytest.mark.parametrize("where", ["heartbeat.initial", "heartbeat.subsequent", "section.section.step",
                                   "section.out_of_section"])
def test_bad_timeout_values_are_rejected_naming_key_value_and_what_is_allowed(what, value, where):
    state = json.loads(json.dumps(NVRX_BOTH))
    node = state["current_timeouts"]
    *path, leaf = where.split(".")
    for key in path:
        node = node[key]
    node[leaf] = value
    client = RankMonitorClient()
    with pytest.raises(RankMonitorClientError) as raised:
        client.load_state_dict(state)
    message = str(raised.value)
    assert f"current_timeouts.{where}" in message
    assert repr(value) in message
    assert "positive finite number of seconds" in message
    assert client.state_dict() == NVRX_NOTHING_CALCULATED  # nothing half-loaded


@pytest.mark.parametrize(("state", "key", "allowed"), [
    ({"current_timeouts": []}, "current_timeouts", "mapping"),
    ({"current_timeouts": {"heartbeat": "fast"}}, "current_timeouts.heartbeat", "mapping"),
    ({"current_timeouts": {"heartbeat": {"initial": 1.0, "subsequent": 1.0, "were_calculated": "yes"}}},
     "current_timeouts.heartbeat.were_calculated", "true or false"),
    ({"current_timeouts": {"heartbeat": {"initial": 1.0, "subsequent": 1.0, "were_calculated": True,
                                         "extra": 1}}}, "current_timeouts.heartbeat", "initial"),
    ({"current_timeouts": {"heartbeat": {"initial": 5.0, "subsequent": None, "were_calculated": True}}},
     "current_timeouts.heartbeat.subsequent", "calculated"),
    ({"current_timeouts": {"section": {"section": {"step": 1.0}, "out_of_section": None,
                                       "calculated_sections": "step", "is_out_of_section_calculated": False}}},
     "current_timeouts.section.calculated_sections", "list"),
    ({"current_timeouts": {"section": {"section": {"step": 1.0}, "out_of_section": None,
                                       "calculated_sections": ["eval"], "is_out_of_section_calculated": False}}},
     "current_timeouts.section.calculated_sections", "eval"),
    ({"current_timeouts": {"section": {"section": {"step": None}, "out_of_section": None,
                                       "calculated_sections": ["step"], "is_out_of_section_calculated": False}}},
     "current_timeouts.section.section.step", "calculated"),
    ({"current_timeouts": {"section": {"section": {"step": 1.0}, "out_of_section": None,
                                       "calculated_sections": [], "is_out_of_section_calculated": True}}},
     "current_timeouts.section.out_of_section", "calculated"),
    ({"current_timeouts": {"section": {"section": {3: 1.0}, "out_of_section": None,
                                       "calculated_sections": [], "is_out_of_section_calculated": False}}},
     "current_timeouts.section.section", "non-empty strings"),
], ids=["not-a-mapping", "heartbeat-not-a-mapping", "flag-not-bool", "unknown-key", "calculated-none",
        "calculated-sections-a-string", "calculated-without-value", "calculated-section-none",
        "calculated-oos-none", "section-name-not-str"])
def test_malformed_states_are_rejected(state, key, allowed):
    with pytest.raises(RankMonitorClientError) as raised:
        RankMonitorClient().load_state_dict(state)
    assert key in str(raised.value) and allowed in str(raised.value)


def test_a_calculated_heartbeat_state_may_keep_no_initial_timeout():
    # A fresh start learns `subsequent` but keeps a configured `initial` of None (no timeout):
    # the delay to its first heartbeat says nothing about a resume's.
    state = {"current_timeouts": {"heartbeat": {"initial": None, "subsequent": 5.0, "were_calculated": True}}}
    client = RankMonitorClient()
    client.load_state_dict(state)
    assert client.state_dict() == state


def test_a_state_that_is_not_a_mapping_is_rejected():
    with pytest.raises(RankMonitorClientError, match="mapping"):
        RankMonitorClient().load_state_dict(["current_timeouts"])  # type: ignore[arg-type]


def test_the_data_classes_refuse_values_the_monitor_must_never_get():
    # The client builds everything it sends from these classes, so it cannot send a bad value.
    with pytest.raises(InvalidTimeoutsError, match=r"HeartbeatTimeouts.subsequent.*nan"):
        HeartbeatTimeouts(10.0, math.nan)
    with pytest.raises(InvalidTimeoutsError, match=r"SectionTimeouts.section.step.*-1"):
        SectionTimeouts({"step": -1})
    with pytest.raises(InvalidTimeoutsError, match=r"SectionTimeouts.out_of_section.*'5'"):
        SectionTimeouts({}, "5")
    assert HeartbeatTimeouts(1, 2).initial == 1.0 and isinstance(HeartbeatTimeouts(1, 2).initial, float)


# -- 3. attributes and data-class semantics ----------------------------------
def test_timeouts_attributes_are_none_before_init():
    client = RankMonitorClient()
    assert client.hb_timeouts is None and client.section_timeouts is None
    assert client.CURRENT_TIMEOUTS_STATE_KEY == "current_timeouts"
    assert client.state_dict() == NVRX_NOTHING_CALCULATED


def test_are_valid_and_were_calculated_match_nvrx():
    assert HeartbeatTimeouts(1.0, 2.0).are_valid
    assert not HeartbeatTimeouts(1.0, None).are_valid and not HeartbeatTimeouts().are_valid
    full = SectionTimeouts({"a": 1.0, "b": 2.0}, 3.0, ["a", "b"], True)
    assert full.are_valid and full.were_calculated
    assert not SectionTimeouts({"a": 1.0, "b": None}, 3.0).are_valid
    assert not SectionTimeouts({"a": 1.0}, None).are_valid
    assert SectionTimeouts({}, 1.0).are_valid
    # were_calculated: *every* section and the out-of-section timeout were calculated.
    assert not SectionTimeouts({"a": 1.0, "b": 2.0}, 3.0, ["a"], True).were_calculated
    assert not SectionTimeouts({"a": 1.0}, 3.0, ["a"], False).were_calculated
    assert SectionTimeouts({}, 3.0, [], True).were_calculated


def test_calculated_sections_is_a_set_and_serializes_as_a_sorted_list():
    sections = SectionTimeouts({"b": 1.0, "a": 2.0}, None, ["b", "a", "b"])
    assert sections.calculated_sections == {"a", "b"}
    assert sections.to_dict()["calculated_sections"] == ["a", "b"]
    assert SectionTimeouts.from_dict(sections.to_dict()) == sections
    # NVRx initialises calculated_sections with a dict literal ({}); that works too.
    assert SectionTimeouts({}, None, {}).calculated_sections == set()


def test_state_dict_has_nvrx_shape():
    hb = HeartbeatTimeouts(3600.0, 2700.0)  # config values: not in the state
    sections = SectionTimeouts({"step": 180.0}, None)
    assert timeouts_state_dict(hb, sections) == NVRX_NOTHING_CALCULATED
    assert timeouts_state_dict(None, None) == NVRX_NOTHING_CALCULATED
    hb, sections = timeouts_from_state_dict(NVRX_BOTH)
    assert timeouts_state_dict(hb, sections) == NVRX_BOTH
    with pytest.raises(ValueError, match="current_timeouts"):
        timeouts_from_state_dict({"heartbeat": {}})


# -- 4. warm-up -------------------------------------------------------------
def test_init_rejects_a_bad_num_warmup_iters_before_connecting(monkeypatch):
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)
    for bad in (-1, 2.5, "5", True):
        with pytest.raises(RankMonitorClientError, match=rf"num_warmup_iters.*{bad!r}.*integer >= 0"):
            RankMonitorClient().init_workload_monitoring(num_warmup_iters=bad)  # type: ignore[arg-type]


def test_warmup_steps_are_learned_as_the_warmup_section():
    calc = TimeoutsCalc(safety_factor=2.0, start_time=0.0, num_warmup_iterations=2,
                        sections={"step": None, "warmup": None})
    for it, (start, duration) in enumerate(((0.0, 50.0), (60.0, 40.0), (100.0, 1.0), (102.0, 2.0))):
        calc.update_on_section_start("step", now=start, iteration=it)
        calc.update_on_section_end("step", now=start + duration)
    assert calc.section_max == {"warmup": 50.0, "step": 2.0}


# -- 5. learning: merge rule --------------------------------------------------
def _learned_step(calc: TimeoutsCalc, current: SectionTimeouts, durations, start=0.0) -> SectionTimeouts:
    for duration in durations:
        calc.update_on_section_start("step", now=start)
        start += duration
        calc.update_on_section_end("step", now=start)
    result = calc.calculate_section_timeouts(current, ["step"], calc_out_of_section=False, now=start)
    assert result is not None
    return result


def test_merge_is_nvrx_exponential_average():
    calc = TimeoutsCalc(safety_factor=2.0, start_time=0.0, min_timeout=0.1)
    previous = SectionTimeouts({"step": 40.0}, None, ["step"])
    assert _learned_step(calc, previous, [5.0]).section["step"] == 0.5 * 40.0 + 0.5 * 10.0
    config = SectionTimeouts({"step": 40.0}, None)  # not calculated: replaced, not averaged
    assert _learned_step(TimeoutsCalc(2.0, start_time=0.0), config, [5.0]).section["step"] == 10.0


def test_merge_never_goes_below_the_largest_interval_observed_nor_the_minimum():
    # safety factor 1: NVRx's average of 2 (loaded) and 10 (observed) is 6 < 10 already seen.
    calc = TimeoutsCalc(safety_factor=1.0, start_time=0.0, min_timeout=0.1)
    assert _learned_step(calc, SectionTimeouts({"step": 2.0}, None, ["step"]), [10.0]).section["step"] == 10.0
    # A safety factor below 1 cannot produce a timeout shorter than what the run survived.
    assert _learned_step(TimeoutsCalc(0.5, start_time=0.0), SectionTimeouts({"step": 9.0}), [4.0]).section[
        "step"] == 4.0
    # A tiny loaded value averaged with a tiny observation stays at min_calculated_timeout.
    floor = TimeoutsCalc(safety_factor=2.0, start_time=0.0, min_timeout=1.0)
    assert _learned_step(floor, SectionTimeouts({"step": 0.01}, None, ["step"]), [0.1]).section["step"] == 1.0


def test_heartbeat_merge_uses_the_same_rule():
    calc = TimeoutsCalc(safety_factor=1.0, start_time=0.0, min_timeout=0.1)
    for t in (3.0, 4.0, 9.0):
        calc.update_on_heartbeat(hb_time=t)
    hb = calc.calculate_hb_timeouts(HeartbeatTimeouts(100.0, 1.0, True))
    assert hb == HeartbeatTimeouts(initial=51.5, subsequent=5.0, were_calculated=True)


def test_the_out_of_section_interval_still_running_counts():
    calc = TimeoutsCalc(safety_factor=2.0, start_time=0.0, min_timeout=0.1)
    calc.update_on_section_start("step", now=1.0)
    calc.update_on_section_end("step", now=2.0)
    # 7 s out of every section and still counting when the calculation runs.
    result = calc.calculate_section_timeouts(SectionTimeouts({"step": None}), ["step"], now=9.0)
    assert result.out_of_section == 14.0
    # Opening a section ends the interval (7.5 s); while it is open nothing more is counted.
    calc.update_on_section_start("step", now=9.5)
    again = calc.calculate_section_timeouts(result, ["step"], calc_out_of_section=True, now=50.0)
    # The average of 14 and 2 * 7.5 is below 2 * 7.5, the job-life floor: the floor wins.
    assert again.out_of_section == 15.0


# -- 7. workload control ------------------------------------------------------
def test_workload_action_values_are_nvrx_values():
    assert {a.name: a.value for a in WorkloadAction} == {"Continue": 0, "ExcludeThisNode": 1, "ShutdownWorkload": 2}
    request = WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "bad GPU")
    request.description = "bad NIC"  # mutable, as NVRx's plain class
    assert (request.action, request.description) == (WorkloadAction.ExcludeThisNode, "bad NIC")


def test_workload_control_without_launcher_is_a_runtime_error_and_a_client_error(monkeypatch):
    monkeypatch.delenv("FT_LAUNCHER_IPC_SOCKET", raising=False)
    client = RankMonitorClient()
    request = WorkloadControlRequest(WorkloadAction.ShutdownWorkload)
    for expected in (RuntimeError, RankMonitorClientError, LauncherUnavailableError):
        with pytest.raises(expected, match="FT_LAUNCHER_IPC_SOCKET"):
            client.send_workload_control_request(request)


# -- 8. TimeoutsCalc's NVRx API: a thin layer over the same observations and merge rule ------------------
def _sections_calc(**kwargs) -> TimeoutsCalc:
    return TimeoutsCalc(sections=["fwd", "save"], start_time=kwargs.pop("start_time", 0.0),
                        safety_factor=kwargs.pop("safety_factor", 2.0), **kwargs)


def test_nvrx_heartbeat_api_needs_data_then_merges_with_a_calculated_current():
    calc = TimeoutsCalc(start_time=0.0, safety_factor=3.0)
    assert not calc.can_get_hb_timeouts()
    with pytest.raises(TimeoutsCalcError, match="not enough data"):
        calc.get_hb_timeouts()
    for t in (4.0, 5.0, 7.0):
        calc.update_on_heartbeat(hb_time=t)
    assert calc.can_get_hb_timeouts()
    assert calc.get_hb_timeouts() == HeartbeatTimeouts(12.0, 6.0, True)
    assert calc.get_hb_timeouts(current=HeartbeatTimeouts(50.0, 50.0)) == HeartbeatTimeouts(12.0, 6.0, True)
    assert calc.get_hb_timeouts(current=HeartbeatTimeouts(20.0, 10.0, True)) == HeartbeatTimeouts(16.0, 8.0, True)


def test_nvrx_section_events_are_checked_and_close_all_ends_every_open_section():
    calc = _sections_calc(start_time=1.0)
    with pytest.raises(TimeoutsCalcError, match="unknown section 'eval'"):
        calc.update_on_section_event("eval", SectionAction.OPEN, event_time=2.0)
    calc.update_on_section_event("fwd", SectionAction.OPEN, event_time=3.0)  # 2 s out of sections
    with pytest.raises(TimeoutsCalcError, match="already open"):
        calc.update_on_section_event("fwd", SectionAction.OPEN, event_time=4.0)
    with pytest.raises(TimeoutsCalcError, match="not open"):
        calc.update_on_section_event("save", SectionAction.CLOSE, event_time=4.0)
    calc.update_on_section_event("save", SectionAction.OPEN, event_time=5.0)
    assert not calc.is_out_of_section
    calc.update_on_section_event(None, SectionAction.CLOSE_ALL, event_time=9.0)
    assert calc.is_out_of_section
    assert calc.get_section_timeouts() == SectionTimeouts({"fwd": 12.0, "save": 8.0}, 4.0, {"fwd", "save"}, True)
    calc.maybe_bump_oos_time(curr_time=19.0)  # 10 s out of sections, still running
    assert calc.get_section_timeouts().out_of_section == 20.0


def test_nvrx_selected_sections_and_current_values():
    calc = _sections_calc()
    calc.update_on_section_event("fwd", SectionAction.OPEN, event_time=1.0)
    calc.update_on_section_event("fwd", SectionAction.CLOSE, event_time=3.0)
    assert not calc.can_get_section_timeouts()  # "save" has no data
    assert calc.can_get_section_timeouts(["fwd"]) and not calc.can_get_section_timeouts(["save"], False)
    with pytest.raises(TimeoutsCalcError):
        calc.get_section_timeouts()
    assert calc.get_section_timeouts(["fwd"]) == SectionTimeouts({"fwd": 4.0, "save": None}, 2.0, {"fwd"}, True)
    current = SectionTimeouts({"fwd": 10.0, "save": 30.0}, 6.0, {"save"}, True)
    # "fwd" was not calculated: replaced; "save" not selected: kept; out of section: averaged.
    assert calc.get_section_timeouts(["fwd"], current=current) == SectionTimeouts(
        {"fwd": 4.0, "save": 30.0}, 4.0, {"fwd", "save"}, True)
    assert calc.get_section_timeouts(["fwd"], calc_out_of_section=False) == SectionTimeouts(
        {"fwd": 4.0, "save": None}, None, {"fwd"})


def test_nvrx_merge_keeps_the_floor_under_the_longest_interval_observed():
    # NVRx's plain average of 2 s (calculated) and 10 s (observed x 1) would be 6 s: shorter than a step seen.
    calc = _sections_calc(safety_factor=1.0)
    calc.update_on_section_event("fwd", SectionAction.OPEN, event_time=1.0)
    calc.update_on_section_event("fwd", SectionAction.CLOSE, event_time=11.0)
    current = SectionTimeouts({"fwd": 2.0, "save": None}, None, {"fwd"})
    assert calc.get_section_timeouts(["fwd"], False, current).section["fwd"] == 10.0
    # NVRx's merge of two given timeouts (no observation to floor it) is the plain average.
    merged = TimeoutsCalc._get_merged_section_timeouts(SectionTimeouts({"fwd": 10.0}, 4.0, {"fwd"}, True), current)
    assert merged == SectionTimeouts({"fwd": 6.0}, 4.0, {"fwd"}, True)


def test_nvrx_synchronize_all_needs_a_process_group():
    with pytest.raises(TimeoutsCalcError, match="process group"):
        TimeoutsCalc().synchronize_all()


def test_nvrx_sections_from_a_set_are_ordered_the_same_in_every_process():
    assert TimeoutsCalc(sections={"b", "c", "a"}).sections == ("a", "b", "c")
    assert TimeoutsCalc(sections=["b", "a"]).sections == ("b", "a")  # NVRx's order when given as a list


def test_nvrx_names_of_the_megatron_lookup_find_megatron_before_init_and_follow_its_iteration(monkeypatch):
    # NVRx's client finds Megatron-LM's global_vars at construction and reads curr_iteration from its args once
    # Megatron-LM set them (NVRx's own unit tests read these private names); ours answers under the same names.
    import sys
    from types import SimpleNamespace

    monkeypatch.delitem(sys.modules, "megatron.training.global_vars", raising=False)
    without = RankMonitorClient()
    assert without._workload_global_vars_module is None and without._cached_workload_args is None
    assert not without._can_report_iterations() and without._get_current_iteration() is None

    global_vars = SimpleNamespace()
    monkeypatch.setitem(sys.modules, "megatron.training.global_vars", global_vars)
    client = RankMonitorClient()
    assert client._workload_global_vars_module is global_vars and client._can_report_iterations()
    assert client._get_current_iteration() is None and client._cached_workload_args is None  # not set yet
    args = global_vars._GLOBAL_ARGS = SimpleNamespace(curr_iteration=200)
    assert client._get_current_iteration() == 200 and client._cached_workload_args is args
    args.curr_iteration = 300
    assert client._get_current_iteration() == 300
    assert client._current_iteration() == 300  # what heartbeats and exception reports carry
    client.set_iteration(7)
    assert client._current_iteration() == 7  # set_iteration wins, as before
