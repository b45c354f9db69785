"""In-process restart with real processes: every rank restarts the function in the same process."""

from __future__ import annotations

import pytest
from inprocess_workers.harness import job_starter, result, starts

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def start_job(tmp_path):
    with job_starter(tmp_path) as start:
        yield start


def events_of(job, rank, event):
    return [e for e in job.events()[rank] if e["event"] == event]


def assert_left_blocked_collective(job, rank):
    """``rank`` entered the all_reduce of iteration 0 and left it unfinished; iteration 1's completed.

    The gloo timeout is 10 minutes, so within the test only the abort can have released it.
    """
    begun = [e["iteration"] for e in events_of(job, rank, "collective_begin")]
    done = [e["iteration"] for e in events_of(job, rank, "collective_done")]
    assert (begun, done) == ([0, 1], [1]), job.logs(tail=4000)


def assert_restarted_in_process(job, ranks, iterations=(0, 1)):
    events = job.events()
    for rank in ranks:
        runs = starts(events[rank])
        assert [e["iteration"] for e in runs] == list(iterations), job.logs(tail=4000)
        assert len({e["pid"] for e in runs}) == 1, f"rank {rank} ran in more than one process: {runs}"


def test_exception_restarts_every_rank_in_process(start_job):
    job = start_job("exception")
    assert job.wait(90) == [0, 0, 0], job.logs(tail=4000)
    assert_restarted_in_process(job, range(3))
    for rank in range(3):
        assert result(job.events()[rank]) == 3
    # Ranks 0 and 2 were blocked in the all_reduce that rank 1 never joined: the abort unblocked it.
    for rank in (0, 2):
        assert_left_blocked_collective(job, rank)


def test_rank_hung_in_python_is_interrupted_at_soft_timeout(start_job):
    job = start_job("soft_timeout")
    assert job.wait(90) == [0, 0, 0], job.logs(tail=4000)
    assert_restarted_in_process(job, range(3))
    assert [e["iteration"] for e in events_of(job, 2, "fault")] == [0]
    for rank in range(3):
        assert result(job.events()[rank]) == 3
    assert "rank 2: soft timeout" in job.logs()
    # Ranks 0 and 1 waited for rank 2 inside a gloo all_reduce (10 min timeout); the abort released them.
    for rank in (0, 1):
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
