"""A node monitor for runs not launched by ``ft_launcher`` (plain ``torchrun``, ``srun``, ``python train.py``).

Local rank 0 starts :class:`~ft_core.monitor.RankMonitorServer` in a private
directory whose name is derived from the job (user, ``TORCHELASTIC_RUN_ID``,
``MASTER_ADDR``/``MASTER_PORT``, ``SLURM_JOB_ID``), so the other local ranks
find its socket and its ``<socket>.token`` file without any shared state.
The monitor lives as long as local rank 0's process (it dies with its parent).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import tempfile
import time
from typing import Optional

from ft_core.client import MONITOR_SOCKET_ENV, RankMonitorClient, RankMonitorClientError
from ft_core.config import FaultToleranceConfig
from ft_core.monitor import MonitorProcess, RankMonitorServer, read_events

__all__ = ["connect_standalone", "standalone_socket_path"]

log = logging.getLogger("ft_integrations.lightning")

#: How long other local ranks wait for local rank 0's monitor to serve.
CONNECT_TIMEOUT = 120.0
#: At exit, how long local rank 0 waits for the other ranks to disconnect before stopping the monitor.
DRAIN_TIMEOUT = 5.0
_MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 108 bytes

_monitors: dict[str, MonitorProcess] = {}


def standalone_socket_path() -> str:
    """The node monitor socket path every local rank of this job derives identically."""
    env = os.environ
    identity = "/".join(env.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                                                 "SLURM_JOB_ID", "SLURM_STEP_ID"))
    if not identity.strip("/"):
        identity = f"pid{os.getpid()}"  # a single process: nobody else needs to find it
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    base = tempfile.gettempdir()
    if len(base) > _MAX_SOCKET_PATH - 40:
        base = "/tmp"
    return os.path.join(base, f"ft-{os.getuid()}-{digest}", "monitor.sock")


def connect_standalone(client: RankMonitorClient, cfg: FaultToleranceConfig) -> str:
    """Connect ``client`` to this node's standalone monitor, starting it on local rank 0.

    Sets ``FT_RANK_MONITOR_IPC_SOCKET`` in this process and returns the socket path.
    """
    path = standalone_socket_path()
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if local_rank == 0 and not (path in _monitors and _monitors[path].is_alive()):
        _monitors[path] = RankMonitorServer.run_in_subprocess(cfg, path)
        if len(_monitors) == 1:
            atexit.register(_stop_monitors)
    os.environ[MONITOR_SOCKET_ENV] = path
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        try:
            client.init_workload_monitoring()
            return path
        except RankMonitorClientError:
            # Local rank 0 may still be starting the monitor (or replacing a stale socket).
            if local_rank == 0 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _connected_ranks(monitor: MonitorProcess) -> int:
    connected = 0
    for event in read_events(monitor.events_path)[0]:
        if event["event"] == "rank_connected":
            connected += 1
        elif event["event"] == "rank_disconnected":
            connected -= 1
    return connected


def _stop_monitors() -> None:
    for monitor in _monitors.values():
        # Let slower local ranks say goodbye first, so they do not log a lost monitor.
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while monitor.is_alive() and _connected_ranks(monitor) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        monitor.stop()
    _monitors.clear()


def find_standalone_monitor(path: str) -> Optional[MonitorProcess]:
    """The monitor this process started for ``path``, if any (for tests and diagnostics)."""
    return _monitors.get(path)
