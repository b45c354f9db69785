"""NVRx's ``RankMonitorServer.run_in_subprocess(cfg, ipc_socket_path, is_restarter_logger, mp_ctx)``: one monitor
per rank on a socket in a shared directory (NVRx's tests use ``/tmp/_rmon_r<rank>.socket``), real rank processes
connecting through ``FT_RANK_MONITOR_IPC_SOCKET``."""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import subprocess

import pytest
from helpers import kill_group, python_env, spawn_python

from ft_core.config import FaultToleranceConfig
from ft_core.jobdir import UnsafePathError
from ft_core.monitor import RankMonitorServer

pytestmark = pytest.mark.timeout(120)

# A rank: connects through FT_RANK_MONITOR_IPC_SOCKET, beats, says "beating", then hangs (no more heartbeats).
RANK = """
import sys, time
from ft_core.client import RankMonitorClient
client = RankMonitorClient()
client.init_workload_monitoring()
for _ in range(3):
    client.send_heartbeat()
print("beating", flush=True)
time.sleep(120)
"""


@pytest.fixture
def shared_dir(tmp_path):
    """A sticky, world-writable directory like /tmp (a fresh one: tests do not meet in the real /tmp)."""
    path = tmp_path / "shared"
    path.mkdir()
    os.chmod(path, 0o1777)
    return path


def _nvrx_config() -> FaultToleranceConfig:
    cfg = FaultToleranceConfig()  # as NVRx's tests build it: by assignment
    cfg.initial_rank_heartbeat_timeout = 30.0
    cfg.rank_heartbeat_timeout = 1.0
    cfg.rank_termination_signal = signal.SIGUSR1
    return cfg


def test_nvrx_signature_positional_and_keyword_serves_ranks_through_a_link_in_a_shared_dir(shared_dir):
    mp_ctx = multiprocessing.get_context("spawn")
    paths = [str(shared_dir / f"_rmon_r{rank}.socket") for rank in range(2)]
    monitors = [RankMonitorServer.run_in_subprocess(_nvrx_config(), paths[0], False, mp_ctx),
                RankMonitorServer.run_in_subprocess(cfg=_nvrx_config(), ipc_socket_path=paths[1],
                                                    is_restarter_logger=False, mp_ctx=mp_ctx)]
    ranks: list[subprocess.Popen] = []
    try:
        # Only our links are in the shared directory: the token, events and stacks are in private job dirs.
        assert sorted(os.listdir(shared_dir)) == ["_rmon_r0.socket", "_rmon_r1.socket"]
        for path, monitor in zip(paths, monitors):
            assert stat.S_ISLNK(os.lstat(path).st_mode) and os.readlink(path) == monitor.socket_path
            assert monitor.is_alive() and monitor.exitcode is None
        for rank, path in enumerate(paths):
            ranks.append(spawn_python(["-c", RANK], python_env(RANK=str(rank), FT_RANK_MONITOR_IPC_SOCKET=path),
                                      stdout=subprocess.PIPE))
        for proc in ranks:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"beating"
        # Each rank's own monitor ends it with the termination signal once its heartbeats stop.
        assert [proc.wait(timeout=60) for proc in ranks] == [-signal.SIGUSR1] * 2
    finally:
        for proc in ranks:
            kill_group(proc)
        for monitor in monitors:
            monitor.terminate()  # mp.Process's names, as NVRx's tests end their monitors
            monitor.join(timeout=30)
    assert [monitor.exitcode for monitor in monitors] == [0, 0]
    assert os.listdir(shared_dir) == []  # links and job dirs gone with their monitors
    assert not any(os.path.exists(os.path.dirname(monitor.socket_path)) for monitor in monitors)


def test_a_new_monitor_replaces_a_dead_monitors_link_but_not_a_live_one(shared_dir):
    path = str(shared_dir / "_rmon_r0.socket")
    first = RankMonitorServer.run_in_subprocess(_nvrx_config(), path)
    try:
        with pytest.raises(RuntimeError, match="already serving"):
            RankMonitorServer.run_in_subprocess(_nvrx_config(), path)
        os.kill(first.pid, signal.SIGKILL)  # dies without removing anything: its link stays
        first.proc.wait()
        second = RankMonitorServer.run_in_subprocess(_nvrx_config(), ipc_socket_path=path)
        try:
            assert os.readlink(path) == second.socket_path != first.socket_path
        finally:
            second.stop()
    finally:
        first.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="an entry of another user needs root (lchown to nobody)")
def test_an_entry_planted_by_another_user_is_refused_by_monitor_and_rank(shared_dir, tmp_path, monkeypatch):
    from ft_core.client import RankMonitorClient, RankMonitorClientError

    path = shared_dir / "_rmon_r0.socket"
    path.symlink_to(tmp_path / "attacker.sock")
    os.lchown(path, 65534, 65534)
    with pytest.raises(UnsafePathError, match="owned by"):
        RankMonitorServer.run_in_subprocess(_nvrx_config(), str(path))
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", str(path))
    monkeypatch.setenv("FT_MONITOR_TOKEN", "t" * 16)
    with pytest.raises(RankMonitorClientError, match="symlink owned by"):
        RankMonitorClient().init_workload_monitoring()
