"""The launcher's event log (``<log dir>/ft_events.jsonl``) and the human summary printed at exit.

Records are the typed events of :mod:`ft_core.events`, written by its
:class:`~ft_core.events.EventWriter`: one JSON object per line with at least
``event``, ``time`` (unix seconds) and ``node`` (``host:pid`` of the launcher,
so the logs of several nodes can be merged). Each line is one ``write`` to a
file opened for appending, so a reader (or a crash) never sees a torn line and
several launchers may share one file. The log and the saved stacks are
private (0600 files, a 0700 ``ft_stacks`` directory): they hold paths,
arguments and stacks.
"""

from __future__ import annotations

import collections
import os
import socket
import time
from collections.abc import Callable
from typing import Optional

from ft_core.events import Diagnosis, Event, EventWriter, RestartKind
from ft_core.jobdir import LAUNCHER_EVENTS_FILE, PRIVATE_DIR_MODE
from ft_core.launcher.report import build_report, load_records, short_summary

__all__ = ["EventLog", "EVENTS_FILE_NAME"]

EVENTS_FILE_NAME = LAUNCHER_EVENTS_FILE
#: The summary names the causes of at most this many (the last) restarts.
SUMMARY_RESTARTS = 3


class EventLog:
    """Append-only event log that also keeps what the exit summary needs."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), mode=PRIVATE_DIR_MODE, exist_ok=True)
        self.node = f"{socket.gethostname()}:{os.getpid()}"
        self._writer: Optional[EventWriter] = EventWriter(self.path, node=self.node)
        self.started = time.time()
        self.cycles = 0
        self.faults: collections.Counter[RestartKind] = collections.Counter()
        #: Seconds from each fault to the start of the next cycle's workers.
        self.time_lost = 0.0
        self._pending_fault_time: Optional[float] = None
        #: Late wake-ups of the node monitor (granted to the ranks as grace) and the worst one.
        self.monitor_late_count = 0
        self.monitor_late_max = 0.0
        #: (cycle, job-wide cause) of every restart, in order.
        self.restarts: list[tuple[int, str]] = []
        #: The job-wide diagnosis of every hang, in order (the same on every node).
        self.diagnoses: list[Diagnosis] = []
        #: Called with every record written (e.g. the metrics endpoint's accounting).
        self.observers: list[Callable[[Event], None]] = []

    def write(self, record: Event) -> Event:
        """Append one record (stamped with this node); returns what was written."""
        if self._writer is None:
            return record
        record = self._writer.write(record)
        for observe in self.observers:
            observe(record)
        return record

    def fault(self, kind: RestartKind) -> None:
        """Count a fault seen on this node, for the summary."""
        self.faults[kind] += 1

    def diagnosed(self, diagnosis: Diagnosis) -> None:
        """A hang, diagnosed job-wide: a fault of this node only if a culprit is one of its ranks."""
        self.diagnoses.append(diagnosis)
        if self.node in diagnosis.culprit_nodes:
            self.faults[RestartKind.HANG] += 1

    def monitor_late(self, late: float) -> None:
        """The node monitor woke ``late`` seconds late (a sign of an overloaded node), for the summary."""
        self.monitor_late_count += 1
        self.monitor_late_max = max(self.monitor_late_max, late)

    def interrupted(self, at: float) -> None:
        """The running cycle ended at ``at``: the time until the next cycle starts is lost."""
        if self._pending_fault_time is None:
            self._pending_fault_time = at

    def restarted(self, cycle: int, cause: str) -> None:
        """``cycle`` ended in a restart for ``cause``: the job-wide decision, the same on every node."""
        self.restarts.append((cycle, cause))

    def cycle_started(self, start_time: float) -> None:
        self.cycles += 1
        if self._pending_fault_time is not None:
            self.time_lost += max(0.0, start_time - self._pending_fault_time)
            self._pending_fault_time = None

    def summary(self, exit_code: int, reason: str) -> str:
        """A few lines for humans: cycles, faults by kind, time lost, monitor lateness, exit code and why."""
        faults = ", ".join(f"{count} {kind.value}" for kind, count in sorted(self.faults.items())) or "none"
        elsewhere = sorted({node for d in self.diagnoses for node in d.culprit_nodes} - {self.node})
        if elsewhere and not self.faults:
            faults = f"none here; culprit on node {', '.join(elsewhere)}"
        late = (f"late {self.monitor_late_count} times, worst {self.monitor_late_max:.2f} s (granted to the "
                "ranks as grace; node overloaded?)" if self.monitor_late_count else "never late")
        shown = self.restarts[-SUMMARY_RESTARTS:]
        restarts = [f"  restart    : cycle {cycle}: {cause}" for cycle, cause in shown]
        if len(self.restarts) > len(shown):
            restarts.insert(0, f"  restarts   : {len(self.restarts)} (the last {len(shown)} below)")
        return "\n".join([
            "ft_launcher summary",
            f"  cycles run : {self.cycles}",
            f"  faults     : {faults}",
            *(f"  culprit    : cycle {d.cycle}: {d.headline}" for d in self.diagnoses[-SUMMARY_RESTARTS:]),
            *restarts,
            f"  time lost  : {self.time_lost:.2f} s (fault to next cycle's workers)",
            f"  monitor    : {late}",
            f"  run time   : {time.time() - self.started:.1f} s",
            *(f"  {line}" for line in self._goodput()),
            f"  exit code  : {exit_code} ({reason})",
            f"  event log  : {self.path}",
        ])

    def _goodput(self) -> list[str]:
        """The short form of ``ft_launcher report`` for this launcher's own records."""
        try:
            records = [r for r in load_records([self.path]) if r.node == self.node]
            return short_summary(build_report(records))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a summary must never stop the exit
            return [f"goodput    : n/a ({type(exc).__name__}: {exc})"]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
