"""The watchdog process with real processes: in-process restart without the ranks that died, hung past the hard
timeout or failed too often (the watchdog process terminates and records them)."""

from __future__ import annotations

import signal

import pytest
from inprocess_workers.harness import result, starts

pytestmark = pytest.mark.timeout(120)


def runs(job, rank):
    return [(e["iteration"], e["rank"], e["world_size"], e["env_rank"], e["env_world_size"])
            for e in starts(job.events()[rank])]


def pids(job, rank):
    return {e["pid"] for e in job.events()[rank]}


def test_rank_stuck_past_hard_timeout_is_terminated_and_others_go_on(start_job):
    job = start_job("hard_timeout")
    codes = job.wait(90)
    # Rank 1 slept inside atomic(): not interruptible, so its monitor process terminated it.
    assert codes == [0, -signal.SIGTERM, 0], job.logs(tail=4000)
    logs = job.logs()
    assert "rank 1: no progress" in logs and "terminating it" in logs, job.logs(tail=4000)
    assert runs(job, 0) == [(0, 0, 3, 0, 3), (1, 0, 2, 0, 2)]
    assert runs(job, 2) == [(0, 2, 3, 2, 3), (1, 1, 2, 1, 2)]  # ShiftRanks closed the gap
    for rank in (0, 2):
        assert len(pids(job, rank)) == 1
        assert result(job.events()[rank]) == 2


def test_spare_takes_the_place_of_a_rank_that_died(start_job):
    job = start_job("spare")  # ActiveWorldSize(2) + FillGaps, rank 1 SIGKILLs itself
    codes = job.wait(90)
    assert codes == [0, -signal.SIGKILL, 0], job.logs(tail=4000)
    assert runs(job, 0) == [(0, 0, 2, 0, 2), (1, 0, 2, 0, 2)]
    assert runs(job, 2) == [(1, 1, 2, 1, 2)]  # a warm spare in iteration 0, rank 1 after the death
    for rank in (0, 2):
        assert len(pids(job, rank)) == 1
        assert result(job.events()[rank]) == 2
    # The death was reported by rank 1's monitor process, not found by a heartbeat timeout.
    assert "rank(s) [1] terminated" in job.logs() and "no heartbeat" not in job.logs()


def test_fault_counter_retires_a_rank_that_keeps_failing(start_job):
    job = start_job("fault_counter")  # FaultCounter(max_rank_faults=2), rank 2 fails every time
    assert job.wait(90) == [0, 0, 0], job.logs(tail=4000)
    assert [r[:3] for r in runs(job, 2)] == [(0, 2, 3), (1, 2, 3)]
    assert [r[:3] for r in runs(job, 0)] == [(0, 0, 3), (1, 0, 3), (2, 0, 2)]
    assert [r[:3] for r in runs(job, 1)] == [(0, 1, 3), (1, 1, 3), (2, 1, 2)]
    assert result(job.events()[0]) == result(job.events()[1]) == 2
    assert result(job.events()[2]) is None  # retired: waited for the others, then returned None
    assert "health_check failed" in job.logs()
