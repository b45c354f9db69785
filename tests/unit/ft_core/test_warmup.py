"""The warm-up rule: which timeout times a ``step`` in a cycle's first iterations, and how generous it is.

That the monitor does not kill a slow warm-up step yet catches one that hangs, with real ranks:
``tests/integration/ft_core/monitor/test_server.py``.
"""

from __future__ import annotations

from ft_core.timeouts import SectionTimeouts
from ft_core.warmup import WarmupRule, warmup_step_timeout


def test_warmup_rule_covers_the_first_n_iterations_of_a_cycle():
    assert [WarmupRule.covers(i, 2) for i in (0, 1, 2, 3)] == [True, True, False, False]
    assert not WarmupRule.covers(0, 0)


def test_warmup_counts_reported_iterations_from_the_first_step_of_the_cycle():
    rule = WarmupRule(2, {"step": 1.0, "warmup": 5.0})
    # A resumed run starts at iteration 100; several "step" sections may share an iteration.
    opened = [rule.section_opened("step", it) for it in (100, 100, 101, 102, 103)]
    assert opened == ["warmup", "warmup", "warmup", "step", "step"]
    assert rule.section_opened("checkpointing", 100) == "checkpointing"


def test_warmup_counts_step_sections_when_no_iteration_is_reported():
    rule = WarmupRule(2, {"step": 1.0})  # no "warmup" section: warm-up steps are untimed
    assert [rule.section_opened("step", None) for _ in range(4)] == [None, None, "step", "step"]
    assert WarmupRule(0, {"step": 1.0, "warmup": 5.0}).section_opened("step", 7) == "step"


def test_a_warmup_step_is_timed_by_the_warmup_section_first():
    sections = SectionTimeouts({"warmup": 300.0, "setup": 900.0, "step": 2.0}, 1200.0)
    assert warmup_step_timeout(sections, 1800.0, 2.0) == 300.0


def test_without_a_warmup_section_the_larger_of_setup_and_out_of_section_times_it():
    # Never the (learned) step: a warm-up step may compile and allocate far longer than a step takes.
    assert warmup_step_timeout(SectionTimeouts({"setup": 900.0, "step": 2.0}, 1200.0), 1800.0, 2.0) == 1200.0
    assert warmup_step_timeout(SectionTimeouts({"setup": 900.0, "step": 2.0}, None), 1800.0, 2.0) == 900.0
    assert warmup_step_timeout(SectionTimeouts({"step": 2.0}, 30.0), 1800.0, 2.0) == 30.0


def test_then_the_start_up_budget_then_the_configured_step_and_untimed_only_when_nothing_is_set():
    sections = SectionTimeouts({"step": 2.0, "setup": None}, None)
    assert warmup_step_timeout(sections, 1800.0, 5.0) == 1800.0
    assert warmup_step_timeout(sections, None, 5.0) == 5.0
    assert warmup_step_timeout(sections, None, None) is None
