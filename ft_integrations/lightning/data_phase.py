"""The straggler ``data`` and ``forward`` phases as Lightning runs them (:class:`StragglerPhases`)."""

from __future__ import annotations

import time
from typing import Any, Optional

from typing_extensions import override

from ft_core.client import RankMonitorClient
from ft_core.straggler_scoring import Phase
from ft_integrations.lightning._pl import Callback, pl

__all__ = ["DataPhaseStart", "StragglerPhases", "callbacks_of"]


class DataPhaseStart(Callback):
    """Starts the next batch's ``data`` phase once every callback's ``on_train_batch_end`` ran.

    :class:`StragglerPhases` appends it last at ``on_train_start`` and reads :attr:`ended`. Callbacks after the
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


class StragglerPhases:
    """Reports each training batch's ``data`` phase (the previous batch's end, after every callback's hook, to this
    batch's start, within an epoch: across an epoch boundary the gap holds validation and checkpointing, which are
    not the data loader's) and ``forward`` phase (the batch's start to its first backward: gradient accumulation
    and manual optimization may call backward more than once)."""

    def __init__(self) -> None:
        self._end = DataPhaseStart()
        self._batch_started: Optional[float] = None

    def setup(self) -> None:
        self._end.ended = self._batch_started = None

    def on_train_start(self, trainer: pl.Trainer) -> None:
        callbacks = callbacks_of(trainer)
        if not any(c is self._end for c in callbacks):
            callbacks.append(self._end)

    def on_train_batch_start(self, client: RankMonitorClient, batch_idx: int, now: float) -> None:
        ended = self._end.ended
        if ended is not None and batch_idx > 0:
            client.record_phase(Phase.DATA.value, now - ended)
        self._batch_started = now

    def on_before_backward(self, client: RankMonitorClient) -> None:
        started = self._batch_started
        if started is not None:
            client.record_phase(Phase.FORWARD.value, time.monotonic() - started)
            self._batch_started = None

    def teardown(self, trainer: pl.Trainer) -> None:
        callbacks = callbacks_of(trainer)
        callbacks[:] = [c for c in callbacks if c is not self._end]


def callbacks_of(trainer: pl.Trainer) -> list[Callback]:
    """The trainer's callback list, which Lightning's callback connector sets (not declared on the class)."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    return callbacks
