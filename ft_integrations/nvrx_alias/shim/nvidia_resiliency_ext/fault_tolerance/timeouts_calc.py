"""``nvidia_resiliency_ext.fault_tolerance.timeouts_calc`` as served by ``ft_core``."""

from ft_core.timeouts_calc import TimeoutsCalc, TimeoutsCalcError

__all__ = ["TimeoutsCalc", "TimeoutsCalcError"]
