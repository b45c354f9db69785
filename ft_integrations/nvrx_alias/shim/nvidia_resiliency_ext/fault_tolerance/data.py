"""``nvidia_resiliency_ext.fault_tolerance.data`` as served by ``ft_core``."""

from ft_core.data import WorkloadAction, WorkloadControlRequest
from ft_core.timeouts import HeartbeatTimeouts, SectionTimeouts
from ft_core.timeouts_calc import SectionAction

__all__ = ["HeartbeatTimeouts", "SectionAction", "SectionTimeouts", "WorkloadAction", "WorkloadControlRequest"]
