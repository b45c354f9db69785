"""RankMonitorClient without a monitor: what it refuses, and what it tells the user to do.

With a real monitor: ``tests/integration/ft_core/test_client.py``.
"""

from __future__ import annotations

import pytest

from ft_core.client import RankMonitorClient, RankMonitorClientError


def test_client_calls_before_init_raise():
    client = RankMonitorClient()
    for call in (client.send_heartbeat, lambda: client.start_section("step"), lambda: client.end_section("step"),
                 client.end_all_sections, client.calculate_and_set_hb_timeouts,
                 client.calculate_and_set_section_timeouts, lambda: client.report_checkpoint(3)):
        with pytest.raises(RankMonitorClientError, match="init_workload_monitoring"):
            call()


def test_client_init_without_monitor_says_what_to_do(monkeypatch):
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)
    with pytest.raises(RankMonitorClientError, match="ft_launcher"):
        RankMonitorClient().init_workload_monitoring()
