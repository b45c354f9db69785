"""The core's public names are importable from the package top, and the submodule paths still work."""


import ft_core


def test_public_names_import_from_the_top():
    from ft_core import (  # noqa: F401
        FaultToleranceConfig,
        HeartbeatTimeouts,
        RankMonitorClient,
        RankMonitorClientError,
        RankMonitorServer,
        SectionTimeouts,
        WorkloadAction,
        WorkloadControlRequest,
    )
    from ft_core.client import RankMonitorClient as FromSubmodule

    assert RankMonitorClient is FromSubmodule
    assert set(ft_core.__all__) >= {"RankMonitorClient", "RankMonitorServer", "FaultToleranceConfig"}


def test_unknown_name_raises_attribute_error():
    try:
        ft_core.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_the_monitor_package_keeps_its_import_paths():
    from ft_core import RankMonitorServer as FromTop
    from ft_core.monitor import MonitorProcess, RankMonitorServer
    from ft_core.monitor.server import RankMonitorServer as FromServer
    from ft_core.monitor.spawn import MonitorProcess as FromProcess

    assert FromTop is RankMonitorServer is FromServer
    assert MonitorProcess is FromProcess
