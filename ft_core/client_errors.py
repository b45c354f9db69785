"""The errors a ``RankMonitorClient`` raises (NVRx's names; import them from :mod:`ft_core.client`)."""

from __future__ import annotations

__all__ = ["LauncherUnavailableError", "RankMonitorClientError"]


class RankMonitorClientError(Exception):
    """Misuse of the client or a failure talking to the monitor; the message says what to do."""


class LauncherUnavailableError(RankMonitorClientError, RuntimeError):
    """No launcher to send a workload-control request to.

    Also a ``RuntimeError``: that is what NVRx raises here, so ``except RuntimeError`` keeps working.
    """
