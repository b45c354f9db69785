"""Exceptions of in-process restart."""

from __future__ import annotations

__all__ = ["HealthCheckError", "RankShouldRestart", "RestartAbort", "RestartError"]


class RankShouldRestart(BaseException):
    """Raised inside the wrapped function to make it return control to the ``Wrapper``.

    It derives from ``BaseException`` so that ``except Exception`` in training
    code does not swallow it. It is raised again until the function has
    returned, so it can also land in ``except`` and ``finally`` blocks: code
    that must not be cut short (cleanup included) belongs in
    ``call_wrapper.atomic()``.
    """


class RestartError(Exception):
    """Base class of the errors that in-process restart reports to the caller."""


class RestartAbort(RestartError):
    """In-process restart gives up: the process should exit non-zero.

    Raised out of the wrapped call on every rank when the job cannot go on in
    process (attempts exhausted, too few ranks, a barrier timed out, the
    in-process store is gone). A launcher such as ``ft_launcher`` then
    restarts the workers (in-job restart).
    """


class HealthCheckError(RestartError):
    """Raised by a ``health_check`` hook: this rank must not run the function again."""
