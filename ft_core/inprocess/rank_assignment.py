"""Built-in ``rank_filter`` and ``rank_assignment`` hooks.

A filter chooses which members run the function (``ctx.active``); an
assignment gives each of them a new contiguous rank (``ctx.ranks``). Both
are deterministic, so all ranks reach the same answer independently.
"""

from __future__ import annotations

import dataclasses

from ft_core.utils.validation import int_in_range

from .hook_context import RankAssignmentCtx

__all__ = ["ActiveWorldSize", "FillGaps", "ShiftRanks"]


class ShiftRanks:
    """Close the gaps left by missing ranks: active ranks in initial-rank order get 0, 1, 2..."""

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        ranks = {initial: rank for rank, initial in enumerate(sorted(ctx.active))}
        return dataclasses.replace(ctx, ranks=ranks)


class FillGaps:
    """Keep each surviving rank's number; ranks joining (spares) take the numbers left free.

    Compared with ``ShiftRanks`` this moves the fewest ranks, which keeps data
    shards and parallel groups of the survivors in place when a spare replaces
    a lost rank.
    """

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        size = len(ctx.active)
        ranks = {i: ctx.previous[i] for i in ctx.active if ctx.previous.get(i, size) < size}
        free = iter(sorted(set(range(size)) - set(ranks.values())))
        for initial in sorted(set(ctx.active) - set(ranks)):
            ranks[initial] = next(free)
        return dataclasses.replace(ctx, ranks=ranks)


class ActiveWorldSize:
    """Run the function on at most ``world_size`` ranks; the other members wait as warm spares.

    Ranks that were active in the previous attempt stay active; when one is
    lost, the spare with the lowest initial rank takes its place. With fewer
    members than ``world_size`` all of them are active (combine with
    ``RetryController(min_world_size=...)`` to give up instead).
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = int_in_range("ActiveWorldSize.world_size", world_size, 1)

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        # Previously active ranks first (in their old rank order), then spares by initial rank.
        order = sorted(ctx.active, key=lambda i: (i not in ctx.previous, ctx.previous.get(i, 0), i))
        active = tuple(sorted(order[: self.world_size]))
        return dataclasses.replace(ctx, active=active)

