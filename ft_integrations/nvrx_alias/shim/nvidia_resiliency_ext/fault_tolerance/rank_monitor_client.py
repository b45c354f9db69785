"""``nvidia_resiliency_ext.fault_tolerance.rank_monitor_client`` as served by ``ft_core``."""

from ft_core.client import RankMonitorClient, RankMonitorClientError

__all__ = ["RankMonitorClient", "RankMonitorClientError"]
