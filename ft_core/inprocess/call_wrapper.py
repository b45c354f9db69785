"""``CallWrapper``: what the wrapped function sees of in-process restart."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Optional

from .hook_context import State
from .interruption import Interruptor
from .progress_watchdog import MainThreadProgress

if TYPE_CHECKING:
    import torch.distributed

__all__ = ["Atomic", "CallWrapper"]


class Atomic:
    """Context manager of ``CallWrapper.atomic()``; may be nested."""

    def __init__(self, interruptor: Interruptor) -> None:
        self._interruptor = interruptor

    def __enter__(self) -> Atomic:
        self._interruptor.enter_atomic()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        # Raises RankShouldRestart here if a restart was requested during the block.
        self._interruptor.exit_atomic()


class CallWrapper:
    """Passed to the wrapped function as ``call_wrapper=`` when its signature accepts it.

    * ``iteration``: how many times the function was restarted (0 on the first call);
    * ``rank`` and ``world_size``: this rank in the current iteration (also in
      ``RANK``/``WORLD_SIZE``);
    * ``store``: a ``torch.distributed.Store`` private to this iteration, for
      ``init_process_group(store=...)``; its operations time out after
      ``soft_timeout``;
    * ``ping()``: report progress by hand (the automatic watchdog only sees
      that Python code runs, not that it gets anywhere);
    * ``atomic()``: a section a restart must not interrupt; the restart, and
      the abort of the process groups, wait until the section ends.
    """

    def __init__(
        self, state: State, store: torch.distributed.Store, progress: MainThreadProgress,
        interruptor: Interruptor,
    ) -> None:
        self.state = state
        self.store = store
        self._progress = progress
        self._interruptor = interruptor

    @property
    def iteration(self) -> int:
        return self.state.iteration

    @property
    def rank(self) -> int:
        assert self.state.rank is not None  # only active ranks run the function
        return self.state.rank

    @property
    def world_size(self) -> int:
        return self.state.world_size

    def ping(self) -> None:
        self._progress.stamp()

    def atomic(self) -> Atomic:
        return Atomic(self._interruptor)
