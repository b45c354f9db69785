"""Timeouts in force and learned state: state dicts, what applies, the job-life floor over many resumes.

NVRx-compatibility details (state-dict shapes, validation, warm-up) are in test_nvrx_compat_unit.py.
"""

from __future__ import annotations

import pytest

from ft_core.timeouts import (
    HeartbeatTimeouts,
    InvalidTimeoutsError,
    JobLife,
    SectionTimeouts,
    apply_calculated,
    job_life_from_state_dict,
    timeouts_from_state_dict,
    timeouts_state_dict,
)
from ft_core.timeouts_calc import TimeoutsCalc


def _calc(**kwargs) -> TimeoutsCalc:
    return TimeoutsCalc(safety_factor=kwargs.pop("safety_factor", 2.0), start_time=0.0, **kwargs)


def test_state_dict_round_trip_and_apply_only_calculated():
    hb = HeartbeatTimeouts(10.0, 5.0, True)
    sections = SectionTimeouts({"step": 3.0, "setup": 60.0}, 4.0, ["step"], True)
    state = timeouts_state_dict(hb, sections)
    assert state == {"current_timeouts": {
        "heartbeat": {"initial": 10.0, "subsequent": 5.0, "were_calculated": True},
        "section": {"section": {"step": 3.0, "setup": 60.0}, "out_of_section": 4.0,
                    "calculated_sections": ["step"], "is_out_of_section_calculated": True}}}
    assert timeouts_from_state_dict(state) == (hb, sections)
    new_hb, new_sections = apply_calculated(HeartbeatTimeouts(1.0, 1.0), SectionTimeouts({"setup": 9.0}), state)
    assert new_hb == hb
    # "setup" was not calculated in the saved run: the current config value stays.
    assert new_sections.section == {"setup": 9.0, "step": 3.0}
    assert new_sections.out_of_section == 4.0
    with pytest.raises(ValueError, match="current_timeouts"):
        timeouts_from_state_dict({"heartbeat": {}})


def test_nvrx_state_dicts_without_a_calculated_part_load_as_nothing_calculated():
    # NVRx leaves out "heartbeat"/"section" until that kind was calculated.
    # A part that is left out is None: nothing of that kind is applied.
    assert timeouts_from_state_dict({"current_timeouts": {}}) == (None, None)
    hb, sections = timeouts_from_state_dict({"current_timeouts": {"section": {
        "section": {"step": 5.0}, "out_of_section": None, "calculated_sections": ["step"],
        "is_out_of_section_calculated": False}}})
    assert hb is None and sections is not None and sections.section == {"step": 5.0}


@pytest.mark.parametrize(
    ("current", "message"),
    [
        ({"heartbeat": {"initial": "60"}}, r"current_timeouts\.heartbeat\.initial: invalid value '60'; allowed: a positive finite number"),
        ({"heartbeat": {"subsequent": float("nan")}}, r"heartbeat\.subsequent: invalid value nan"),
        ({"heartbeat": {"were_calculated": "yes"}}, r"heartbeat\.were_calculated: invalid value 'yes'.*true or false"),
        ({"heartbeat": []}, r"current_timeouts\.heartbeat: invalid value \[\]; allowed: a mapping"),
        ({"section": {"section": {"step": 0}}}, r"section\.section\.step: invalid value 0"),
        ({"section": {"section": {1: 5.0}}}, r"section\.section: invalid value 1; allowed: section names are non-empty strings"),
        ({"section": {"out_of_section": True}}, r"section\.out_of_section: invalid value True"),
        ({"section": {"calculated_sections": "step"}}, r"calculated_sections: invalid value 'step'.*list"),
        ({"section": {"section": {}, "calculated_sections": ["step"]}}, r"calculated_sections: invalid value 'step'; allowed: names of sections that have a timeout"),
    ],
)
def test_bad_state_dict_values_are_rejected_naming_the_key(current, message):
    with pytest.raises(ValueError, match=message):
        timeouts_from_state_dict({"current_timeouts": current})


# -- job-life maxima: learned timeouts never shrink across resumes (issue 20) ---------------------------
def _resume(state, safety_factor=5.0) -> tuple[TimeoutsCalc, HeartbeatTimeouts, SectionTimeouts]:
    """A new run (a new calculator) resumed from ``state``, as the client does it."""
    hb, sections = apply_calculated(HeartbeatTimeouts(3600.0, 2700.0),
                                    SectionTimeouts({"step": 2700.0, "checkpointing": 2700.0}, None), state)
    return _calc(safety_factor=safety_factor, min_timeout=1.0, job_life=job_life_from_state_dict(state)), hb, sections


