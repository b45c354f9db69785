"""``nvidia_resiliency_ext.fault_tolerance`` as served by ``ft_core`` (see ``ft_integrations.nvrx_alias``).

Every name of ``ft_core``'s public API, resolved on first use like ``ft_core``'s own
(a rank that imports ``RankMonitorClient`` does not import the monitor server).
"""

from __future__ import annotations

from typing import Any

import ft_core

__all__ = list(ft_core.__all__)


def __getattr__(name: str) -> Any:
    return getattr(ft_core, name)


def __dir__() -> list[str]:
    return sorted(__all__)
