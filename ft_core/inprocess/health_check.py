"""Built-in ``health_check`` hooks."""

from __future__ import annotations

from ft_core.utils.validation import int_in_range

from .exceptions import HealthCheckError
from .hook_context import State

__all__ = ["FaultCounter"]


class FaultCounter:
    """Retire a rank after ``max_rank_faults`` faults were blamed on it.

    A fault is blamed on a rank when its function raised first in an
    attempt or when it hit the soft timeout; ranks that only failed because
    another rank's fault broke their collectives are not blamed. A retired rank
    stays alive but never runs the function again.
    """

    def __init__(self, max_rank_faults: int) -> None:
        self.max_rank_faults = int_in_range("FaultCounter.max_rank_faults", max_rank_faults, 1)

    def __call__(self, state: State) -> None:
        if state.fault_count >= self.max_rank_faults:
            raise HealthCheckError(
                f"rank {state.initial_rank} had {state.fault_count} faults "
                f"(FaultCounter max_rank_faults={self.max_rank_faults})"
            )
