"""``nvidia_resiliency_ext.fault_tolerance.timeouts_calc`` as served by ``ft_core``."""

from ft_core.timeouts_calc import TimeoutsCalc, TimeoutsCalcError
from ft_integrations.nvrx_alias.real_nvrx import fallback_getattr

__all__ = ["TimeoutsCalc", "TimeoutsCalcError"]

# NVRx installed too: a name of its module that ft_core does not serve is NVRx's (its own modules import them).
__getattr__ = fallback_getattr(__name__)
