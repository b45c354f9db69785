"""The launcher's no-progress rule with ``min_progress_iterations`` (NVRx's meaning), on a real torch store.

``JobCoordinator.end_cycle`` is called as the agent calls it after a fault; the
job-wide keys live in a ``torch.distributed.HashStore`` (the rendezvous store in
a real job).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ft_core.launcher.checkpointed_iteration import made_progress
from ft_core.launcher.coordination import JobCoordinator
from ft_core.launcher.rendezvous.job_store import C10dJobStore


@pytest.mark.parametrize(("latest", "mark", "minimum", "expected"), [
    (-1, -1, 1, False),  # no checkpoint at all
    (0, -1, 1, True),  # the first checkpoint seen counts: nothing to compare it with
    (5, -1, 100, True),
    (10, 10, 1, False),  # no newer checkpoint
    (11, 10, 1, True),  # NVRx's default: any increase
    (59, 10, 50, False),
    (60, 10, 50, True),
])
def test_made_progress(latest, mark, minimum, expected):
    assert made_progress(latest, mark, minimum) is expected


def _coordinator(min_progress_iterations: int, max_no_progress_cycles: int = 2) -> JobCoordinator:
    return JobCoordinator("run", "node0", max_restarts=100, max_no_progress_cycles=max_no_progress_cycles,
                          no_restart_exit_code=93, job_store=C10dJobStore(dist.HashStore()),
                          min_progress_iterations=min_progress_iterations)


def _fault(coordinator: JobCoordinator, cycle: int, checkpoint: int):
    coordinator.publish_progress(checkpoint)
    return coordinator.end_cycle(cycle, "crash", fault=True, progress_active=True)


def test_small_increases_are_no_progress_and_stop_the_job():
    coordinator = _coordinator(min_progress_iterations=100)
    assert _fault(coordinator, 0, 1000).action == "restart"  # the first checkpoint: progress
    assert _fault(coordinator, 1, 1050).action == "restart"  # +50 < 100: 1 cycle without progress
    stop = _fault(coordinator, 2, 1090)  # +40: 2 cycles without progress
    assert (stop.action, stop.exit_code) == ("stop", 93)
    assert "2 consecutive faulty cycles" in stop.reason and "progress means +100" in stop.reason


def test_enough_progress_resets_the_count():
    # A healthy job that checkpoints often enough is never stopped, however many faults it has.
    coordinator = _coordinator(min_progress_iterations=100)
    checkpoint = 0
    for cycle in range(8):
        checkpoint += 100 if cycle % 2 else 60  # every other cycle falls short, the next one catches up
        assert _fault(coordinator, cycle, checkpoint).action == "restart", cycle


def test_default_counts_any_increase():
    coordinator = _coordinator(min_progress_iterations=1)
    for cycle, checkpoint in enumerate((10, 11, 12, 13)):
        assert _fault(coordinator, cycle, checkpoint).action == "restart"
    assert _fault(coordinator, 4, 13).action == "restart"  # 1 cycle without progress
    assert _fault(coordinator, 5, 13).action == "stop"


@pytest.mark.parametrize("disabled", [0, -1])
def test_zero_or_minus_one_disables_the_rule(disabled):
    coordinator = _coordinator(min_progress_iterations=1, max_no_progress_cycles=disabled)
    for cycle in range(6):
        assert _fault(coordinator, cycle, 10).action == "restart"
