"""Slow storage: while a rank moves bytes, its section's deadline moves on (up to ``io_progress_cap``).

A checkpoint save or a data read on a slow or shared filesystem can outlast a
section timeout without being hung. Shortly before a section's deadline the
monitor notes the rank's I/O byte count (``/proc/<pid>/io``, evidence it reads
without the rank's help); at the deadline, a rank whose count advanced since is
extended by one look interval, to at most ``io_progress_cap`` times the
timeout from the section's start. Without progress, or past the cap, the rank
is judged as before.

This module must not import torch: the monitor imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Optional

from ft_core.config import FaultToleranceConfig
from ft_core.events import DeadlineExtended, Event, HangReason
from ft_core.monitor.hang import Expiry
from ft_core.monitor.watched_rank import OpenSection, WatchedRank
from ft_core.utils import procutil

__all__ = ["IO_LOOK_FRACTION", "IO_LOOK_MAX", "SlowStorage"]

log = logging.getLogger("ft_core.monitor")

#: Slow storage: the monitor takes a look at a section's I/O counters this fraction of its timeout before
#: its deadline (at most IO_LOOK_MAX s), and extends a rank whose counters advanced by that much again.
IO_LOOK_FRACTION = 0.25
IO_LOOK_MAX = 30.0


class SlowStorage:
    """Extends the deadline of a section whose rank moves bytes; see the module docstring.

    Args:
        cfg: the monitor's config (``io_progress_cap``: None turns extensions off).
        record: writes an event to the monitor's event log.
    """

    def __init__(self, cfg: FaultToleranceConfig, record: Callable[[Event], None]) -> None:
        self.cfg = cfg
        self._record = record

    def _io_section(self, rank: WatchedRank, expiry: Expiry) -> Optional[OpenSection]:
        """The open section whose deadline ``expiry`` is, when slow-storage extensions apply to it."""
        if self.cfg.io_progress_cap is None or expiry.reason is not HangReason.SECTION or rank.pid <= 0:
            return None
        return rank.open_sections.get(expiry.section or "")

    def look(self, rank: WatchedRank, expiry: Expiry, now: float) -> None:
        """Shortly before a section's deadline, note the rank's I/O byte count: the baseline of its progress."""
        section = self._io_section(rank, expiry)
        if section is None or section.io_look is not None or now < expiry.deadline - _io_interval(expiry.timeout):
            return
        count = procutil.io_bytes(rank.pid)
        if count is not None:
            section.io_look = (now, count)

    def extend(self, rank: WatchedRank, expiry: Expiry, now: float) -> bool:
        """Extend a section past its deadline while its rank moves bytes (slow storage), up to the cap.

        Evidence the monitor reads without the rank's help: the rank's read and written bytes
        (``/proc/<pid>/io``) advanced since the last look. Then the deadline moves one look
        interval on, to at most ``io_progress_cap`` times the timeout from the section's start;
        the first extension of a section is recorded (``deadline_extended``) and logged. Without
        progress, or past the cap, the rank is judged as before (returns False).
        """
        section = self._io_section(rank, expiry)
        if section is None or section.io_look is None:
            return False
        cap = self.cfg.io_progress_cap
        assert cap is not None  # _io_section returns a section only when extensions are on
        limit = expiry.since + cap * expiry.timeout
        if now >= limit:
            return False
        count = procutil.io_bytes(rank.pid)
        if count is None or count <= section.io_look[1]:
            return False
        moved = count - section.io_look[1]
        first = section.extended_to is None
        section.io_look = (now, count)
        section.extended_to = min(now + _io_interval(expiry.timeout), limit)
        if first:
            log.warning("rank %d (pid %d) is past its %.3g s deadline in section %r but moving bytes (%d since the "
                        "last look; slow storage?): its deadline is extended while they keep moving, up to %.3g s",
                        rank.rank, rank.pid, expiry.timeout, expiry.section, moved, cap * expiry.timeout)
            self._record(DeadlineExtended(rank=rank.rank, pid=rank.pid, section=expiry.section or "",
                                          timeout=expiry.timeout, bytes=moved, cap=cap))
        return True


def _io_interval(timeout: float) -> float:
    """How long before a deadline the I/O baseline is taken, and how far one extension reaches."""
    return min(IO_LOOK_FRACTION * timeout, IO_LOOK_MAX)
