"""The straggler ``data`` phase as Lightning runs it: from the end of every callback's batch hooks to the next batch."""

from __future__ import annotations

import time
from typing import Any, Optional

from typing_extensions import override

from ft_integrations.lightning._pl import Callback, pl

__all__ = ["DataPhaseStart", "callbacks_of"]


class DataPhaseStart(Callback):
    """Starts the next batch's ``data`` phase once every callback's ``on_train_batch_end`` ran.

    The fault-tolerance callback appends it last at ``on_train_start`` and reads :attr:`ended`. Callbacks after the
    fault-tolerance callback (the progress bar, model checkpointing) do work on rank 0 only (the
    bar's metrics are a device sync on a GPU, a checkpoint is written by rank 0): inside the
    ``data`` phase it would make rank 0 look like a straggler. Work Lightning does after the hooks
    (its loggers, on rank 0) still falls inside; ``straggler_min_phase_seconds`` keeps a phase that
    short from being scored.
    """

    def __init__(self) -> None:
        #: ``time.monotonic()`` once every callback's hook of the last batch had run; None: no batch yet.
        self.ended: Optional[float] = None

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.ended = time.monotonic()


def callbacks_of(trainer: pl.Trainer) -> list[Callback]:
    """The trainer's callback list, which Lightning's callback connector sets (not declared on the class)."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    return callbacks