def test_ten_resumes_that_see_only_short_gaps_never_shrink_a_timeout_below_the_job_life_floor():
    # Run 1 saw a 3 s checkpoint save between heartbeats; every resume learns from 0.5 s step gaps only.
    state: dict = {"current_timeouts": {}}
    subsequent, sections_seen = [], []
    for run in range(10):
        calc, hb, sections = _resume(state)
        t = 0.0
        for gap in ([0.5, 3.0, 0.5] if run == 0 else [0.5, 0.5]):
            t += gap
            calc.update_on_heartbeat(hb_time=t)
            calc.update_on_section_start("step", now=t)
            calc.update_on_section_end("step", now=t + (2.0 if run == 0 else 0.2))
        hb = calc.calculate_hb_timeouts(hb, calc_initial=False)
        sections = calc.calculate_section_timeouts(sections, ["step"], calc_out_of_section=False, now=t)
        subsequent.append(hb.subsequent)
        sections_seen.append(sections.section["step"])
        state = timeouts_state_dict(hb, sections, calc.job_life)
    # Before: 15 -> 8.75 -> 5.6 -> ... (the average halves toward 5 x 0.5 s); now never below 5 x 3 s.
    assert subsequent == [15.0] * 10 and sections_seen == [10.0] * 10
    assert state["current_timeouts"]["job_life"] == {
        "heartbeat.subsequent": {"max": 3.0, "runs": 10}, "section.step": {"max": 2.0, "runs": 10}}


def test_the_job_life_floor_does_not_stop_timeouts_from_growing():
    calc, hb, sections = _resume({"current_timeouts": {"job_life": {"section.step": {"max": 1.0, "runs": 4}}}})
    calc.update_on_section_start("step", now=1.0)
    calc.update_on_section_end("step", now=5.0)  # a slower step than the job has ever seen
    sections = calc.calculate_section_timeouts(sections, ["step"], calc_out_of_section=False, now=5.0)
    assert sections.section["step"] == 20.0
    assert calc.job_life.to_dict() == {"section.step": {"max": 4.0, "runs": 5}}


def test_a_state_dict_without_job_life_loads_with_no_floor_from_history():
    # NVRx's (and older) state dicts: partial, no "job_life" key.
    nvrx = {"current_timeouts": {"heartbeat": {"initial": 60.0, "subsequent": 8.0, "were_calculated": True}}}
    assert not job_life_from_state_dict(nvrx)
    calc, hb, _ = _resume(nvrx)
    calc.update_on_heartbeat(hb_time=1.0)
    calc.update_on_heartbeat(hb_time=1.5)
    assert calc.calculate_hb_timeouts(hb, calc_initial=False).subsequent == 0.5 * 8.0 + 0.5 * 2.5


def test_loaded_job_life_merges_by_maximum():
    life = JobLife.from_dict({"section.step": {"max": 2.0, "runs": 3}, "out_of_section": {"max": 1.0, "runs": 1}})
    life.merge(JobLife.from_dict({"section.step": {"max": 1.0, "runs": 5}, "heartbeat.initial": {"max": 9.0,
                                                                                                "runs": 1}}))
    assert life.to_dict() == {"heartbeat.initial": {"max": 9.0, "runs": 1}, "out_of_section": {"max": 1.0, "runs": 1},
                              "section.step": {"max": 2.0, "runs": 5}}


@pytest.mark.parametrize(("job_life", "key"), [
    ([1, 2], "current_timeouts.job_life"),
    ({"section.step": {"max": "3", "runs": 1}}, "current_timeouts.job_life.section.step.max"),
    ({"section.step": {"max": float("nan"), "runs": 1}}, "current_timeouts.job_life.section.step.max"),
    ({"section.step": {"max": 3.0, "runs": 0}}, "current_timeouts.job_life.section.step.runs"),
    ({"section.step": {"max": 3.0, "runs": 1, "min": 1}}, "current_timeouts.job_life.section.step"),
])
def test_a_malformed_job_life_is_refused_naming_the_key(job_life, key):
    with pytest.raises(InvalidTimeoutsError) as info:
        job_life_from_state_dict({"current_timeouts": {"job_life": job_life}})
    assert info.value.key == key


