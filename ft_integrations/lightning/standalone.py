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
import shutil
import tempfile
import time

from ft_core.client import MONITOR_SOCKET_ENV, RankMonitorClient, RankMonitorClientError
from ft_core.config import FaultToleranceConfig
from ft_core.monitor import MonitorProcess, RankMonitorServer, read_events

__all__ = ["connect_standalone", "standalone_socket_path", "stop_standalone_monitors"]

log = logging.getLogger("ft_integrations.lightning")

#: How long other local ranks wait for local rank 0's monitor to serve.
CONNECT_TIMEOUT = 120.0
#: At exit, how long local rank 0 waits for the other ranks to disconnect before stopping the monitor.
DRAIN_TIMEOUT = 5.0
_MAX_SOCKET_PATH = 107  # AF_UNIX paths are limited to 108 bytes, NUL included

#: socket path -> (monitor, offset of its first event in the events file)
_monitors: dict[str, tuple[MonitorProcess, int]] = {}


def standalone_socket_path() -> str:
    """The node monitor socket path every local rank of this job derives identically."""
    env = os.environ
    identity = "/".join(env.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                                                 "SLURM_JOB_ID", "SLURM_STEP_ID"))
    if not identity.strip("/"):
        identity = f"pid{os.getpid()}"  # a single process: nobody else needs to find it
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    name = os.path.join(f"ft-{os.getuid()}-{digest}", "monitor.sock")
    path = os.path.join(tempfile.gettempdir(), name)
    return path if len(path.encode()) <= _MAX_SOCKET_PATH else os.path.join("/tmp", name)


def connect_standalone(client: RankMonitorClient, cfg: FaultToleranceConfig) -> str:
    """Connect ``client`` to this node's standalone monitor, starting it on local rank 0.

    Sets ``FT_RANK_MONITOR_IPC_SOCKET`` in this process and returns the socket path.
    """
    path = standalone_socket_path()
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if local_rank == 0 and not (path in _monitors and _monitors[path][0].is_alive()):
        events_path = os.path.join(os.path.dirname(path), "monitor_events.jsonl")
        offset = os.path.getsize(events_path) if os.path.exists(events_path) else 0
        _monitors[path] = (RankMonitorServer.run_in_subprocess(cfg, path, events_path=events_path), offset)
        if len(_monitors) == 1:
            atexit.register(stop_standalone_monitors)
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


def _connected_ranks(monitor: MonitorProcess, offset: int) -> int:
    connected = 0
    for event in read_events(monitor.events_path, offset)[0]:
        if event["event"] == "rank_connected":
            connected += 1
        elif event["event"] == "rank_disconnected":
            connected -= 1
    return connected


def stop_standalone_monitors() -> None:
    """Stop the monitors this process started (at exit; also usable by tests)."""
    for monitor, offset in _monitors.values():
        # Let slower local ranks say goodbye first, so they do not log a lost monitor.
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while monitor.is_alive() and _connected_ranks(monitor, offset) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        monitor.stop()
        # A clean stop leaves nothing behind; after a hang the directory stays (events, stack dumps).
        shutil.rmtree(os.path.dirname(monitor.socket_path), ignore_errors=True)
    _monitors.clear()
