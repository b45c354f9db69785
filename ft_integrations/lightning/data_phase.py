"""The straggler ``data`` and ``forward`` phases as Lightning runs them (:class:`StragglerPhases`)."""

from __future__ import annotations

import time
from typing import Any, Optional

from typing_extensions import override

from ft_core.client import RankMonitorClient
from ft_core.straggler_scoring import Phase
from ft_integrations.lightning._pl import Callback, pl

__all__ = ["BATCH_SAMPLES", "STEP_HOOKS", "DataPhaseStart", "StragglerPhases", "callbacks_of", "skip_unused_step_hooks"]

#: The hooks Lightning calls on every callback at every training step.
STEP_HOOKS = ("on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
              "on_before_zero_grad", "on_train_batch_end")

#: The most phase samples held before they are sent.
BATCH_SAMPLES = 32
DATA, FORWARD = Phase.DATA.value, Phase.FORWARD.value


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
        skip_unused_step_hooks(self)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.ended = time.monotonic()


def skip_unused_step_hooks(callback: Callback) -> None:
    """Have Lightning skip the step hooks ``callback``'s class leaves to ``Callback``'s no-op.

    Lightning calls every step hook of every callback, each inside a profiler context with a formatted name:
    with the code cold again after a step's compute, several microseconds per call, tens per step. Its
    dispatcher (``trainer/call.py``, ``_call_callback_hooks``) skips an attribute that is not callable, so an
    instance attribute None spares the call. A hook a subclass overrides is kept; the class is left alone
    (``super().on_after_backward(...)`` still works).
    """
    for name in STEP_HOOKS:
        if getattr(type(callback), name) is getattr(Callback, name):
            setattr(callback, name, None)


class StragglerPhases:
    """Reports each training batch's ``data`` phase (the previous batch's end, after every callback's hook, to this
    batch's start, within an epoch: across an epoch boundary the gap holds validation and checkpointing, which are
    not the data loader's) and ``forward`` phase (the batch's start to its first backward: gradient accumulation
    and manual optimization may call backward more than once).

    Nothing at all while straggler detection is off (``straggler_report_interval`` none). Samples are sent in
    batches, at most :data:`BATCH_SAMPLES` of them and at most a quarter of the report interval (1 s at most)
    after the first one, all in one ``send``: a step only appends (the first send after a step's compute, its code
    cold again, costs tens of microseconds).
    """

    def __init__(self) -> None:
        self._end = DataPhaseStart()
        self._batch_started: Optional[float] = None
        self._samples: list[tuple[str, float]] = []
        self._due = 0.0  # when the samples held must go (monotonic), however few
        self._hold = 0.0  # how long a sample may wait; 0: straggler detection is off
        self.setup()

    @property
    def held(self) -> int:
        """How many samples wait to be sent."""
        return len(self._samples)

    def setup(self) -> None:
        self._end.ended = self._batch_started = None
        self._samples.clear()
        self._hold = 0.0

    def on_train_start(self, trainer: pl.Trainer, client: RankMonitorClient) -> None:
        interval = client.cfg.straggler_report_interval if client.cfg is not None else None
        if interval is None:
            return
        self._hold = min(1.0, interval / 4)
        callbacks = callbacks_of(trainer)
        if not any(c is self._end for c in callbacks):
            callbacks.append(self._end)

    def on_train_batch_start(self, client: RankMonitorClient, batch_idx: int, now: float) -> None:
        if not self._hold:
            return
        ended = self._end.ended
        if ended is not None and batch_idx > 0:
            self._add(client, DATA, now - ended, now)
        self._batch_started = now

    def on_before_backward(self, client: RankMonitorClient, now: float) -> None:
        started = self._batch_started
        if started is not None:
            self._add(client, FORWARD, now - started, now)
            self._batch_started = None

    def _add(self, client: RankMonitorClient, phase: str, seconds: float, now: float) -> None:
        samples = self._samples
        if not samples:
            self._due = now + self._hold
        samples.append((phase, seconds))
        if len(samples) >= BATCH_SAMPLES or now >= self._due:
            self.flush(client)

    def flush(self, client: RankMonitorClient) -> None:
        """Send the samples held: one message each, all in one ``send`` (one-way: never blocks)."""
        client.record_phases(self._samples)
        self._samples.clear()

    def teardown(self, trainer: pl.Trainer, client: RankMonitorClient) -> None:
        if client.is_initialized:
            self.flush(client)
        self._samples.clear()
        callbacks = callbacks_of(trainer)
        callbacks[:] = [c for c in callbacks if c is not self._end]


def callbacks_of(trainer: pl.Trainer) -> list[Callback]:
    """The trainer's callback list, which Lightning's callback connector sets (not declared on the class)."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    return callbacks
