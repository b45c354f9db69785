"""A node monitor for runs not launched by ``ft_launcher`` (plain ``torchrun``, ``srun``, ``python train.py``).

Framework-neutral: the Lightning callback uses it, and so can a Megatron or a
plain-torch training script::

    if "FT_RANK_MONITOR_IPC_SOCKET" not in os.environ:   # not under ft_launcher
        start_standalone(FaultToleranceConfig(rank_section_timeouts={"step": 300}))
    client = RankMonitorClient()                         # or the Megatron hooks' ft.setup(args)
    client.init_workload_monitoring()

Local rank 0 starts :class:`~ft_core.monitor.RankMonitorServer` in a private
directory whose name is derived from the job (``TORCHELASTIC_RUN_ID``,
``MASTER_ADDR``/``MASTER_PORT``, ``SLURM_JOB_ID``), so the other local ranks
find its socket and its ``<socket>.token`` file without any shared state.
The monitor lives as long as local rank 0's process (it dies with its parent)
and is stopped at exit. A hung rank is killed, but nothing restarts it: that
is ``ft_launcher``'s job.

Where, and why it is safe. The path must be derivable (no shared state
between the local ranks), so it cannot be random; a predictable name in a
shared ``/tmp`` could be pre-created by another user to read the token or
redirect the event log. So the job's directory lives inside the per-user
directory :func:`ft_core.jobdir.runtime_root` (``$XDG_RUNTIME_DIR/ft-<uid>``,
else ``$TMPDIR/ft-<uid>`` or ``/tmp/ft-<uid>``), which every rank verifies
before use: a real directory (not a symlink), owned by the current user,
mode 0700 (tightened if wider). Inside it only we can create entries, so the
derived name ``standalone-<hash of the job>`` is safe; it is verified the
same way, and every file in it is created new, never through a symlink. If
another user pre-created ``ft-<uid>``, the ranks stop with an error naming
the directory and its owner (set ``XDG_RUNTIME_DIR`` or ``TMPDIR`` to a
private directory to work around it); they never use it.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import os
import shutil
import socket

from ft_core.client import RankMonitorClient, RankMonitorClientError
from ft_core.config import FaultToleranceConfig
from ft_core.event_file import read_records
from ft_core.events import RankConnected, RankDisconnected
from ft_core.jobdir import MONITOR_SOCKET_ENV, JobDir, runtime_root
from ft_core.monitor.spawn import MonitorProcess, run_in_subprocess
from ft_core.utils.deadline import wait_until

__all__ = ["connect_standalone", "standalone_socket_path", "start_standalone", "stop_standalone_monitors"]

log = logging.getLogger("ft_core.monitor.standalone")

#: How long other local ranks wait for local rank 0's monitor to serve.
CONNECT_TIMEOUT = 120.0
#: At exit, how long local rank 0 waits for the other ranks to disconnect before stopping the monitor.
DRAIN_TIMEOUT = 5.0
#: The standalone monitor's directory in :func:`~ft_core.jobdir.runtime_root`: ``standalone-<hash>``.
STANDALONE_PREFIX = "standalone-"

#: socket path -> (monitor, offset of its first event in the events file)
_monitors: dict[str, tuple[MonitorProcess, int]] = {}


def standalone_socket_path() -> str:
    """The node monitor socket path every local rank of this job derives identically.

    Creates (or verifies) the per-user directory it lives in.

    Raises:
        ~ft_core.jobdir.UnsafePathError: that directory is not safe to use (another user's, a symlink).
    """
    env = os.environ
    identity = "/".join(env.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                                                 "SLURM_JOB_ID", "SLURM_STEP_ID"))
    if not identity.strip("/"):
        identity = f"pid{os.getpid()}"  # a single process: nobody else needs to find it
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return JobDir(os.path.join(runtime_root(), f"{STANDALONE_PREFIX}{digest}")).monitor_socket


def start_standalone(cfg: FaultToleranceConfig) -> str:
    """Make sure this node's standalone monitor serves, and point this process at it.

    Local rank 0 starts the monitor (``cfg`` is its config); the other local
    ranks wait until it accepts connections. Sets ``FT_RANK_MONITOR_IPC_SOCKET``
    in this process and returns the socket path; then any client (a
    ``RankMonitorClient``, the Megatron hooks' ``setup``) connects as under
    ``ft_launcher``.

    Raises:
        RankMonitorClientError: another local rank found no monitor within ``CONNECT_TIMEOUT`` seconds.
    """
    path = standalone_socket_path()
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if local_rank == 0:
        if not (path in _monitors and _monitors[path][0].is_alive()):
            events_path = JobDir.of_socket(path).monitor_events
            offset = os.path.getsize(events_path) if os.path.exists(events_path) else 0
            _monitors[path] = (run_in_subprocess(cfg, path, events_path=events_path), offset)
            log.debug("started a standalone node monitor on %s", path)
            if len(_monitors) == 1:
                atexit.register(stop_standalone_monitors)
    # Local rank 0 may still be starting the monitor (or replacing a stale socket).
    elif not wait_until(lambda: _serving(path), CONNECT_TIMEOUT, interval=0.2):
        raise RankMonitorClientError(
            f"no node monitor serves {path} after {CONNECT_TIMEOUT:.0f} s: local rank 0 of this node starts it "
            "(did it reach start_standalone/connect_standalone?)")
    os.environ[MONITOR_SOCKET_ENV] = path
    return path


def connect_standalone(client: RankMonitorClient, cfg: FaultToleranceConfig) -> str:
    """:func:`start_standalone`, then connect ``client`` to that monitor; returns the socket path."""
    path = start_standalone(cfg)
    client.init_workload_monitoring()
    return path


def _serving(path: str) -> bool:
    """True once something accepts connections on ``path`` (the probe is closed before any Hello)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def _connected_ranks(monitor: MonitorProcess, offset: int) -> int:
    connected = 0
    for event in read_records(monitor.events_path, offset)[0]:
        if isinstance(event, RankConnected):
            connected += 1
        elif isinstance(event, RankDisconnected):
            connected -= 1
    return connected


def _drained(monitor: MonitorProcess, offset: int) -> bool:
    return not monitor.is_alive() or _connected_ranks(monitor, offset) <= 0


def stop_standalone_monitors() -> None:
    """Stop the monitors this process started (at exit; also usable by tests)."""
    for monitor, offset in _monitors.values():
        # Let slower local ranks say goodbye first, so they do not log a lost monitor.
        wait_until(functools.partial(_drained, monitor, offset), DRAIN_TIMEOUT)
        monitor.stop()
        # The process pointed its ranks (and itself) at this monitor: not at a dead socket any more.
        if os.environ.get(MONITOR_SOCKET_ENV) == monitor.socket_path:
            del os.environ[MONITOR_SOCKET_ENV]
        # A clean stop leaves nothing behind. A local rank 0 killed for a hang never gets here: then
        # the directory stays, with the events and stack dumps.
        shutil.rmtree(JobDir.of_socket(monitor.socket_path).path, ignore_errors=True)
    _monitors.clear()
