"""In-process restart with real processes: every rank restarts the function in the same process."""

from __future__ import annotations

import pytest
from inprocess_workers.harness import (
    assert_left_blocked_collective,
    assert_restarted_in_process,
    events_of,
    result,
)

pytestmark = pytest.mark.timeout(120)


def test_exception_restarts_every_rank_in_process(start_job):
    job = start_job("exception")
    assert job.wait(90) == [0, 0, 0], job.logs(tail=4000)
    assert_restarted_in_process(job, range(3))
    for rank in range(3):
        assert result(job.events()[rank]) == 3
    # Ranks 0 and 2 were blocked in the all_reduce that rank 1 never joined: the abort unblocked it.
    for rank in (0, 2):
        assert_left_blocked_collective(job, rank)


def test_atomic_section_delays_abort_until_it_ends(start_job):
    job = start_job("atomic")
    assert job.wait(90) == [0, 0, 0], job.logs(tail=4000)
    assert_restarted_in_process(job, range(3))
    atomic_end = events_of(job, 1, "atomic_end")
    aborts = events_of(job, 1, "abort")
    assert len(atomic_end) == 1 and [e["iteration"] for e in aborts] == [0], job.logs(tail=4000)
    # Rank 0 failed about 1.5 s before rank 1's atomic section ended, yet rank 1 aborted after it.
    assert aborts[0]["time"] >= atomic_end[0]["time"]
    assert events_of(job, 0, "abort")[0]["time"] < atomic_end[0]["time"]
    for rank in range(3):
        assert result(job.events()[rank]) == 3


def test_all_ranks_exit_nonzero_when_iterations_are_exhausted(start_job):
    job = start_job("exhausted")
    codes = job.wait(90)
    assert all(code != 0 for code in codes), (codes, job.logs())
    assert_restarted_in_process(job, range(3))  # RetryController(max_iterations=2): calls 0 and 1 only
    assert job.logs().count("RestartAbort: in-process restart gave up: 2 iterations used") == 3
