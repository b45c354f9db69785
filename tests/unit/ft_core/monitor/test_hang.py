"""The hang state machine: detected, awaiting the stack dump, terminated (no process, no clock).

A rank's deadlines that lead to it: ``test_watched_rank.py``.
"""

from __future__ import annotations

import pytest

from ft_core.events import HangDetected, HangReason
from ft_core.monitor.hang import DUMP_POLL, Expiry, Hang, HangState


def detected(now: float = 50.0) -> Hang:
    expiry = Expiry(deadline=now - 0.002, reason=HangReason.SECTION, section="step", timeout=5.0,
                    since=now - 5.002)
    return Hang.detect(expiry, rank=1, pid=4321, iteration=7, open_sections=["step", "outer"], now=now,
                       wall_now=1.7e9)


def test_detection_fills_in_the_hang_record():
    hang = detected()
    assert hang.state is HangState.DETECTED and not hang.terminated
    report = hang.report
    assert (report.rank, report.pid, report.reason, report.section, report.iteration) == (
        1, 4321, HangReason.SECTION, "step", 7)
    assert report.elapsed == pytest.approx(5.002) and report.timeout == 5.0
    assert report.open_sections == ["outer", "step"]
    assert report.detected_time == report.time == 1.7e9
    assert report.deadline_time == pytest.approx(1.7e9 - 0.002)
    assert report.stack is None and report.stack_dump_file is None


def test_without_a_stack_dump_the_rank_is_terminated_at_once():
    hang = detected()
    assert hang.poll(50.0, dump_size=0) is None
    report = hang.terminate()
    assert hang.state is HangState.TERMINATED and report.stack is None


def test_the_stack_dump_is_awaited_until_the_file_stops_growing():
    hang = detected()
    hang.request_stack_dump(dump_offset=100, deadline=52.0)
    assert hang.state is HangState.AWAITING_STACK_DUMP
    assert hang.poll(50.000, dump_size=100) == DUMP_POLL  # nothing written yet
    assert hang.poll(50.005, dump_size=180) == DUMP_POLL  # faulthandler is writing
    assert hang.poll(50.010, dump_size=260) == DUMP_POLL  # still growing
    assert hang.poll(50.015, dump_size=260) is None  # settled: terminate now
    report = hang.terminate("Current thread ...\n", "/job/stacks/rank1_pid4321.txt")
    assert hang.terminated and isinstance(report, HangDetected)
    assert (report.stack, report.stack_dump_file) == ("Current thread ...\n", "/job/stacks/rank1_pid4321.txt")
    assert hang.report is report


def test_a_rank_that_never_dumps_is_terminated_at_the_dump_deadline():
    hang = detected()
    hang.request_stack_dump(dump_offset=0, deadline=50.5)
    assert hang.poll(50.499, dump_size=0) == pytest.approx(0.001)  # never sleeps past the deadline
    assert hang.poll(50.5, dump_size=0) is None


def test_a_dump_that_keeps_growing_is_cut_at_the_deadline():
    hang = detected()
    hang.request_stack_dump(dump_offset=0, deadline=50.02)
    size, now = 0, 50.0
    while (wait := hang.poll(now, size)) is not None:
        size, now = size + 10, now + wait
    assert now >= 50.02


def test_invalid_transitions_are_refused():
    hang = detected()
    hang.request_stack_dump(0, 51.0)
    with pytest.raises(RuntimeError, match="awaiting_stack_dump, expected detected"):
        hang.request_stack_dump(0, 52.0)
    hang.terminate()
    with pytest.raises(RuntimeError, match="already terminated"):
        hang.terminate()
    with pytest.raises(RuntimeError, match="terminated, expected awaiting_stack_dump"):
        hang.poll(51.0, 0)
