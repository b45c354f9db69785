"""Fault tolerance for PyTorch training: the public API of the core.

Example::

    >>> from ft_core import FaultToleranceConfig, RankMonitorClient, WorkloadAction
    >>> FaultToleranceConfig.from_dict({"rank_heartbeat_timeout": 5}).rank_heartbeat_timeout
    5.0

The names are resolved on first use (PEP 562), so ``import ft_core.client`` in
a rank does not import the monitor server, and the monitor does not import the
client. The submodule paths (``ft_core.client``, ``ft_core.config``, ...) stay
valid. ``ft_core.__version__`` is the installed ft-suite's version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ft_core.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from ft_core.client import RankMonitorClient, RankMonitorClientError
    from ft_core.config import ConfigError, FaultToleranceConfig
    from ft_core.data import WorkloadAction, WorkloadControlRequest
    from ft_core.monitor.server import RankMonitorServer
    from ft_core.snapshots.node import load_snapshot, save_snapshot
    from ft_core.timeouts import HeartbeatTimeouts, SectionTimeouts

#: public name -> the module that owns it
_EXPORTS = {
    "RankMonitorClient": "ft_core.client",
    "RankMonitorClientError": "ft_core.client",
    "FaultToleranceConfig": "ft_core.config",
    "ConfigError": "ft_core.config",
    "RankMonitorServer": "ft_core.monitor.server",
    "WorkloadAction": "ft_core.data",
    "WorkloadControlRequest": "ft_core.data",
    "HeartbeatTimeouts": "ft_core.timeouts",
    "SectionTimeouts": "ft_core.timeouts",
    "save_snapshot": "ft_core.snapshots.node",
    "load_snapshot": "ft_core.snapshots.node",
    "__version__": "ft_core.version",
}

__all__ = [
    "ConfigError",
    "FaultToleranceConfig",
    "HeartbeatTimeouts",
    "RankMonitorClient",
    "RankMonitorClientError",
    "RankMonitorServer",
    "SectionTimeouts",
    "WorkloadAction",
    "WorkloadControlRequest",
    "__version__",
    "load_snapshot",
    "save_snapshot",
]
assert sorted(_EXPORTS) == __all__, "every export has one owning module"


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
