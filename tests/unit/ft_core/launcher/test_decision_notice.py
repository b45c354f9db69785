"""Another launcher's decision wakes this one (:mod:`ft_core.launcher.decision_notice`), on an in-process store.

Two :class:`~ft_core.launcher.coordination.JobCoordinator` share a c10d ``HashStore`` (whose waits block across
threads like a TCPStore's): the one that decides a cycle's end makes the other's pipe readable, which ends the
agent's wait between passes at once; the decision itself is still read from the job state. With real launchers:
``tests/integration/ft_core/launcher/test_decision_notice.py``.
"""

from __future__ import annotations

import select
import time

import torch.distributed as dist

from ft_core.launcher.coordination import JobCoordinator
from ft_core.launcher.decision_notice import DecisionNotice, notice_key
from ft_core.launcher.rendezvous.job_store import C10dJobStore
from ft_core.launcher.startup.workers import wait_for_an_exit


def readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def coordinators(store: dist.HashStore) -> tuple[JobCoordinator, JobCoordinator]:
    def job_store() -> C10dJobStore:
        return C10dJobStore(store, connect=lambda: store)

    return tuple(JobCoordinator("run", node, max_restarts=3, max_no_progress_cycles=0, no_restart_exit_code=9,
                                job_store=job_store()) for node in ("a", "b"))  # type: ignore[return-value]


def watch(coord: JobCoordinator, cycle: int) -> None:
    """What ``begin_cycle`` does at the end of each rendezvous (which needs a real round here)."""
    assert coord._notice is not None
    coord._notice.watch(cycle)


def test_a_decision_by_one_launcher_wakes_the_others_wait_between_passes_at_once():
    a, b = coordinators(dist.HashStore())
    try:
        for coord in (a, b):
            watch(coord, 0)
        assert not readable(b.wake_fds()[0], 0.2)  # nothing decided: b's wait lasts its interval
        decision = a.end_cycle(0, "rank 1 crashed", fault=True, progress_active=False)
        assert not readable(b.wake_fds()[0], 0.2)  # not before the hang diagnosis asked for evidence (the agent)
        a.announce(decision)
        assert readable(b.wake_fds()[0], 10.0)
        started = time.monotonic()
        wait_for_an_exit([], 3600.0, b.wake_fds())  # the agent's wait between passes: ends at once
        assert time.monotonic() - started < 3600.0
        assert b.poll(0) == decision  # the decision is read from the job state, and the pipe drained
        assert not readable(b.wake_fds()[0], 0.0)
    finally:
        a.close()
        b.close()


def test_a_stop_wakes_them_too_and_a_new_cycle_waits_for_its_own_notice():
    a, b = coordinators(dist.HashStore())
    try:
        for coord in (a, b):
            watch(coord, 3)
        a.announce(a.end_cycle(3, "rank 0 hung", fault=True, progress_active=False))
        assert readable(b.wake_fds()[0], 10.0)
        b.poll(3)
        for coord in (a, b):
            watch(coord, 4)  # cycle 4: cycle 3's notice (still set) does not wake it
        assert not readable(b.wake_fds()[0], 0.2)
        a.request_stop("preempted", 143)
        assert readable(b.wake_fds()[0], 10.0)
        assert b.poll(4) is not None and b.poll(4).exit_code == 143  # type: ignore[union-attr]
    finally:
        a.close()
        b.close()


def test_a_decision_another_node_made_first_is_not_announced_again_and_close_ends_the_wait():
    store = dist.HashStore()
    a, b = coordinators(store)
    try:
        for coord in (a, b):
            watch(coord, 0)
        a.announce(a.end_cycle(0, "rank 1 crashed", fault=True, progress_active=False))
        store.delete_key(f"{notice_key(0)}")  # to see whether b's own call announces again
        b.announce(b.end_cycle(0, "its peer failed", fault=True, progress_active=False))  # a's decision stands
        assert not store.check([notice_key(0)])
    finally:
        a.close()
        b.close()
    assert store.check([notice_key(0)])  # close released the waits by setting their key


def test_a_store_that_cannot_wait_gives_no_notice():
    store = C10dJobStore(dist.HashStore())  # no second connection: the launchers poll
    assert DecisionNotice.on(store) is None and DecisionNotice.on(None) is None
    coord = JobCoordinator("run", "a", 3, 0, 9, job_store=store)
    assert coord.wake_fds() == ()
    coord.close()
