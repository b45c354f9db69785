"""``nvidia_resiliency_ext.fault_tolerance.data`` as served by ``ft_core``."""

from ft_core.data import WorkloadAction, WorkloadControlRequest
from ft_core.timeouts import HeartbeatTimeouts, SectionTimeouts
from ft_core.timeouts_calc import SectionAction
from ft_integrations.nvrx_alias.real_nvrx import fallback_getattr

__all__ = ["HeartbeatTimeouts", "SectionAction", "SectionTimeouts", "WorkloadAction", "WorkloadControlRequest"]

# NVRx installed too: a name of its module that ft_core does not serve is NVRx's (its own modules import them).
__getattr__ = fallback_getattr(__name__)
