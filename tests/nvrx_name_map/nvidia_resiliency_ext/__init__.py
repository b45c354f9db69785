"""A stand-in ``nvidia_resiliency_ext`` whose names are ft-suite's: NVRx's own unit tests run against ours.

NVRx's tests are not on the package index (its sdist holds no tests), so they
run by hand on a checkout of nvidia-resiliency-ext (``git clone
https://github.com/NVIDIA/nvidia-resiliency-ext``): ``make test-nvrx-unit
NVRX=<checkout>``. With ``tests/nvrx_name_map`` on ``PYTHONPATH`` (inherited
by the ranks NVRx's tests spawn), each public name NVRx's tests import
resolves to ours, as the migration guide maps them; everything else (NVRx's
rank monitor server internals, launcher internals, private attributes) is
absent, so the tests that need it fail, and ``docs/migrating_from_nvrx.md``
("NVRx's own unit tests") lists each failure with its reason.

    cd <checkout>/tests/fault_tolerance/unit
    PYTHONPATH=<ft-suite>:<ft-suite>/tests/nvrx_name_map python -m pytest \\
        test_config.py test_timeouts_calc.py test_rank_monitor_client.py
"""

from __future__ import annotations

import sys
import types
from typing import Any


def _module(name: str, **names: Any) -> types.ModuleType:
    """A module named ``name`` holding ``names``, registered in ``sys.modules``."""
    module = types.ModuleType(name)
    module.__dict__.update(names)
    module.__path__ = []  # a package: its submodules are mapped too
    sys.modules[name] = module
    return module


def install() -> None:
    """Make ``nvidia_resiliency_ext.fault_tolerance`` and the submodules NVRx's tests import name ours."""
    from ft_core import client, config, data, timeouts
    from ft_core.launcher.cli import build_parser
    from ft_core.monitor import RankMonitorServer

    ft = "nvidia_resiliency_ext.fault_tolerance"
    fault_tolerance = _module(
        ft, FaultToleranceConfig=config.FaultToleranceConfig, RankMonitorClient=client.RankMonitorClient,
        RankMonitorClientError=client.RankMonitorClientError, RankMonitorServer=RankMonitorServer,
        WorkloadAction=data.WorkloadAction, WorkloadControlRequest=data.WorkloadControlRequest)
    globals()["fault_tolerance"] = fault_tolerance
    submodules = {
        "config": {"FaultToleranceConfig": config.FaultToleranceConfig},
        "data": {"HeartbeatTimeouts": timeouts.HeartbeatTimeouts, "SectionTimeouts": timeouts.SectionTimeouts,
                 "SectionAction": timeouts.SectionAction, "WorkloadAction": data.WorkloadAction,
                 "WorkloadControlRequest": data.WorkloadControlRequest},
        "timeouts_calc": {"TimeoutsCalc": timeouts.TimeoutsCalc, "TimeoutsCalcError": timeouts.TimeoutsCalcError},
        "rank_monitor_client": {"RankMonitorClient": client.RankMonitorClient,
                                "RankMonitorClientError": client.RankMonitorClientError},
        "launcher": {"get_args_parser": build_parser},
    }
    for name, names in submodules.items():
        setattr(fault_tolerance, name, _module(f"{ft}.{name}", **names))


install()
