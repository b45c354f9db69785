"""Small value types shared by the client, the monitor and the launcher (NVRx names)."""

from __future__ import annotations

import dataclasses
import enum

__all__ = ["WorkloadAction", "WorkloadControlRequest"]


class WorkloadAction(enum.Enum):
    """What a rank asks the launcher to do with the workload (names and values are NVRx's)."""

    #: Nothing special: restart as usual after a failure.
    Continue = 0
    #: Take this node out of the job; a hot spare joins in the next rendezvous.
    ExcludeThisNode = 1
    #: Stop every node; no more restarts.
    ShutdownWorkload = 2


@dataclasses.dataclass
class WorkloadControlRequest:
    """A request sent with ``RankMonitorClient.send_workload_control_request``."""

    action: WorkloadAction
    description: str = ""
