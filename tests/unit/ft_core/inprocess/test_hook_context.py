"""What the hooks receive: immutable views of the current iteration."""

from __future__ import annotations

import dataclasses

import pytest

from ft_core.inprocess import RankAssignmentCtx, State


def test_a_rank_without_a_rank_is_not_active_and_the_state_cannot_be_changed_by_a_hook():
    active = State(iteration=1, initial_rank=3, initial_world_size=4, rank=2, world_size=3)
    spare = dataclasses.replace(active, rank=None)
    assert active.active and not spare.active and active.fault_count == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        active.rank = 0  # type: ignore[misc]


def test_a_rank_assignment_starts_with_no_previous_ranks_and_no_assignment():
    ctx = RankAssignmentCtx(iteration=0, members=(0, 1, 2), active=(0, 1, 2))
    assert (dict(ctx.previous), dict(ctx.ranks)) == ({}, {})
    assert dataclasses.replace(ctx, ranks={0: 0, 2: 1}).ranks == {0: 0, 2: 1} and ctx.ranks == {}
