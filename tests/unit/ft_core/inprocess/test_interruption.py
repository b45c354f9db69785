"""Interrupting the main thread, atomic sections, and the progress watchdog (in this process)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from ft_core.inprocess import RankShouldRestart
from ft_core.inprocess.call_wrapper import Atomic
from ft_core.inprocess.interruption import DEFAULT_INTERRUPT_SIGNAL, Interruptor
from ft_core.inprocess.progress_watchdog import MainThreadProgress, ProgressWatchdog
from ft_core.inprocess.shared_state import RestartPhase, SharedState

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def interruptor():
    interruptor = Interruptor(DEFAULT_INTERRUPT_SIGNAL)
    interruptor.install()
    yield interruptor
    interruptor.uninstall()


class FakeMonitor:
    """What the monitor thread does: request a restart, then signal until stopped."""

    def __init__(self, interruptor: Interruptor, log: list[str], delay: float = 0.1) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(interruptor, log, delay))
        self.thread.start()

    def _run(self, interruptor: Interruptor, log: list[str], delay: float) -> None:
        time.sleep(delay)
        if interruptor.request(self.stop, 0.01):
            log.append("requested")
            while not self.stop.wait(0.02):
                interruptor.notify_main()

    def join(self) -> None:
        self.stop.set()
        self.thread.join()


def test_restart_request_interrupts_a_blocking_sleep(interruptor):
    monitor = FakeMonitor(interruptor, [])
    completed, value = interruptor.call(lambda: time.sleep(60))
    monitor.join()
    assert not completed and isinstance(value, RankShouldRestart)


def test_atomic_section_defers_the_interruption_to_its_end(interruptor):
    log: list[str] = []

    def train() -> None:
        with Atomic(interruptor):
            time.sleep(0.5)  # the signal arrives meanwhile and must be ignored
            log.append("atomic done")
        log.append("after atomic")
        time.sleep(60)

    monitor = FakeMonitor(interruptor, log)
    completed, value = interruptor.call(train)
    monitor.join()
    assert not completed and isinstance(value, RankShouldRestart)
    assert log.index("atomic done") < log.index("requested")


def test_no_interruption_outside_the_call(interruptor):
    log: list[str] = []
    monitor = FakeMonitor(interruptor, log, delay=0.0)
    while "requested" not in log:
        time.sleep(0.01)
    time.sleep(0.2)  # signals arrive while the main thread is outside call(): ignored
    monitor.join()
    interruptor.reset()
    assert interruptor.call(lambda: 42) == (True, 42)


def test_no_new_atomic_section_once_a_restart_is_requested(interruptor):
    assert interruptor.request(threading.Event(), 0.01)  # no signal sent: only the atomic gate acts
    completed, value = interruptor.call(lambda: Atomic(interruptor).__enter__())
    assert not completed and isinstance(value, RankShouldRestart)


def test_progress_moves_only_while_the_main_thread_runs_python():
    shared = SharedState.create()
    progress = MainThreadProgress(shared)
    watchdog = ProgressWatchdog(progress, 0.02).start()
    try:
        start = progress.last
        deadline = time.monotonic() + 30
        while progress.last == start:  # busy in Python: the pending call runs and stamps
            assert time.monotonic() < deadline
        assert shared.progress == progress.last
        seen = []
        sampler = threading.Thread(target=lambda: [seen.append(progress.last), time.sleep(0.3),
                                                   seen.append(progress.last)])
        sampler.start()
        time.sleep(0.5)  # blocked in C: no stamps
        sampler.join()
        assert seen[0] == seen[1]
    finally:
        watchdog.stop()
        shared.close()


def test_shared_state_is_visible_through_another_mapping():
    shared = SharedState.create()
    other = SharedState(os.dup(shared.fd))
    try:
        shared.enter(3, RestartPhase.MEMBER)
        shared.armed = True
        shared.progress = 12.5
        other.monitor_ready = True
        assert (other.attempt, other.phase, other.armed, other.progress) == (3, RestartPhase.MEMBER, True, 12.5)
        assert shared.monitor_ready
    finally:
        other.close()
        shared.close()

