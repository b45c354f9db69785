"""The ``ranks`` fixture: rank processes (``core_workers/rank.py``) of a monitor, killed with their groups at the end."""

from __future__ import annotations

import os

import pytest
from helpers import REPO_ROOT, kill_group, python_env, spawn_python

RANK_SCRIPT = os.path.join(REPO_ROOT, "tests", "integration", "core_workers", "rank.py")


@pytest.fixture
def ranks():
    """``ranks(monitor, scenario, rank=0, restart_count=0, extra=(), **env)``: a rank process of ``monitor``."""
    procs = []

    def spawn(monitor, scenario, rank=0, restart_count=0, extra=(), **env):
        proc = spawn_python(
            [RANK_SCRIPT, scenario, *extra],
            env=python_env(FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path, FT_MONITOR_TOKEN=monitor.token,
                           RANK=str(rank), LOCAL_RANK=str(rank), TORCHELASTIC_RESTART_COUNT=str(restart_count),
                           **env),
            stdout=-1, stderr=-1, text=True,
        )
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        kill_group(proc)
        proc.stdout.close()
        proc.stderr.close()
