"""Rate limits for warnings a flood of bad connections would otherwise repeat thousands of times.

Example::

    >>> throttle = LogThrottle(limit=2, window=10.0, clock=lambda: 0.0)
    >>> [throttle.allow() for _ in range(4)]
    [0, 0, None, None]
    >>> throttle = LogThrottle(limit=1, window=10.0, clock=iter([0.0, 1.0, 11.0]).__next__)
    >>> [throttle.allow() for _ in range(3)]
    [0, None, 1]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Optional

__all__ = ["LogThrottle"]


class LogThrottle:
    """Allows ``limit`` messages per ``window`` seconds and counts the ones it holds back (thread-safe).

    :meth:`allow` returns ``None`` for a message to drop, else how many were
    dropped since the last allowed one, for the caller to mention.
    """

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start = -float("inf")
        self._allowed = 0
        self._held_back = 0

    def allow(self) -> Optional[int]:
        with self._lock:
            now = self._clock()
            if now - self._window_start >= self.window:
                self._window_start, self._allowed = now, 0
            if self._allowed >= self.limit:
                self._held_back += 1
                return None
            self._allowed += 1
            held_back, self._held_back = self._held_back, 0
            return held_back
