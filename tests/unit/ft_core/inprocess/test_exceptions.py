"""The exceptions of in-process restart: a restart request that training code's ``except Exception`` cannot swallow."""

from __future__ import annotations

import pytest

from ft_core.inprocess import HealthCheckError, RankShouldRestart, RestartAbort, RestartError


def test_a_restart_request_passes_through_except_exception():
    def training_step() -> None:
        try:
            raise RankShouldRestart()
        except Exception:  # noqa: BLE001 - what training code does; must not catch the request
            raise AssertionError("swallowed") from None

    with pytest.raises(RankShouldRestart):
        training_step()
    assert not issubclass(RankShouldRestart, Exception)


def test_the_errors_reported_to_the_caller_share_one_base():
    assert issubclass(RestartAbort, RestartError) and issubclass(HealthCheckError, RestartError)
    assert issubclass(RestartError, Exception)
