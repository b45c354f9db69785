"""Rank filters and assignments: deterministic, contiguous, spares fill gaps."""

from __future__ import annotations

from ft_core.inprocess import ActiveWorldSize, Compose, FillGaps, RankAssignmentCtx, ShiftRanks


def ctx(members, previous=None) -> RankAssignmentCtx:
    return RankAssignmentCtx(iteration=1, members=tuple(members), active=tuple(members), previous=previous or {})


def test_shift_ranks_closes_gaps_in_initial_rank_order():
    assert ShiftRanks()(ctx([0, 2, 3])).ranks == {0: 0, 2: 1, 3: 2}


def test_fill_gaps_keeps_survivors_in_place():
    previous = {0: 0, 1: 1, 2: 2}
    assert FillGaps()(ctx([0, 2, 3], previous)).ranks == {0: 0, 2: 2, 3: 1}
    # Shrinking: a survivor whose old rank is out of range takes a free number.
    assert FillGaps()(ctx([0, 2], previous)).ranks == {0: 0, 2: 1}


def test_active_world_size_keeps_active_ranks_and_wakes_spares():
    first = ActiveWorldSize(3)(ctx([0, 1, 2, 3]))
    assert first.active == (0, 1, 2)
    # Rank 1 died: the spare (3) replaces it; with FillGaps it takes rank 1.
    after = Compose(ActiveWorldSize(3), FillGaps())(ctx([0, 2, 3], {0: 0, 1: 1, 2: 2}))
    assert after.active == (0, 2, 3) and after.ranks == {0: 0, 2: 2, 3: 1}
    # Previously active ranks stay active even if a spare has a lower initial rank.
    assert ActiveWorldSize(2)(ctx([0, 1, 2], {2: 0, 1: 1})).active == (1, 2)
    # Too few members: all of them run.
    assert ActiveWorldSize(3)(ctx([4, 5])).active == (4, 5)
