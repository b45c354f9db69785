"""Event records shared by the monitor and the launcher, and the JSON-lines reader.

This module must not import torch nor the monitor: ranks, the monitor and the
launcher all import it.
"""

from __future__ import annotations

import enum
import json
import logging
from typing import Any

__all__ = ["HangReason", "read_events"]

log = logging.getLogger("ft_core.events")


class HangReason(str, enum.Enum):
    """Which deadline a hung rank missed (the ``reason`` of a ``hang_detected`` event)."""

    INITIAL_HEARTBEAT = "initial_heartbeat"
    HEARTBEAT = "heartbeat"
    SECTION = "section"
    OUT_OF_SECTION = "out_of_section"


def read_events(path: str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Read complete JSON lines appended to ``path`` after byte ``offset``.

    Returns the events and the offset to pass next time; a partially written
    last line is left for the next call.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            log.warning("skipping a corrupt line in %s", path)
    return events, offset + end
