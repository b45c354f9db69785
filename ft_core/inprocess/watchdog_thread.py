"""The watchdog thread: notices a fault while the function runs and makes the rank restart."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .blame import main_thread_in_torch_distributed
from .interruption import Interruptor
from .progress_watchdog import MainThreadProgress
from .restart_records import AttemptDecision, RestartRecords

__all__ = ["WatchdogThread"]

log = logging.getLogger("ft_core.inprocess")


class WatchdogThread:
    """Watches one attempt of one rank.

    Every ``interval`` it reads the attempt's decision from the store and
    checks the rank's own progress against ``soft_timeout``. Once a restart is
    decided (here or anywhere) it waits for the end of any ``atomic()``
    section, runs the abort hook, and signals the main thread until the
    wrapper stops it (the main thread has left the function).

    A rank whose main thread waits inside ``torch.distributed`` is most likely
    blocked on a faulty peer, so it lets the peer report first: it reports its
    own soft timeout only halfway between ``soft_timeout`` and ``hard_timeout``.
    Likewise, when the fault is blamed on another rank, the progress clock is
    restarted: a rank stuck in a collective with a peer that is about to be
    terminated gets a full ``hard_timeout`` to leave, after the peer is gone.
    """

    def __init__(
        self,
        *,
        records: RestartRecords,
        attempt: int,
        rank: int,
        progress: MainThreadProgress,
        interruptor: Interruptor,
        abort: Callable[[], None],
        soft_timeout: float,
        hard_timeout: float,
        interval: float,
    ) -> None:
        self._thread = threading.Thread(target=self._run, name=f"ft-inprocess-watchdog-{attempt}", daemon=True)
        self._records = records
        self._attempt = attempt
        self._rank = rank
        self._progress = progress
        self._interruptor = interruptor
        self._abort = abort
        self._soft_timeout = soft_timeout
        self._patient_timeout = (soft_timeout + hard_timeout) / 2
        self._interval = interval
        self._stop = threading.Event()
        #: True when this thread reported the fault that restarts the attempt (a soft timeout).
        self.blamed = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        decision = None
        while decision is None:
            if self._stop.wait(self._interval):
                return
            decision = self._poll()
        if decision.rank != self._rank:
            log.info("rank %d: attempt %d restarts (rank %s: %s)", self._rank, self._attempt,
                     decision.rank, decision.reason)
            self._progress.stamp()
        if not self._interruptor.request(self._stop, self._interval):
            return
        self._abort()
        while True:
            self._interruptor.notify_main()
            if self._stop.wait(self._interval):
                return

    def _poll(self) -> AttemptDecision | None:
        try:
            decision = self._records.decision(self._attempt)
            if decision is None and self._soft_timeout_due():
                age = self._progress.age()
                decision = self._records.report_restart(
                    self._attempt, self._rank, f"no progress for {age:.1f} s (soft_timeout={self._soft_timeout} s)"
                )
                self.blamed = decision.rank == self._rank
                if self.blamed:
                    log.warning("rank %d: soft timeout, no progress for %.1f s; restarting", self._rank, age)
        except Exception as exc:  # the store is gone: nothing to coordinate with, restart (and give up there)
            log.warning("rank %d: in-process store failed (%s); restarting", self._rank, exc)
            return AttemptDecision(False, None, f"in-process store failed: {exc}")
        return decision

    def _soft_timeout_due(self) -> bool:
        age = self._progress.age()
        if age <= self._soft_timeout:
            return False
        return age > self._patient_timeout or not main_thread_in_torch_distributed()
