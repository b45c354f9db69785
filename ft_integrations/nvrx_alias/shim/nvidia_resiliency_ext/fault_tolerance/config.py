"""``nvidia_resiliency_ext.fault_tolerance.config`` as served by ``ft_core``."""

from ft_core.config import FaultToleranceConfig
from ft_integrations.nvrx_alias.real_nvrx import fallback_getattr

__all__ = ["FaultToleranceConfig"]

# NVRx installed too: a name of its module that ft_core does not serve is NVRx's (its own modules import them).
__getattr__ = fallback_getattr(__name__)
