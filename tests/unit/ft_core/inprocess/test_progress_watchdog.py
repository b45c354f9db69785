"""The progress watchdog: the main thread's progress moves only while it runs Python (in this process)."""

from __future__ import annotations

import threading
import time

import pytest

from ft_core.inprocess.progress_watchdog import MainThreadProgress, ProgressWatchdog
from ft_core.inprocess.shared_state import SharedState

pytestmark = pytest.mark.timeout(60)


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
