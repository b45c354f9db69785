"""The launcher's event log (JSON lines) and the human summary printed at exit.

Every record is one JSON object on its own line with at least ``event``,
``time`` (unix seconds) and ``node`` (``host:pid`` of the launcher, so the logs
of several nodes can be merged). The file is opened in append mode and each
line is written with a single ``write`` and flushed, so a reader (or a crash)
never sees a torn line and several launchers may share one file.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import time
from typing import Any, Optional, TextIO

__all__ = ["EventLog", "EVENTS_FILE_NAME", "FAULT_KINDS"]

EVENTS_FILE_NAME = "ft_events.jsonl"
#: ``restart`` kinds that are faults: they spend the restart budget and count for the no-progress rule.
FAULT_KINDS = frozenset({"crash", "hang", "monitor", "unhealthy"})


class EventLog:
    """Append-only JSON-lines writer that also keeps what the exit summary needs."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file: Optional[TextIO] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the log
        self.node = f"{socket.gethostname()}:{os.getpid()}"
        self.started = time.time()
        self.cycles = 0
        self.faults: collections.Counter[str] = collections.Counter()
        #: Seconds from each fault to the start of the next cycle's workers.
        self.time_lost = 0.0
        self._pending_fault_time: Optional[float] = None

    def record(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one event; returns the record (with its timestamp)."""
        record = {"event": event, "time": fields.pop("time", None) or time.time(), "node": self.node, **fields}
        if self._file is not None:
            self._file.write(json.dumps(record, default=str) + "\n")
            self._file.flush()
        return record

    def fault(self, kind: str) -> None:
        """Count a fault seen on this node, for the summary."""
        self.faults[kind] += 1

    def interrupted(self, at: float) -> None:
        """The running cycle ended at ``at``: the time until the next cycle starts is lost."""
        if self._pending_fault_time is None:
            self._pending_fault_time = at

    def cycle_started(self, start_time: float) -> None:
        self.cycles += 1
        if self._pending_fault_time is not None:
            self.time_lost += max(0.0, start_time - self._pending_fault_time)
            self._pending_fault_time = None

    def summary(self, exit_code: int, reason: str) -> str:
        """A few lines for humans: cycles, faults by kind, time lost, exit code and why."""
        faults = ", ".join(f"{count} {kind}" for kind, count in sorted(self.faults.items())) or "none"
        return "\n".join([
            "ft_launcher summary",
            f"  cycles run : {self.cycles}",
            f"  faults     : {faults}",
            f"  time lost  : {self.time_lost:.2f} s (fault to next cycle's workers)",
            f"  run time   : {time.time() - self.started:.1f} s",
            *(f"  {line}" for line in self._goodput()),
            f"  exit code  : {exit_code} ({reason})",
            f"  event log  : {self.path}",
        ])

    def _goodput(self) -> list[str]:
        """The short form of ``ft_launcher report`` for this launcher's own records."""
        from ft_core.report import build_report, load_records, short_summary  # the report reads this module

        try:
            records = [r for r in load_records([self.path]) if r["node"] == self.node]
            return short_summary(build_report(records))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a summary must never stop the exit
            return [f"goodput    : n/a ({type(exc).__name__}: {exc})"]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
