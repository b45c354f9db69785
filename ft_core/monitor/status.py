"""The node monitor's live status file, read by the launcher's metrics endpoint at scrape time.

Written only when metrics are on (``metrics_port`` set), every
:data:`STATUS_INTERVAL` seconds, by replacing the file (a reader never sees
half of it). It holds, per connected rank, the unix time of its last sign of
life and its ``step`` section durations, so the endpoint can export the
seconds since each rank's last heartbeat as of the scrape, not as of the last
write. The file is in the job directory (0700) and is itself 0600.

This module must not import torch.
"""

from __future__ import annotations

import os
from typing import Optional

import msgspec

from ft_core.jobdir import JobDir, create_private_file

__all__ = ["STATUS_FILE", "STATUS_INTERVAL", "MonitorStatus", "RankStatus", "read_status", "status_path",
           "write_status"]

STATUS_FILE = "monitor_status.json"
#: Seconds between two writes of the status file.
STATUS_INTERVAL = 1.0


class RankStatus(msgspec.Struct, frozen=True):
    rank: int
    pid: int
    #: Unix time of the rank's last heartbeat or section event; None before the first one.
    last_activity: Optional[float]
    #: ``step`` sections completed, their total duration and the last one (seconds).
    steps: int = 0
    step_seconds: float = 0.0
    last_step_seconds: Optional[float] = None


class MonitorStatus(msgspec.Struct, frozen=True):
    time: float
    ranks: list[RankStatus]


_DECODER = msgspec.json.Decoder(MonitorStatus)


def status_path(job_dir: JobDir) -> str:
    return os.path.join(job_dir.path, STATUS_FILE)


def write_status(path: str, status: MonitorStatus) -> None:
    """Replace the status file (a temp file renamed over it: readers see the old or the new one)."""
    tmp = path + ".tmp"
    fd = create_private_file(tmp, replace=True)
    with os.fdopen(fd, "wb") as handle:
        handle.write(msgspec.json.encode(status))
    os.replace(tmp, path)


def read_status(path: str) -> Optional[MonitorStatus]:
    """The last status written, or None when there is none (yet) or it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return _DECODER.decode(handle.read())
    except (OSError, msgspec.DecodeError):
        return None
