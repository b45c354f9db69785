"""The node's rank monitor as the launcher sees it: started once, watched, respawned if it dies."""

from __future__ import annotations

import logging
import os
from typing import Optional

from ft_core.config import FaultToleranceConfig
from ft_core.config_loading import LoadedConfig
from ft_core.event_file import read_records
from ft_core.events import Event
from ft_core.jobdir import JobDir
from ft_core.monitor import MonitorProcess, RankMonitorServer
from ft_core.monitor.live_ranks import LIVE_RANKS_SIGNAL
from ft_core.monitor.spawn import StandbyMonitor

__all__ = ["NodeMonitor"]

log = logging.getLogger("ft_core.launcher")

#: How long a new monitor may take to serve its socket.
START_TIMEOUT = 30.0


class NodeMonitor:
    """Owns the ``RankMonitorServer`` subprocess of this node and tails its event file.

    The socket path, token and events file stay the same across respawns, so
    workers started after a respawn find it where they expect it.
    """

    def __init__(self, loaded: LoadedConfig, job_dir: JobDir, token: str, stacks_dir: Optional[str] = None,
                 standby: Optional[StandbyMonitor] = None) -> None:
        #: The config and the keys set at launch, passed whole to the monitor: a rank's fallback values fill
        #: in the other keys.
        self.loaded = loaded
        #: Where the monitor keeps the stacks of hung ranks (next to the event log: the job dir is removed).
        self.stacks_dir = stacks_dir
        self.socket_path = job_dir.monitor_socket
        self.events_path = job_dir.monitor_events
        self._token = token
        #: A monitor process started ahead, its imports done or under way: the first start uses it.
        self._standby = standby
        self._proc: Optional[MonitorProcess] = None
        self._starting = False
        self._offset = 0

    @property
    def cfg(self) -> FaultToleranceConfig:
        return self.loaded.cfg

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def start(self, wait: bool = True) -> None:
        """Start the monitor; with ``wait=False`` call :meth:`wait_ready` before workers need it."""
        standby, self._standby = self._standby, None
        self._proc = RankMonitorServer.run_in_subprocess(
            self.loaded, self.socket_path, token=self._token, events_path=self.events_path,
            stacks_dir=self.stacks_dir, wait=wait, launcher_reports_hangs=True, standby=standby)
        self._starting = not wait
        log.debug("rank monitor started (pid %d)", self._proc.pid)

    def wait_ready(self) -> None:
        """Return once the monitor serves its socket (it was started with ``wait=False``)."""
        if self._proc is not None and self._starting:
            self._starting = False
            self._proc.wait_ready(START_TIMEOUT)

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def exit_code(self) -> Optional[int]:
        return self._proc.proc.poll() if self._proc is not None else None

    def respawn(self) -> None:
        """Reap the dead monitor and start a new one on the same socket."""
        if self._proc is not None:
            self._proc.kill()
        self.start()

    def request_live_ranks(self) -> bool:
        """Ask the monitor for a record of its live ranks (:class:`~ft_core.events.LiveRanks`); False if it is not running."""
        if not self.is_alive() or self.pid is None:
            return False
        try:
            os.kill(self.pid, LIVE_RANKS_SIGNAL)
        except ProcessLookupError:
            return False
        return True

    def poll_events(self) -> list[Event]:
        """Records the monitor wrote since the previous call."""
        events, self._offset = read_records(self.events_path, self._offset)
        return events

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop(timeout=5.0)
            self._proc = None
