"""The other launchers learn of a decision when it is written, not at their next monitoring pass.

A launcher that decides how a cycle ends (a restart after its rank failed or hung, a stop)
writes the decision into the job state (:mod:`ft_core.launcher.coordination`); the other
launchers found it by reading that state once per monitoring pass (``--monitor-interval``),
so every restart of a multi-node job waited, on every other node, up to one more interval
before they stopped their workers (the ranks of a hang's peers wait in their collective:
nothing else tells them). A one-node job never waited: its own decision is its own.

The decider now also sets a *notice* key of the cycle, ``notice/<cycle>``, after writing
the decision. Every launcher in a cycle has a thread blocked on that key (c10d: a wait on a
connection of its own; etcd-v3: a watch), which then makes a pipe readable; the agent's wait
between two passes (:func:`ft_core.launcher.startup.workers.wait_for_an_exit`) includes the
pipe, so the pass that reads the decision starts at once. The decision is still read from
the job state: a notice only wakes. One that is lost (a launcher without it) costs the
interval as before; one that comes without a decision (a node releasing its wait at the end
of a cycle) costs one pass. etcd-v2 keeps the poll (:attr:`~.rendezvous.job_store.JobStore.wakes`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Optional

from ft_core.launcher.rendezvous.job_store import JobStore

__all__ = ["DecisionNotice", "notice_key"]

log = logging.getLogger("ft_core.launcher")

#: Seconds one wait of the watching thread blocks before it starts another (it ends sooner when the key is set).
WAIT_CHUNK = 600.0


def notice_key(cycle: int) -> str:
    """The key whose setting tells every launcher in ``cycle`` that its end was decided."""
    return f"notice/{cycle}"


class DecisionNotice:
    """A pipe that becomes readable when the decision of the watched cycle is announced (see the module docstring)."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._lock = threading.Lock()
        self._watched: Optional[int] = None
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def on(cls, store: Optional[JobStore]) -> Optional[DecisionNotice]:
        """A notice on ``store``, or None when it cannot wait for a key (etcd-v2, a static job's first cycle)."""
        return cls(store) if store is not None and store.wakes else None

    def fileno(self) -> int:
        """The pipe's read end: readable once the watched cycle's decision was announced (until :meth:`drain`)."""
        return self._read_fd

    def watch(self, cycle: int) -> None:
        """Wait for ``cycle``'s notice from now on; a wait for an earlier cycle still blocked is ended."""
        with self._lock:
            previous, self._watched = self._watched, cycle
            thread = self._thread = threading.Thread(target=self._wait, args=(cycle,), name="ft-decision-notice",
                                                     daemon=True)
        if previous is not None:
            self._release(previous)
        thread.start()

    def announce(self, cycle: Optional[int] = None) -> None:
        """Tell every launcher in ``cycle`` (default: the watched one) that its end was decided (after writing it)."""
        cycle = self._watched if cycle is None else cycle
        if cycle is None:
            return
        try:
            self._store.set(notice_key(cycle), "1")
        except Exception as exc:  # noqa: BLE001 - a wake-up only: the others find the decision at their next pass
            log.debug("could not announce the decision of cycle %d: %s", cycle, exc)

    def drain(self) -> None:
        """Make the pipe unreadable again (the decision was read)."""
        try:
            while os.read(self._read_fd, 64):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """End the wait (the launcher is leaving) and close the pipe."""
        with self._lock:
            watched, self._watched = self._watched, None  # a wait still running finds it closed: it writes nothing
            thread = self._thread
        if watched is not None:
            self._release(watched)
        if thread is not None:
            thread.join(5.0)
        os.close(self._read_fd)
        os.close(self._write_fd)

    def _release(self, cycle: int) -> None:
        # A c10d wait cannot be cancelled, and one still blocked at interpreter exit aborts it: set its key. The
        # other launchers in that cycle see a notice without a decision at worst: one pass.
        self.announce(cycle)

    def _wait(self, cycle: int) -> None:
        while True:
            started = time.monotonic()
            if self._store.wait(notice_key(cycle), WAIT_CHUNK):
                break
            with self._lock:
                if self._watched != cycle:
                    return
            if time.monotonic() - started < WAIT_CHUNK / 2:  # it failed, not timed out: the store is away; poll
                return
        with self._lock:
            if self._watched == cycle:  # still watched: neither a later cycle's nor closed
                os.write(self._write_fd, b"\0")
