"""The watchdog thread with real processes: a rank hung in Python is interrupted at the soft timeout, and the
ranks that waited for it in a collective are released by the abort."""

from __future__ import annotations

import pytest
from inprocess_workers.harness import (
    assert_left_blocked_collective,
    assert_restarted_in_process,
    events_of,
    result,
)

pytestmark = pytest.mark.timeout(120)


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
