"""The launcher's event log summary counts the node monitor's late wake-ups."""

from __future__ import annotations

from ft_core.launcher.event_log import EventLog


def test_summary_reports_monitor_lateness(tmp_path):
    log = EventLog(str(tmp_path / "ft_events.jsonl"))
    assert "monitor    : never late" in log.summary(0, "done")
    log.monitor_late(0.4)
    log.monitor_late(3.02)
    assert "monitor    : late 2 times, worst 3.02 s" in log.summary(0, "done")
    log.close()
