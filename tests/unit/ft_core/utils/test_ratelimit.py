"""LogThrottle: a flood of warnings is cut to a few per window, and the next one says how many were held back."""

from __future__ import annotations

import threading

from ft_core.utils.ratelimit import LogThrottle


def test_the_limit_holds_within_a_window_and_a_new_window_reports_what_was_held_back():
    now = [0.0]
    throttle = LogThrottle(limit=2, window=10.0, clock=lambda: now[0])
    assert [throttle.allow() for _ in range(5)] == [0, 0, None, None, None]
    now[0] = 9.999
    assert throttle.allow() is None
    now[0] = 10.0
    assert throttle.allow() == 4  # the four held back since the last allowed one
    assert throttle.allow() == 0


def test_threads_together_get_exactly_the_limit():
    throttle = LogThrottle(limit=10, window=3600.0, clock=lambda: 0.0)
    results: list = []
    lock = threading.Lock()

    def flood() -> None:
        for _ in range(100):
            allowed = throttle.allow()
            with lock:
                results.append(allowed)

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(result is not None for result in results) == 10
