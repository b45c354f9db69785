"""A standby monitor (started before its settings are known, as ``ft_launcher`` starts one) becomes the monitor."""

from __future__ import annotations

import pytest

from ft_core.client import RankMonitorClient
from ft_core.config import FaultToleranceConfig
from ft_core.monitor.spawn import StandbyMonitor, run_in_subprocess

TOKEN = "a" * 32
pytestmark = pytest.mark.timeout(120)


def test_a_standby_monitor_becomes_the_monitor_it_is_handed_and_serves_ranks(tmp_path, monkeypatch):
    standby = StandbyMonitor()
    assert standby.proc is not None
    pid = standby.proc.pid
    socket_path = str(tmp_path / "job" / "monitor.sock")
    monitor = run_in_subprocess(FaultToleranceConfig(rank_heartbeat_timeout=60.0), socket_path, token=TOKEN,
                                standby=standby)
    try:
        assert monitor.pid == pid and standby.proc is None
        assert [e["event"] for e in monitor.events()] == ["monitor_started"]
        # The token reached it with the environment handed over (its own has none): ranks get in with it.
        monkeypatch.setenv("FT_MONITOR_TOKEN", TOKEN)
        monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", socket_path)
        client = RankMonitorClient()
        client.init_workload_monitoring()
        client.send_heartbeat()
        client.shutdown_workload_monitoring()
        standby.close()  # taken: nothing to end
        assert monitor.is_alive()
    finally:
        assert monitor.stop() == 0


def test_a_standby_monitor_never_taken_or_gone_is_ended_and_replaced(tmp_path):
    unused = StandbyMonitor()
    assert unused.proc is not None
    unused_proc = unused.proc
    unused.close()
    assert unused_proc.returncode is not None and unused.proc is None
    gone = StandbyMonitor()
    assert gone.proc is not None
    dead_pid = gone.proc.pid
    gone.proc.kill()
    gone.proc.wait()
    monitor = run_in_subprocess(FaultToleranceConfig(), str(tmp_path / "job" / "monitor.sock"), token=TOKEN,
                                standby=gone)
    try:
        assert monitor.pid != dead_pid and [e["event"] for e in monitor.events()] == ["monitor_started"]
    finally:
        assert monitor.stop() == 0
