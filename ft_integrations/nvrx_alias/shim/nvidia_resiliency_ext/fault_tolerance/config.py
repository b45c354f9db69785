"""``nvidia_resiliency_ext.fault_tolerance.config`` as served by ``ft_core``."""

from ft_core.config import FaultToleranceConfig

__all__ = ["FaultToleranceConfig"]
