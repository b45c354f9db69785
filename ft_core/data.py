"""Small value types shared by the client, the monitor and the launcher (NVRx names)."""

from __future__ import annotations

import dataclasses
import enum

__all__ = ["WorkloadAction", "WorkloadControlRequest"]


class WorkloadAction(enum.Enum):
    """What a rank asks the launcher to do with the workload."""

    #: Nothing special: restart as usual after a failure.
    Continue = "continue"
    #: Take this node out of the job; a hot spare joins in the next rendezvous.
    ExcludeThisNode = "exclude_this_node"
    #: Stop every node; no more restarts.
    ShutdownWorkload = "shutdown_workload"


@dataclasses.dataclass(frozen=True)
class WorkloadControlRequest:
    """A request sent with ``RankMonitorClient.send_workload_control_request``."""

    action: WorkloadAction
    description: str = ""
