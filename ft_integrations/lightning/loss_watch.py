"""The NaN watch as Lightning runs it: after a verified resume, the first steps' loss must be finite.

What a run resumed from is told by :class:`~ft_integrations.lightning.checkpoint_io.FaultToleranceCheckpointIO`
or :class:`~ft_integrations.lightning.sharded.ShardedCheckpointGuard` (a verified disk checkpoint) or by
the snapshots (a newer in-memory snapshot); the loss is read (a device sync) only in the window of
:class:`~ft_integrations.checkpoint_guard.LossWatch` after it, never on the steps after the window.
"""

from __future__ import annotations

from typing import Any, Optional

from ft_integrations.checkpoint_guard import LoadResult, LossWatch
from ft_integrations.lightning._pl import pl, rank_zero_warn

__all__ = ["ResumeLossWatch"]


class ResumeLossWatch:
    """The checkpoint (or snapshot) a run resumed from, and the :class:`LossWatch` of the steps after it."""

    def __init__(self) -> None:
        #: What this run resumed from, once verified; None: a fresh start, or an unverified load.
        self.loaded: Optional[LoadResult] = None
        self._watch: Optional[LossWatch] = None

    def setup(self) -> None:
        self.loaded, self._watch = None, None

    def on_checkpoint_loaded_verified(self, result: LoadResult) -> None:
        """The checkpoint a resume loaded, and the newer ones it skipped (each named in a warning)."""
        for rejection in result.rejected:
            rank_zero_warn(f"FaultToleranceCallback: checkpoint {rejection.path} rejected ({rejection.reason}); "
                           f"resuming from {result.path}")
        self.loaded = result

    def on_fit_start(self, resumed: Optional[LoadResult]) -> None:
        """``resumed``: the snapshot the run resumed from, newer than the disk checkpoint (None: none)."""
        if resumed is not None:
            self.loaded = resumed

    def on_train_start(self, trainer: pl.Trainer, window: int) -> None:
        """Watch the ``window`` steps after the resume (0: not watched)."""
        if self.loaded is not None and window > 0:
            self._watch = LossWatch(trainer.global_step, self.loaded.path, window)

    def on_before_backward(self, trainer: pl.Trainer, loss: Any) -> None:
        """The loss every optimization mode backpropagates (automatic, or ``manual_backward``'s), before it reaches
        the weights; past the window the watch is dropped: free from then on."""
        watch = self._watch
        if watch is None:
            return
        step = trainer.global_step  # the iteration the monitor has (set_iteration): the fault names the same
        if watch.watching(step):
            watch.check(loss, step)
        else:
            self._watch = None
