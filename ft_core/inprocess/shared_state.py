"""A few numbers shared between a rank and its watchdog process, without IPC.

The rank writes them into a small memory-mapped file (unlinked, passed to
the watchdog process as an inherited file descriptor); the watchdog process
reads them. Aligned 8-byte stores and loads do not tear on the platforms we
support, so no lock is needed, and a rank whose main thread is stuck (even
holding the GIL) never blocks its monitor.
"""

from __future__ import annotations

import enum
import mmap
import os
import struct
import tempfile

__all__ = ["RestartPhase", "SharedState"]

_DOUBLE = struct.Struct("d")
_PROGRESS, _ARMED, _ATTEMPT, _PHASE, _MONITOR_READY = range(5)
_SIZE = _DOUBLE.size * 5


class RestartPhase(enum.IntEnum):
    """Where the rank is in its restart loop (``SharedState.phase``; stored as its number)."""

    #: Waiting for the other ranks to join the attempt.
    BARRIER = 0
    #: A member of attempt ``SharedState.attempt`` (running, completed or spare).
    MEMBER = 1


class SharedState:
    """``progress`` (``time.monotonic()`` of the last sign of progress), ``armed``
    (1 while the hard timeout applies), ``attempt`` and ``phase``, written by
    the rank; ``monitor_ready``, written by the watchdog process once it is
    connected to the store."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, _SIZE)

    @classmethod
    def create(cls) -> SharedState:
        with tempfile.TemporaryFile() as file:  # unlinked at once; the dup'ed fd keeps it alive
            fd = os.dup(file.fileno())
        os.ftruncate(fd, _SIZE)
        return cls(fd)

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)

    def _get(self, index: int) -> float:
        return _DOUBLE.unpack_from(self._map, index * _DOUBLE.size)[0]

    def _set(self, index: int, value: float) -> None:
        _DOUBLE.pack_into(self._map, index * _DOUBLE.size, value)

    @property
    def progress(self) -> float:
        return self._get(_PROGRESS)

    @progress.setter
    def progress(self, value: float) -> None:
        self._set(_PROGRESS, value)

    @property
    def armed(self) -> bool:
        return self._get(_ARMED) != 0.0

    @armed.setter
    def armed(self, value: bool) -> None:
        self._set(_ARMED, 1.0 if value else 0.0)

    @property
    def attempt(self) -> int:
        return int(self._get(_ATTEMPT))

    @property
    def phase(self) -> RestartPhase:
        return RestartPhase(int(self._get(_PHASE)))

    @property
    def monitor_ready(self) -> bool:
        return self._get(_MONITOR_READY) != 0.0

    @monitor_ready.setter
    def monitor_ready(self, value: bool) -> None:
        self._set(_MONITOR_READY, 1.0 if value else 0.0)

    def enter(self, attempt: int, phase: RestartPhase) -> None:
        # RestartPhase last: a reader that sees MEMBER also sees the attempt it belongs to.
        self._set(_ATTEMPT, float(attempt))
        self._set(_PHASE, float(phase))
