"""Fixtures of the security suite: a live monitor, real ranks next to it, raw connections to attack it."""

from __future__ import annotations

import subprocess

import pytest
from helpers import kill_group, python_env, spawn_python, wait_for
from security_helpers import RANK_SCRIPT, TOKEN, VICTIM_TEXT


@pytest.fixture
def monitor(start_monitor):
    """A live monitor (subprocess) with heartbeat timeouts a healthy rank never misses."""
    return start_monitor(initial_rank_heartbeat_timeout=60, rank_heartbeat_timeout=10, token=TOKEN)


@pytest.fixture
def ranks(tmp_path):
    """``ranks(monitor, scenario, rank=...)``: a real rank process (tests/integration/core_workers/rank.py)."""
    procs = []

    def spawn(monitor, scenario, rank=0, extra=()):
        ready = tmp_path / f"ready{len(procs)}"
        with open(tmp_path / f"rank{len(procs)}.err", "w") as err:
            proc = spawn_python([RANK_SCRIPT, scenario, "--ready-file", str(ready), *extra],
                                env=python_env(FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path,
                                               FT_MONITOR_TOKEN=monitor.token, RANK=str(rank),
                                               LOCAL_RANK=str(rank)),
                                stdout=subprocess.DEVNULL, stderr=err)
        procs.append(proc)

        def connected() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"rank {rank} exited ({proc.returncode}) before it connected")
            return ready.exists() and bool(ready.read_text())

        wait_for(connected, 60, f"rank {rank} to connect")
        return proc

    yield spawn
    for proc in procs:
        kill_group(proc)


@pytest.fixture
def victim(tmp_path):
    """A file an attacker would like the monitor to overwrite or leak."""
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM_TEXT)
    return path
