"""``nvidia_resiliency_ext.fault_tolerance.rank_monitor_client`` as served by ``ft_core``."""

from ft_core.client import RankMonitorClient, RankMonitorClientError
from ft_core.client_connection import env_rank as get_rank  # NVRx's module imports its utils' get_rank
from ft_integrations.nvrx_alias.real_nvrx import fallback_getattr

__all__ = ["RankMonitorClient", "RankMonitorClientError", "get_rank"]

# NVRx installed too: a name of its module that ft_core does not serve is NVRx's (its own modules import them).
__getattr__ = fallback_getattr(__name__)
