"""The node's monitor as the launcher sees it: a real monitor process started, tailed, respawned after a kill."""

from __future__ import annotations

import os
import signal

import pytest
from helpers import wait_for

from ft_core.config import FaultToleranceConfig
from ft_core.events import MonitorStarted
from ft_core.jobdir import JobDir
from ft_core.launcher.node_monitor import NodeMonitor

pytestmark = pytest.mark.timeout(180)


def _started(monitor: NodeMonitor, seen: list) -> list[int]:
    seen += monitor.poll_events()
    return [record.pid for record in seen if isinstance(record, MonitorStarted)]


def test_a_killed_monitor_is_respawned_on_the_same_socket_and_its_events_are_read_once(tmp_path):
    job = JobDir(str(tmp_path / "job")).create()
    monitor = NodeMonitor(FaultToleranceConfig(), job, "t0ken-" + "n" * 10)
    try:
        monitor.start(wait=False)
        monitor.wait_ready()
        first = monitor.pid
        assert first is not None and monitor.is_alive() and monitor.exit_code() is None
        assert os.path.exists(monitor.socket_path)
        seen: list = []
        assert wait_for(lambda: _started(monitor, seen), 30, "the monitor's start record") == [first]
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: not monitor.is_alive(), 30, "the monitor's death")
        assert monitor.exit_code() == -signal.SIGKILL
        monitor.respawn()
        second = monitor.pid
        assert second not in (None, first) and monitor.is_alive()
        assert monitor.socket_path == job.monitor_socket and os.path.exists(monitor.socket_path)
        seen = []
        assert wait_for(lambda: _started(monitor, seen), 30, "the new monitor's start record") == [second]
    finally:
        monitor.stop()
    assert monitor.pid is None and not monitor.is_alive()
