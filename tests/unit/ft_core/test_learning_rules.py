"""The rules of what a calculation may learn (ft_core.learning_rules): pure decisions, no monitor."""

from __future__ import annotations

from ft_core.learning_rules import (
    SectionLearning,
    floor_out_of_section,
    learnable_sections,
    out_of_section_watched,
    section_learning,
)
from ft_core.timeouts import SectionTimeouts

TRACKED = frozenset({"setup", "step", "checkpointing"})


def test_a_fresh_start_does_not_learn_setup_a_resume_does():
    assert learnable_sections(TRACKED, resumed=False) == ["checkpointing", "step"]
    assert learnable_sections(TRACKED, resumed=True) == ["checkpointing", "setup", "step"]
    assert learnable_sections(TRACKED, resumed=True, excluded={"step"}) == ["checkpointing", "setup"]


def test_the_defaults_learn_out_of_section_only_when_set_at_launch_and_never_below_it():
    fresh = section_learning(TRACKED, None, None, resumed=False, launch_value=600.0)
    assert fresh == SectionLearning(["checkpointing", "step"], True, 600.0)
    # Disabled at launch: learning must not switch it on.
    assert section_learning(TRACKED, None, None, resumed=False, launch_value=None).out_of_section is False


def test_an_explicit_choice_is_the_callers_as_in_nvrx():
    explicit = section_learning(TRACKED, ["setup"], True, resumed=False, launch_value=600.0)
    assert explicit == SectionLearning(["setup"], True, None)  # may learn setup, may go below the launch value
    assert section_learning(TRACKED, None, False, resumed=True, launch_value=600.0).out_of_section is False


def test_a_learned_out_of_section_timeout_below_the_launch_value_is_raised_to_it():
    learned = SectionTimeouts({"step": 2.0}, 1.0, {"step"}, True)  # ~1 s from microsecond gaps between steps
    assert floor_out_of_section(learned, 600.0) == SectionTimeouts({"step": 2.0}, 600.0, {"step"}, True)
    longer = SectionTimeouts({"step": 2.0}, 900.0, {"step"}, True)  # a run that needed more raises it
    assert floor_out_of_section(longer, 600.0) is longer
    assert floor_out_of_section(learned, None) is learned


def test_out_of_section_is_watched_when_set_at_launch_or_already_learned():
    assert out_of_section_watched(600.0, SectionTimeouts({"step": 1.0}))
    assert not out_of_section_watched(None, SectionTimeouts({"step": 1.0}))
    assert out_of_section_watched(None, SectionTimeouts({"step": 1.0}, 30.0, set(), True))
