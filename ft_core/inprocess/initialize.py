"""Built-in ``initialize`` hooks (run by every rank at the start of each attempt)."""

from __future__ import annotations

from typing import Optional

from ft_core.utils.validation import int_in_range

from .exceptions import RestartAbort
from .hook_context import State

__all__ = ["RetryController"]


class RetryController:
    """Stop restarting in process after ``max_iterations`` calls or below ``min_world_size``.

    ``max_iterations`` counts calls of the function (iteration 0 is the first
    call; ``None`` means no limit). ``min_world_size`` is the smallest number of
    active ranks worth training with. When either limit is hit every rank
    raises ``RestartAbort``, exits non-zero and leaves recovery to the
    launcher's in-job restart.
    """

    def __init__(self, max_iterations: Optional[int] = None, min_world_size: int = 1) -> None:
        if max_iterations is not None:
            int_in_range("RetryController.max_iterations", max_iterations, 1)
        self.max_iterations = max_iterations
        self.min_world_size = int_in_range("RetryController.min_world_size", min_world_size, 1)

    def __call__(self, state: State) -> None:
        if self.max_iterations is not None and state.iteration >= self.max_iterations:
            raise RestartAbort(f"in-process restart gave up: {self.max_iterations} iterations used")
        if state.world_size < self.min_world_size:
            raise RestartAbort(
                f"in-process restart gave up: {state.world_size} active ranks left, "
                f"min_world_size={self.min_world_size}"
            )
