"""The monitor's pure policy for one rank: its deadlines and the CPU probe (no process, no clock).

What happens once a deadline passes (the hang state machine): ``test_hang.py``.
"""

from __future__ import annotations

import os
import time

import pytest
from monitor_rank import T0, watched

from ft_core.events import HangReason
from ft_core.monitor.watched_rank import CPU_PROBE, WatchedRank, cpu_probe
from ft_core.timeouts import SectionTimeouts


def expiry_of(rank: WatchedRank) -> tuple:
    exp = rank.next_deadline()
    assert exp is not None
    return exp.deadline, exp.reason, exp.section, exp.timeout, exp.since


# -- deadlines ------------------------------------------------------------------
def test_nothing_timed_means_no_deadline():
    rank = watched(sections={"step": None})
    rank.section_start("step", T0 + 1)
    assert rank.next_deadline() is None


def test_the_initial_heartbeat_runs_from_the_connection_until_any_sign_of_life():
    rank = watched(initial=60, subsequent=5)
    assert expiry_of(rank) == (T0 + 60, HangReason.INITIAL_HEARTBEAT, None, 60, T0)
    rank.touch(T0 + 30)  # then the subsequent heartbeat timeout applies, from the last sign of life
    assert expiry_of(rank) == (T0 + 35, HangReason.HEARTBEAT, None, 5, T0 + 30)


def test_a_healthy_but_slow_rank_keeps_pushing_its_heartbeat_deadline_out():
    rank = watched(initial=10, subsequent=5)
    now = T0
    for _ in range(100):  # heartbeats just inside the timeout, for 490 s
        now += 4.9
        assert rank.next_deadline().deadline > now  # never expired when the next heartbeat arrives
        rank.touch(now)
    assert expiry_of(rank)[0] == pytest.approx(now + 5)


def test_any_section_event_counts_as_a_heartbeat():
    rank = watched(initial=10, subsequent=5, sections={"step": None})
    rank.section_start("step", T0 + 3)
    rank.section_end("step", T0 + 7)
    assert expiry_of(rank) == (T0 + 12, HangReason.HEARTBEAT, None, 5, T0 + 7)


def test_the_earliest_of_several_open_sections_wins():
    rank = watched(subsequent=100, sections={"outer": 50, "step": 20})
    rank.section_start("outer", T0 + 1)
    rank.section_start("step", T0 + 40)
    assert expiry_of(rank) == (T0 + 51, HangReason.SECTION, "outer", 50, T0 + 1)
    rank.section_end("outer", T0 + 45)
    assert expiry_of(rank) == (T0 + 60, HangReason.SECTION, "step", 20, T0 + 40)


def test_a_section_without_a_timeout_or_not_configured_is_not_timed():
    rank = watched(sections={"checkpointing": None})
    rank.section_start("checkpointing", T0)
    rank.section_start("unknown", T0)
    assert rank.next_deadline() is None


def test_warmup_steps_get_a_generous_finite_timeout_and_later_ones_the_step_timeout():
    # No `warmup` section: the larger of `setup` and out-of-section times a warm-up step.
    rank = watched(sections={"step": 2, "setup": 60}, out_of_section=5, warmup=2)
    for i in range(2):
        rank.section_start("step", T0 + 100 * i)
        assert expiry_of(rank) == (T0 + 100 * i + 60, HangReason.SECTION, "step", 60, T0 + 100 * i)
        rank.section_end("step", T0 + 100 * i + 5)  # longer than the step timeout: fine during warm-up
    rank.section_start("step", T0 + 300)
    assert expiry_of(rank) == (T0 + 302, HangReason.SECTION, "step", 2, T0 + 300)


@pytest.mark.parametrize(("initial", "sections", "out_of_section", "expected"), [
    (None, {"step": 2, "warmup": 30, "setup": 60}, 5, 30),  # the configured `warmup` section first
    (None, {"step": 2, "warmup": None, "setup": 60}, 5, 60),  # `warmup: none` tracks it; still timed
    (None, {"step": 2}, 5, 5),  # sections mode, heartbeats off: the out-of-section timeout
    (100, {"step": 2}, None, 100),  # then the start-up budget (the initial heartbeat timeout)
    (None, {"step": 2}, None, 2),  # nothing else configured: the configured step timeout
])
def test_a_warmup_step_is_never_untimed_when_anything_is_configured(initial, sections, out_of_section, expected):
    rank = watched(initial=initial, sections=sections, out_of_section=out_of_section, warmup=5)
    rank.touch(T0)
    rank.section_start("step", T0 + 1, iteration=0)
    assert expiry_of(rank) == (T0 + 1 + expected, HangReason.SECTION, "step", expected, T0 + 1)


