"""The client's errors keep NVRx's names and bases, so users' ``except`` clauses keep working."""

from __future__ import annotations

import ft_core.client
from ft_core.client_errors import LauncherUnavailableError, RankMonitorClientError


def test_no_launcher_is_both_a_client_error_and_the_runtime_error_nvrx_raises():
    assert issubclass(LauncherUnavailableError, RankMonitorClientError)
    assert issubclass(LauncherUnavailableError, RuntimeError)
    assert not issubclass(RankMonitorClientError, RuntimeError)


def test_the_errors_are_importable_from_the_client_module_as_in_nvrx():
    assert ft_core.client.RankMonitorClientError is RankMonitorClientError
    assert ft_core.client.LauncherUnavailableError is LauncherUnavailableError
