"""An import-time alias: ``nvidia_resiliency_ext.fault_tolerance`` served by ``ft_core``.

Megatron-LM's unmodified ``megatron/training/ft_integration.py`` imports
``RankMonitorClient`` from ``nvidia_resiliency_ext.fault_tolerance``. With the directory
:data:`SHIM_PATH` first on ``PYTHONPATH`` that import resolves to ours, so switching a
Megatron-LM job needs one line in the job script and no edit of Megatron-LM's files::

    export PYTHONPATH="$(python -m ft_integrations.nvrx_alias)${PYTHONPATH:+:$PYTHONPATH}"

``python -m ft_integrations.nvrx_alias`` prints :data:`SHIM_PATH`. The shim holds only
``nvidia_resiliency_ext.fault_tolerance`` and NVRx's public submodules of it (``config``,
``data``, ``timeouts_calc``, ``rank_monitor_client``); the names it serves are ``ft_core``'s
public API (``RankMonitorClient``, ``FaultToleranceConfig``, ``WorkloadAction``, ...).
Those it serves in place of an installed NVRx's on purpose (NVRx's client cannot
talk to this monitor); everything else of an installed NVRx (``checkpointing``,
``inprocess``, ``__version__``, ...) stays NVRx's (:mod:`.real_nvrx`).
"""

from __future__ import annotations

import os

#: The directory to put first on ``PYTHONPATH``: it holds the ``nvidia_resiliency_ext`` shim.
SHIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")

__all__ = ["SHIM_PATH"]
