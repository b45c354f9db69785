"""Fixtures of the in-process restart's unit tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ft_core.inprocess import State


@pytest.fixture
def state() -> Callable[..., State]:
    """Builds the ``State`` a hook receives: rank 0 of 4 in iteration 0 without faults, but for ``changes``."""

    def state(**changes) -> State:
        fields = dict(iteration=0, initial_rank=0, initial_world_size=4, rank=0, world_size=4, fault_count=0)
        return State(**{**fields, **changes})

    return state
