"""The node monitor's "woke late" warning: rate-limited on an overloaded node, while every late wake-up is
still granted to the ranks and recorded."""

from __future__ import annotations

import logging

from ft_core.config import FaultToleranceConfig
from ft_core.monitor.server import LATE_WARNINGS_PER_WINDOW, RankMonitorServer


def test_a_node_late_at_every_tick_logs_a_few_warnings_and_records_every_one(tmp_path, caplog):
    server = RankMonitorServer(FaultToleranceConfig(), str(tmp_path / "monitor.sock"), token="t" * 32)
    recorded = []
    server._record = recorded.append  # the event log's writer, which the loop opens when it runs
    with caplog.at_level(logging.WARNING, logger="ft_core"):
        for _ in range(20):
            server._grant_lateness(0.5)
    warnings = [r.getMessage() for r in caplog.records if "woke" in r.getMessage()]
    assert len(warnings) == LATE_WARNINGS_PER_WINDOW
    assert len(recorded) == 20 and server._grace == 20 * 0.5
