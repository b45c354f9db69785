"""The launcher's event log (``<log dir>/ft_events.jsonl``) and the human summary printed at exit.

Records are the typed events of :mod:`ft_core.events`, written by its
:class:`~ft_core.event_file.EventWriter`: one JSON object per line with at least
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

from ft_core.event_file import EventWriter
from ft_core.events import Diagnosis, Event, RestartKind
from ft_core.jobdir import LAUNCHER_EVENTS_FILE, PRIVATE_DIR_MODE
from ft_core.launcher.observability.report import Report, build_report, load_records, short_summary

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
        #: The report of this launcher's records and the log's size it was built at (see :meth:`report`).
        self._report: Optional[tuple[int, Report]] = None
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

    def restarted(self, cycle: int, cause: str) -> None:
        """``cycle`` ended in a restart for ``cause``: the job-wide decision, the same on every node."""
        self.restarts.append((cycle, cause))

    def cycle_started(self) -> None:
        self.cycles += 1

    def report(self) -> Report:
        """``ft_launcher report`` of this launcher's own records (rebuilt only when the log grew).

        Raises what reading or accounting the log raises (OSError, ValueError, ...).
        """
        size = os.stat(self.path).st_size
        if self._report is None or self._report[0] != size:
            records = [r for r in load_records([self.path]) if r.node == self.node]
            self._report = (size, build_report(records))
        return self._report[1]

    def time_lost(self) -> float:
        """Seconds lost to this node's faults: detection + restart + recomputation, as the report counts them."""
        return self.report().lost_s

    def summary(self, exit_code: int, reason: str) -> str:
        """A few lines for humans: cycles, faults by kind, monitor lateness, goodput and time lost, exit code and why."""
        faults = ", ".join(f"{count} {kind.value}" for kind, count in sorted(self.faults.items())) or "none"
        elsewhere = sorted({node for d in self.diagnoses for node in d.culprit_nodes} - {self.node})
        if elsewhere and not self.faults:
            faults = f"none here; culprit on node {', '.join(elsewhere)}"
        late = (f"late {self.monitor_late_count} times, worst {self.monitor_late_max:.2f} s (granted to the "
                "ranks as grace; node overloaded?)" if self.monitor_late_count else "never late")
        shown = self.restarts[-SUMMARY_RESTARTS:]
        restarts = [f"  restart    : cycle {cycle}: {self._restart_cause(cycle, cause)}" for cycle, cause in shown]
        if len(self.restarts) > len(shown):
            restarts.insert(0, f"  restarts   : {len(self.restarts)} (the last {len(shown)} below)")
        return "\n".join([
            "ft_launcher summary",
            f"  cycles run : {self.cycles}",
            f"  faults     : {faults}",
            *(f"  culprit    : cycle {d.cycle}: {d.headline}" for d in self.diagnoses[-SUMMARY_RESTARTS:]),
            *restarts,
            f"  monitor    : {late}",
            f"  run time   : {time.time() - self.started:.1f} s",
            *(f"  {line}" for line in self._goodput()),
            f"  exit code  : {exit_code} ({reason})",
            f"  event log  : {self.path}",
        ])

    def _restart_cause(self, cycle: int, cause: str) -> str:
        """The restart's cause; for a diagnosed hang, the diagnosis's words (the first rank to expire is
        often one that only waited, and the cause names that one)."""
        diagnosis = next((d for d in reversed(self.diagnoses) if d.cycle == cycle and d.culprits), None)
        if diagnosis is None:
            return cause
        waited = f", rank(s) {', '.join(map(str, diagnosis.waiting))} only waited" if diagnosis.waiting else ""
        return f"hang: rank(s) {', '.join(map(str, diagnosis.culprits))} hung{waited} (see culprit)"

    def _goodput(self) -> list[str]:
        """The short form of ``ft_launcher report`` for this launcher's own records (time lost among them)."""
        try:
            return short_summary(self.report())
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a summary must never stop the exit
            return [f"goodput    : n/a ({type(exc).__name__}: {exc})"]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
