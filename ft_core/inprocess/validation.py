"""Argument checks with errors that name the argument, the value and what is allowed."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_int", "check_seconds", "fail"]


def fail(owner: str, name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{owner}: {name}={value!r} is invalid; allowed: {allowed}")


def check_int(owner: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(owner, name, value, f"an int >= {minimum}")
    return value


def check_seconds(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise fail(owner, name, value, "a finite number of seconds > 0")
    return float(value)
