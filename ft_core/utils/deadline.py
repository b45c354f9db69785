"""One way to wait for a condition with a deadline, instead of hand-written poll loops.

Example::

    >>> from ft_core.utils.deadline import wait_until
    >>> wait_until(lambda: 42, timeout=1.0)
    42
    >>> wait_until(lambda: None, timeout=0.01, interval=0.005) is None
    True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Optional, TypeVar

__all__ = ["wait_until"]

T = TypeVar("T")


def wait_until(predicate: Callable[[], Optional[T]], timeout: float, interval: float = 0.05) -> Optional[T]:
    """Call ``predicate`` until it returns a truthy value or ``timeout`` seconds have passed.

    Returns that value, or the last (falsy) value when the deadline passed. The
    predicate is always called at least once, and once more at the deadline, so
    a condition that became true while we slept is never reported as missed.
    ``timeout=math.inf`` waits forever.
    """
    deadline = time.monotonic() + timeout if math.isfinite(timeout) else math.inf
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return value
        time.sleep(min(interval, remaining))
