"""Immutable snapshots handed to the pluggable hooks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["RankAssignmentCtx", "State"]


@dataclass(frozen=True)
class State:
    """What a rank knows about the current restart iteration.

    Passed to ``initialize``, ``abort``, ``finalize`` and ``health_check``.
    ``initial_rank`` and ``initial_world_size`` are the values of ``RANK`` and
    ``WORLD_SIZE`` when the wrapped function was first called; they identify a
    process for its whole life. ``rank`` is ``None`` while the process is not
    active (a spare, or excluded after a failed health check).
    """

    iteration: int
    initial_rank: int
    initial_world_size: int
    rank: Optional[int]
    world_size: int
    #: Faults blamed on this rank so far (its own exceptions and soft timeouts).
    fault_count: int = 0

    @property
    def active(self) -> bool:
        return self.rank is not None


@dataclass(frozen=True)
class RankAssignmentCtx:
    """Input and output of ``rank_filter`` and ``rank_assignment``.

    Every rank computes the same context from the same store records, so
    filters and assignments must be deterministic functions of it.

    * ``members``: initial ranks of the healthy processes that joined this
      iteration, sorted.
    * ``active``: the subset that runs the function; filters narrow it.
    * ``previous``: initial rank -> rank of the active ranks of the previous
      iteration (empty in iteration 0).
    * ``ranks``: initial rank -> new rank, filled by ``rank_assignment``; the
      values must be ``0 .. len(active) - 1``.
    """

    iteration: int
    members: tuple[int, ...]
    active: tuple[int, ...]
    previous: Mapping[int, int] = field(default_factory=dict)
    ranks: Mapping[int, int] = field(default_factory=dict)
