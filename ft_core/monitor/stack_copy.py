"""Copies of hung ranks' stacks to the launcher's log directory, made off the monitor's deadline path.

The monitor reads a hung rank's stack from its dump file in the job directory
(local and private), records it, and kills the rank; only then is the stack
copied to ``<log dir>/ft_stacks`` (:func:`ft_core.jobdir.keep_stack`), which is
often on a shared filesystem. A stalled filesystem then delays that copy alone:
never the kill, nor any other rank's deadline, since the copy runs in one
daemon thread of its own, one stack after another.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Optional

from ft_core.jobdir import keep_stack

__all__ = ["STACK_COPY_CLOSE_TIMEOUT", "StackCopier"]

log = logging.getLogger("ft_core.monitor")

#: How long a closing monitor waits for the copies still queued (a stalled filesystem may never answer).
STACK_COPY_CLOSE_TIMEOUT = 5.0

_Copy = tuple[str, int, int, int, str, Optional[str]]


class StackCopier:
    """A queue of stack copies served by one daemon thread (started with the first copy)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Optional[_Copy]] = queue.Queue()
        self._thread: Optional[threading.Thread] = None

    def submit(self, stacks_dir: str, cycle: int, rank: int, pid: int, stack: str, dump_path: Optional[str]) -> None:
        """Copy ``stack`` to :func:`~ft_core.jobdir.saved_stack_path` soon; ``dump_path`` is named if it fails."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="ft-stack-copy", daemon=True)
            self._thread.start()
        self._queue.put((stacks_dir, cycle, rank, pid, stack, dump_path))

    def close(self, timeout: float) -> None:
        """Let the queued copies finish, waiting at most ``timeout`` seconds."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("stack copies to the log directory still pending after %.0f s (stalled filesystem?)",
                        timeout)

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            stacks_dir, cycle, rank, pid, stack, dump_path = item
            try:
                keep_stack(stacks_dir, cycle, rank, pid, stack)
            except Exception as exc:  # noqa: BLE001 - one copy's failure must not end the others
                log.warning("could not keep the stack of rank %d in %s: %s (it was in %s)", rank, stacks_dir, exc,
                            dump_path)
