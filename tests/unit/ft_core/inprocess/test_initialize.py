"""The built-in ``initialize`` hook: ``RetryController`` stops in-process restarts at its limits."""

from __future__ import annotations

import pytest

from ft_core.inprocess import RestartAbort, RetryController


def test_retry_controller_limits_iterations_and_world_size(state):
    controller = RetryController(max_iterations=2, min_world_size=3)
    controller(state(iteration=1, world_size=3))
    with pytest.raises(RestartAbort, match="2 iterations used"):
        controller(state(iteration=2))
    with pytest.raises(RestartAbort, match="2 active ranks left, min_world_size=3"):
        controller(state(world_size=2))
    with pytest.raises(ValueError, match="RetryController.max_iterations: invalid value 0; allowed: an integer >= 1"):
        RetryController(max_iterations=0)