def test_a_warmup_step_keeps_the_configured_step_timeout_after_it_was_learned_small():
    # The last resort is the *configured* step timeout: a learned (small) one would kill a compile.
    rank = watched(sections={"step": 60}, warmup=5)
    rank.sections = SectionTimeouts({"step": 0.5}, None, {"step"})
    rank.section_start("step", T0)
    assert expiry_of(rank)[3] == 60


def test_out_of_section_time_counts_from_the_connection_and_from_the_last_closed_section():
    rank = watched(sections={"step": 10, "eval": 10}, out_of_section=3)
    assert expiry_of(rank) == (T0 + 3, HangReason.OUT_OF_SECTION, None, 3, T0)
    rank.section_start("step", T0 + 1)
    rank.section_start("eval", T0 + 2)
    rank.section_end("step", T0 + 4)  # "eval" is still open: still in a section
    assert expiry_of(rank)[1] is HangReason.SECTION
    rank.section_end("eval", T0 + 6)
    assert expiry_of(rank) == (T0 + 9, HangReason.OUT_OF_SECTION, None, 3, T0 + 6)
    rank.section_start("step", T0 + 8)
    rank.end_all_sections(T0 + 9)
    assert expiry_of(rank) == (T0 + 12, HangReason.OUT_OF_SECTION, None, 3, T0 + 9)


def test_while_compiling_only_the_compile_timeout_runs_and_the_step_resumes_without_the_compile_time():
    rank = watched(subsequent=5, sections={"step": 2})
    rank.cfg.compile_timeout = 30.0
    rank.section_start("step", T0)
    rank.section_start("compile", T0 + 1)  # a recompile inside the step: 20 s, far past step and heartbeat
    assert expiry_of(rank) == (T0 + 31, HangReason.SECTION, "compile", 30.0, T0 + 1)
    rank.section_end("compile", T0 + 21)
    assert expiry_of(rank) == (T0 + 22, HangReason.SECTION, "step", 2, T0 + 20)  # 1 s of the step was used


def test_closing_a_section_that_was_not_open_is_reported_and_harmless():
    rank = watched(sections={"step": 5})
    assert rank.section_end("step", T0 + 1) is False
    rank.section_start("step", T0 + 2)
    assert rank.section_end("step", T0 + 3) is True


# -- the CPU probe: starved is not hung -----------------------------------------
# The rank is this test's own process (real /proc, no mock): runnable while it reads its own state.
def test_a_runnable_rank_past_its_deadline_is_judged_only_once_it_has_had_cpu():
    rank = watched(subsequent=5)
    rank.pid = os.getpid()
    rank.touch(T0)
    expiry = rank.next_deadline()
    assert cpu_probe(rank, expiry, T0 + 6) == CPU_PROBE  # runnable: maybe waiting for a CPU, not judged yet
    assert cpu_probe(rank, expiry, T0 + 60) == CPU_PROBE  # however late: it has not had the CPU since
    start = time.process_time()
    while time.process_time() - start < 2 * CPU_PROBE:  # it runs, and says nothing
        pass
    assert cpu_probe(rank, expiry, T0 + 61) is None  # now it is judged


def test_a_new_deadline_restarts_the_probe_and_an_unknown_pid_is_judged_at_once():
    rank = watched(subsequent=5)
    rank.pid = os.getpid()
    rank.touch(T0)
    first = rank.next_deadline()
    assert cpu_probe(rank, first, T0 + 6) == CPU_PROBE
    start = time.process_time()
    while time.process_time() - start < 2 * CPU_PROBE:
        pass
    rank.touch(T0 + 7)  # a sign of life: a new deadline, a new probe (the CPU it had before does not count)
    assert cpu_probe(rank, rank.next_deadline(), T0 + 13) == CPU_PROBE
    rank.pid = -1
    assert cpu_probe(rank, rank.next_deadline(), T0 + 13) is None
