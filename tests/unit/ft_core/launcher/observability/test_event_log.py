"""The launcher's event log summary: the node monitor's late wake-ups, and one time lost with the report."""

from __future__ import annotations

import re
import time

import pytest

from ft_core.events import CycleStart, Diagnosis, HangDetected, HangReason, Restart, RestartKind
from ft_core.launcher.observability.event_log import EventLog
from ft_core.launcher.observability.report import build_report, load_records


def test_summary_reports_monitor_lateness(tmp_path):
    log = EventLog(str(tmp_path / "ft_events.jsonl"))
    assert "monitor    : never late" in log.summary(0, "done")
    log.monitor_late(0.4)
    log.monitor_late(3.02)
    assert "monitor    : late 2 times, worst 3.02 s" in log.summary(0, "done")
    log.close()


def _hung_cycle(log: EventLog, t0: float) -> None:
    """Cycle 0: rank 1 stops at t0+1 and hangs 5 s; rank 0, blocked in a collective with it, expires first
    and is diagnosed as only waiting; cycle 1's workers are back 1 s after the detection."""
    log.write(CycleStart(time=t0, cycle=0, restarts=0, group_rank=0, group_world_size=1, world_size=2,
                         workers={"0": 10, "1": 11}, monitor_pid=9))
    for rank in (0, 1):
        log.write(HangDetected(time=t0 + 6.0, rank=rank, pid=10 + rank, reason=HangReason.HEARTBEAT, section=None,
                               elapsed=5.0, timeout=5.0, iteration=25, open_sections=[], deadline_time=t0 + 6.0,
                               detected_time=t0 + 6.0, stack_dump_file=None))
    diagnosis = Diagnosis(time=t0 + 6.0, cycle=0, culprits=[1], waiting=[0], evidence="rank 0 blocked in a collective",
                          headline="rank 1 (node n:1, pid 11) hung at iteration 25; rank 0 was waiting for it",
                          culprit_nodes=[log.node])
    log.write(diagnosis)
    log.diagnosed(diagnosis)
    log.write(Restart(time=t0 + 6.0, cycle=0, kind=RestartKind.HANG, reason="rank 0 hung: heartbeat timeout",
                      cause="rank 0 hung: heartbeat timeout", restarts=1, max_restarts=3))
    log.restarted(0, "rank 0 hung: heartbeat timeout")
    log.write(CycleStart(time=t0 + 7.0, cycle=1, restarts=1, group_rank=0, group_world_size=1, world_size=2,
                         workers={"0": 12, "1": 13}, monitor_pid=9))
    log.cycle_started()


def test_summary_time_lost_is_the_reports_detection_restart_and_recomputation(tmp_path):
    log = EventLog(str(tmp_path / "ft_events.jsonl"))
    _hung_cycle(log, time.time() - 20.0)
    summary = log.summary(0, "done")
    report = build_report(load_records([log.path]))
    lost = report.detection_s + report.restart_s + (report.recompute_s or 0.0)
    assert report.detection_s == pytest.approx(5.0) and lost == pytest.approx(6.0)
    (line,) = [line for line in summary.splitlines() if "time lost" in line]
    assert float(re.search(r"time lost  : ([\d.]+) s", line).group(1)) == pytest.approx(lost, abs=0.05), summary
    assert log.time_lost() == pytest.approx(lost)
    log.close()


def test_the_restart_row_says_what_the_diagnosis_says(tmp_path):
    log = EventLog(str(tmp_path / "ft_events.jsonl"))
    _hung_cycle(log, time.time() - 20.0)
    summary = log.summary(0, "done")
    (row,) = [line for line in summary.splitlines() if line.startswith("  restart ")]
    assert "rank 0 hung" not in row and "rank(s) 1" in row and "rank(s) 0 only waited" in row, summary
    log.close()
