"""``nvidia_resiliency_ext.fault_tolerance`` as served by ``ft_core`` (see ``ft_integrations.nvrx_alias``).

Every name of ``ft_core``'s public API, resolved on first use like ``ft_core``'s own
(a rank that imports ``RankMonitorClient`` does not import the monitor server).
"""

from __future__ import annotations

import sys
from typing import Any

import ft_core
from ft_integrations.nvrx_alias.real_nvrx import extend_subpackage

__all__ = list(ft_core.__all__)

# NVRx installed too: its modules of fault_tolerance that the alias does not hold stay importable.
extend_subpackage(sys.modules[__name__])


def __getattr__(name: str) -> Any:
    return getattr(ft_core, name)


def __dir__() -> list[str]:
    return sorted(__all__)
