"""Slow storage: while a rank's saves (or loads) progress, its deadline moves on (up to ``io_progress_cap``).

A checkpoint save or load on a slow or shared filesystem can outlast a timeout
without being hung, whichever rule times it: the heartbeat (the client's and
Lightning's default mode), a section, or the time out of any section. Shortly
before a rank's deadline the monitor notes the regular files the rank and its
descendants have open, and where they are in them (evidence it reads without
the rank's help: :mod:`ft_core.utils.storage_io` says which files count and
why); at the deadline, a rank whose storage I/O progressed since is extended by
one look interval, to at most ``io_progress_cap`` times the timeout from the
start of that deadline's timer. Without progress, or past the cap, the rank is
judged as before. The monitor reads nothing while no deadline is near.

This module must not import torch: the monitor imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Optional

from ft_core.config import FaultToleranceConfig
from ft_core.events import DeadlineExtended, Event
from ft_core.monitor.hang import Expiry
from ft_core.monitor.watched_rank import IoWatch, WatchedRank
from ft_core.utils.storage_io import StorageSample, storage_sample

__all__ = ["IO_LOOK_FRACTION", "IO_LOOK_MAX", "SlowStorage", "moved_bytes"]

log = logging.getLogger("ft_core.monitor")

#: Slow storage: the monitor takes a look at a rank's open files this fraction of a timeout before its
#: deadline (at most IO_LOOK_MAX s), and extends a rank whose storage I/O progressed by that much again.
IO_LOOK_FRACTION = 0.25
IO_LOOK_MAX = 30.0


def moved_bytes(before: StorageSample, after: StorageSample) -> int:
    """Bytes read or written through the open regular files between two looks (0: no storage progress).

    A file still open moved by the distance its offset moved, or (open for writing) by what its size
    grew, whichever is more; a file opened since, by its offset. A file closed since moved nothing more.
    """
    moved = 0
    for key, now in after.items():
        was = before.get(key)
        if was is None:
            moved += now.pos
        else:
            moved += max(abs(now.pos - was.pos), now.size - was.size if now.writable else 0)
    return moved


class SlowStorage:
    """Extends the deadline of a rank whose storage I/O progresses; see the module docstring.

    Args:
        cfg: the monitor's config (``io_progress_cap``: None turns extensions off).
        record: writes an event to the monitor's event log.
    """

    def __init__(self, cfg: FaultToleranceConfig, record: Callable[[Event], None]) -> None:
        self.cfg = cfg
        self._record = record

    def _watch(self, rank: WatchedRank, expiry: Expiry) -> Optional[IoWatch]:
        """The watch of ``expiry``'s deadline, when slow-storage extensions apply to it."""
        if self.cfg.io_progress_cap is None or rank.pid <= 0:
            return None
        return rank.io_watch(expiry)

    def look(self, rank: WatchedRank, expiry: Expiry, now: float) -> None:
        """Shortly before a deadline, note the rank's open regular files: the baseline of its progress."""
        if self.cfg.io_progress_cap is None or now < expiry.deadline - _io_interval(expiry.timeout):
            return
        watch = self._watch(rank, expiry)
        if watch is not None and watch.look is None:
            watch.look = storage_sample(rank.pid)

    def extend(self, rank: WatchedRank, expiry: Expiry, now: float) -> bool:
        """Extend a deadline that passed while the rank's storage I/O progresses (slow storage), up to the cap.

        Evidence the monitor reads without the rank's help: bytes moved through the regular files the
        rank and its descendants have open (:func:`moved_bytes`) since the last look. Then the deadline
        moves one look interval on, to at most ``io_progress_cap`` times the timeout from the start of
        its timer; the first extension of a deadline is recorded (``deadline_extended``) and logged.
        Without progress, or past the cap, the rank is judged as before (returns False).
        """
        watch = self._watch(rank, expiry)
        if watch is None or watch.look is None:
            return False
        cap = self.cfg.io_progress_cap
        assert cap is not None  # _watch returns a watch only when extensions are on
        limit = expiry.since + cap * expiry.timeout
        if now >= limit:
            return False
        sample = storage_sample(rank.pid)
        moved = moved_bytes(watch.look, sample)
        if moved <= 0:
            return False
        first = watch.extended_to is None
        watch.look = sample
        watch.extended_to = min(now + _io_interval(expiry.timeout), limit)
        if first:
            rule = f"section {expiry.section!r}" if expiry.section else f"{expiry.reason.value} timeout"
            log.warning("rank %d (pid %d) is past its %.3g s deadline (%s) but its storage I/O progresses (%d bytes "
                        "since the last look; slow storage?): its deadline is extended while it does, up to %.3g s",
                        rank.rank, rank.pid, expiry.timeout, rule, moved, cap * expiry.timeout)
            self._record(DeadlineExtended(rank=rank.rank, pid=rank.pid, section=expiry.section or "",
                                          timeout=expiry.timeout, bytes=moved, cap=cap, reason=expiry.reason))
        return True


def _io_interval(timeout: float) -> float:
    """How long before a deadline the storage baseline is taken, and how far one extension reaches."""
    return min(IO_LOOK_FRACTION * timeout, IO_LOOK_MAX)
