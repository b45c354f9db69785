"""TimeoutsCalc (NVRx's arithmetic) on synthetic times: formulas, merging, selection, out-of-section, warm-up."""

from __future__ import annotations

import pytest

from ft_core.timeouts import HeartbeatTimeouts, SectionTimeouts
from ft_core.timeouts_calc import TimeoutsCalc, TimeoutsNotReadyError


def _calc(**kwargs) -> TimeoutsCalc:
    return TimeoutsCalc(safety_factor=kwargs.pop("safety_factor", 2.0), start_time=0.0, **kwargs)


def test_heartbeat_formula_initial_and_subsequent():
    calc = _calc()
    for t in (5.0, 6.0, 9.0, 10.0):
        calc.update_on_heartbeat(hb_time=t)
    hb = calc.calculate_hb_timeouts(HeartbeatTimeouts(3600.0, 2700.0))
    assert hb == HeartbeatTimeouts(initial=10.0, subsequent=6.0, were_calculated=True)


def test_heartbeat_not_ready_raises_or_skips():
    calc = _calc()
    calc.update_on_heartbeat(hb_time=1.0)
    with pytest.raises(TimeoutsNotReadyError):
        calc.calculate_hb_timeouts(HeartbeatTimeouts(1.0, 1.0))
    assert calc.calculate_hb_timeouts(HeartbeatTimeouts(1.0, 1.0), skip_if_not_ready=True) is None


def test_recalculation_averages_calculated_values_but_replaces_config_values():
    calc = _calc()
    calc.update_on_heartbeat(hb_time=1.0)
    calc.update_on_heartbeat(hb_time=2.0)
    # Config values (not calculated) are replaced, even by smaller learned values.
    first = calc.calculate_hb_timeouts(HeartbeatTimeouts(3600.0, 2700.0))
    assert (first.initial, first.subsequent) == (2.0, 2.0)
    # Previously calculated values are averaged with the new ones (NVRx's merge, alpha 0.5).
    second = calc.calculate_hb_timeouts(HeartbeatTimeouts(50.0, 40.0, were_calculated=True))
    assert (second.initial, second.subsequent) == (26.0, 21.0)


def test_section_formula_and_selected_sections():
    calc = _calc()
    calc.update_on_section_start("setup", now=1.0)
    calc.update_on_section_end("setup", now=4.0)
    for start in (5.0, 8.0):
        calc.update_on_section_start("step", now=start)
        calc.update_on_section_end("step", now=start + 1.5)
    current = SectionTimeouts({"setup": 600.0, "step": 100.0, "checkpointing": None})
    only_step = calc.calculate_section_timeouts(current, ["step"], calc_out_of_section=False)
    assert only_step.section == {"setup": 600.0, "step": 3.0, "checkpointing": None}
    assert only_step.calculated_sections == {"step"}
    assert not only_step.is_out_of_section_calculated
    both = calc.calculate_section_timeouts(only_step, ["setup", "step"], calc_out_of_section=False)
    assert both.section["setup"] == 6.0
    assert both.calculated_sections == {"setup", "step"}


def test_calculated_timeouts_never_go_below_the_floor():
    calc = TimeoutsCalc(safety_factor=2.0, start_time=0.0, min_timeout=1.5)
    calc.update_on_heartbeat(hb_time=0.1)
    calc.update_on_heartbeat(hb_time=0.2)
    calc.update_on_section_start("step", now=0.3)
    calc.update_on_section_end("step", now=0.4)
    hb = calc.calculate_hb_timeouts(HeartbeatTimeouts())
    assert (hb.initial, hb.subsequent) == (1.5, 1.5)
    sections = calc.calculate_section_timeouts(SectionTimeouts({"step": None}), ["step"], now=0.4)
    assert sections.section["step"] == 1.5 and sections.out_of_section == 1.5


def test_section_not_ready_keeps_current_value_when_skipping():
    calc = _calc()
    calc.update_on_section_start("step", now=1.0)
    calc.update_on_section_end("step", now=2.0)
    current = SectionTimeouts({"step": 100.0, "checkpointing": 300.0})
    with pytest.raises(TimeoutsNotReadyError, match="checkpointing"):
        calc.calculate_section_timeouts(current, ["step", "checkpointing"], calc_out_of_section=False)
    result = calc.calculate_section_timeouts(current, ["step", "checkpointing"], False, skip_if_not_ready=True)
    assert result.section == {"step": 2.0, "checkpointing": 300.0}
    assert result.calculated_sections == {"step"}
    nothing = _calc().calculate_section_timeouts(current, ["step"], False, skip_if_not_ready=True)
    assert nothing is None


def test_out_of_section_measured_from_start_and_between_sections_and_bumped():
    calc = _calc()
    calc.update_on_section_start("step", now=2.0)  # 2 s out of section since start
    calc.update_on_section_end("step", now=3.0)
    calc.update_on_section_start("step", now=3.5)  # 0.5 s gap
    calc.update_on_section_end("step", now=4.0)
    first = calc.calculate_section_timeouts(SectionTimeouts({"step": None}), ["step"], now=4.0)
    assert first.out_of_section == 4.0 and first.is_out_of_section_calculated
    # A later, longer gap moves the learned value up: not to the average of 4 and 2 * 5 (7), which
    # would leave a 5 s gap only 1.4x headroom, but to the job-life floor, 2 * 5...
    calc.update_on_section_start("step", now=9.0)  # 5 s gap
    calc.update_on_section_end("step", now=9.5)
    bumped = calc.calculate_section_timeouts(first, ["step"], now=9.5)
    assert bumped.out_of_section == 10.0
    # ...and a quieter run without the job's history (NVRx's state dict) lowers it by averaging, as NVRx does.
    quiet = _calc()
    quiet.update_on_section_start("step", now=0.1)
    quiet.update_on_section_end("step", now=0.2)
    quiet.update_on_section_start("step", now=0.3)
    lowered = quiet.calculate_section_timeouts(bumped, ["step"], now=0.3)
    assert lowered.out_of_section == 0.5 * 10.0 + 0.5 * 0.2


def test_nested_sections_count_out_of_section_only_when_all_closed():
    calc = _calc()
    calc.update_on_section_start("outer", now=1.0)
    calc.update_on_section_start("step", now=2.0)
    calc.update_on_section_end("step", now=3.0)  # still inside "outer"
    calc.update_on_section_start("step", now=10.0)
    calc.update_on_section_end("step", now=11.0)
    calc.update_on_section_end("outer", now=12.0)
    assert calc.max_out_of_section == 1.0  # only the gap before "outer" opened


def test_warmup_steps_are_not_learned():
    calc = _calc(num_warmup_iterations=2)
    for start, duration in ((0.0, 50.0), (60.0, 40.0), (100.0, 1.0), (102.0, 2.0)):
        calc.update_on_section_start("step", now=start)
        calc.update_on_section_end("step", now=start + duration)
    assert calc.section_max["step"] == 2.0


def test_compile_time_is_not_learned_as_the_step_it_ran_in():
    calc = _calc()
    calc.update_on_section_start("step", now=0.0)
    calc.update_on_section_start("compile", now=0.1)
    calc.update_on_section_end("compile", now=10.1)  # a 10 s recompile
    calc.update_on_section_end("step", now=0.5 + 10.0)
    assert calc.section_max["step"] == pytest.approx(0.5)
