"""Progress tracking of the main thread: manual pings plus an automatic watchdog.

The automatic part must cost (almost) nothing in the training loop and must
only count *Python* progress of the main thread: a thread stuck in a C call
(a collective, ``time.sleep``, a blocking read) is not making progress. A
helper thread therefore asks the interpreter to run a tiny callback in the
main thread with ``Py_AddPendingCall``: CPython runs pending calls between
bytecodes of the main thread only, so the callback's timestamp moves exactly
while the main thread executes Python code. No ``sys.settrace`` or
``sys.setprofile`` hook is involved.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from typing import Optional

from .shared_state import SharedState

__all__ = ["MainThreadProgress", "ProgressWatchdog"]


class MainThreadProgress:
    """The last time (``time.monotonic()``) the main thread made progress.

    Kept locally for the watchdog thread (soft timeout) and in the shared state
    for the watchdog process (hard timeout).
    """

    def __init__(self, shared: SharedState) -> None:
        self._shared = shared
        self.last = 0.0
        self.stamp()

    def stamp(self) -> None:
        self.last = now = time.monotonic()
        self._shared.progress = now

    def age(self) -> float:
        return time.monotonic() - self.last


_PENDING_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_add_pending_call = ctypes.pythonapi.Py_AddPendingCall
_add_pending_call.argtypes = [_PENDING_CALL, ctypes.c_void_p]
_add_pending_call.restype = ctypes.c_int

#: Watchdogs by token. A call may still be queued in the interpreter after its
#: watchdog stopped, so the C callback is module-level (never freed) and looks
#: its watchdog up by token; a stopped watchdog is simply not found.
_WATCHDOGS: dict[int, ProgressWatchdog] = {}
_next_token = itertools.count(1)


@_PENDING_CALL
def _pending_call(token: Optional[int]) -> int:
    watchdog = _WATCHDOGS.get(token or 0)
    if watchdog is not None:
        watchdog.on_main_thread()
    return 0


class ProgressWatchdog:
    """Stamps ``progress`` every ``interval`` seconds while the main thread runs Python."""

    def __init__(self, progress: MainThreadProgress, interval: float) -> None:
        self._progress = progress
        self._interval = interval
        self._token = next(_next_token)
        self._stop = threading.Event()
        self._queued = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ft-inprocess-progress", daemon=True)

    def start(self) -> ProgressWatchdog:
        _WATCHDOGS[self._token] = self
        self._thread.start()
        return self

    def stop(self) -> None:
        _WATCHDOGS.pop(self._token, None)
        self._stop.set()
        self._thread.join()

    def on_main_thread(self) -> None:
        self._progress.stamp()
        self._queued.clear()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            # Queue at most one call: the interpreter's queue is small, and a
            # blocked main thread would otherwise fill it.
            if not self._queued.is_set():
                self._queued.set()
                if _add_pending_call(_pending_call, self._token) != 0:
                    self._queued.clear()
