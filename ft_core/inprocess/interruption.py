"""Making the main thread leave the wrapped function, and ``atomic()`` sections.

The watchdog thread cannot raise in another thread directly. It sends a signal
to the main thread instead, and the handler raises ``RankShouldRestart``.
Compared with ``PyThreadState_SetAsyncExc`` this has two advantages:

* the handler decides at *delivery* time, so the exception never lands in
  wrapper code after the function returned, nor inside an ``atomic()``
  section (``PyThreadState_SetAsyncExc`` decides when it is queued, and a
  queued exception fires wherever the thread happens to be);
* the signal interrupts blocking calls that check for signals (``time.sleep``,
  lock and queue waits, socket reads), so a rank hung in them leaves at once.

The watchdog thread repeats the signal until the main thread has left the
function, in case user code catches the exception. C code that neither
returns to Python nor checks for signals cannot be interrupted this way; the
watchdog process's hard timeout deals with it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Optional

from .exceptions import RankShouldRestart

__all__ = ["DEFAULT_INTERRUPT_SIGNAL", "Interruptor"]

#: A real-time signal: torch, torchrun and the FT client do not use it.
DEFAULT_INTERRUPT_SIGNAL = int(signal.SIGRTMIN) + 3


class Interruptor:
    """Raises ``RankShouldRestart`` in the main thread on request, outside ``atomic()``.

    Must be created, installed and used (``call``, ``enter_atomic``,
    ``exit_atomic``) by the main thread; ``request`` and ``notify_main`` are
    for the watchdog thread.
    """

    def __init__(self, signum: int) -> None:
        self._signum = signum
        self._main_ident = threading.main_thread().ident
        self._cond = threading.Condition()
        self._atomic_depth = 0
        self._requested = False
        self._armed = False  # True while the main thread is inside the wrapped function
        self._previous_handler: Any = None

    def install(self) -> None:
        self._previous_handler = signal.signal(self._signum, self._handle)

    def uninstall(self) -> None:
        signal.signal(self._signum, self._previous_handler)

    def reset(self) -> None:
        """Forget the previous request; call only when no watchdog thread runs."""
        self._requested = False

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """Run ``fn``; return ``(True, result)`` or ``(False, exception)``."""
        self._armed = True
        try:
            return True, fn(*args, **kwargs)
        except BaseException as exc:  # the caller sorts restart, fault and exit apart
            return False, exc
        finally:
            self._armed = False

    # -- atomic sections (main thread) -------------------------------------------------

    def enter_atomic(self) -> None:
        with self._cond:
            if self._requested and self._armed:
                # A restart is under way: do not start work that must not be cut short.
                raise RankShouldRestart()
            self._atomic_depth += 1

    def exit_atomic(self) -> None:
        with self._cond:
            self._atomic_depth -= 1
            self._cond.notify_all()
            deferred = self._atomic_depth == 0 and self._requested and self._armed
        if deferred:
            raise RankShouldRestart()

    # -- watchdog thread ----------------------------------------------------------------

    def request(self, stop: threading.Event, poll: float) -> bool:
        """Wait until the main thread is outside ``atomic()``, then mark the restart requested.

        Returns False if ``stop`` was set first.
        """
        with self._cond:
            while self._atomic_depth > 0:
                if stop.is_set():
                    return False
                self._cond.wait(poll)
            self._requested = True
            return True

    def notify_main(self) -> None:
        assert self._main_ident is not None  # set by the constructor's thread lookup
        signal.pthread_kill(self._main_ident, self._signum)

    def _handle(self, _signum: int, frame: Optional[FrameType]) -> None:
        # Runs in the main thread between bytecodes. Never raise in ``call``'s
        # own frame: there the function has already returned (or not started).
        if (
            self._armed
            and self._requested
            and self._atomic_depth == 0
            and (frame is None or frame.f_code is not _CALL_CODE)
        ):
            raise RankShouldRestart()


_CALL_CODE = Interruptor.call.__code__
