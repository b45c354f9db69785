"""The NaN watch as Lightning runs it (:class:`ft_integrations.lightning.loss_watch.ResumeLossWatch`): armed only after
a verified resume (a disk checkpoint or a newer snapshot), reading the loss only inside the window after it."""

from __future__ import annotations

import types

import pytest
import torch

from ft_core.fault_policy import NonFiniteLossError
from ft_integrations.checkpoint_guard import LoadResult
from ft_integrations.lightning.loss_watch import ResumeLossWatch


class Loss:
    """A loss that counts its reads (each is a device sync on a GPU)."""

    def __init__(self, value: float) -> None:
        self.value, self.reads = torch.tensor(value), 0

    def __getattr__(self, name):
        self.reads += 1
        return getattr(self.value, name)


def _trainer(step: int):
    return types.SimpleNamespace(global_step=step)


def test_a_fresh_start_is_not_watched():
    watch = ResumeLossWatch()
    watch.on_train_start(_trainer(0), window=10)
    watch.on_before_backward(_trainer(1), torch.tensor(float("nan")))  # nothing loaded: the loss is not the checkpoint's


def test_after_a_verified_resume_a_nan_loss_in_the_window_names_the_checkpoint_and_later_steps_read_nothing():
    watch = ResumeLossWatch()
    watch.on_checkpoint_loaded_verified(LoadResult(state={}, path="/ckpt/step=20.ckpt", rejected=[], step=20))
    watch.on_train_start(_trainer(20), window=3)
    watch.on_before_backward(_trainer(21), torch.tensor(0.5))
    with pytest.raises(NonFiniteLossError, match="/ckpt/step=20.ckpt"):
        watch.on_before_backward(_trainer(22), torch.tensor(float("inf")))
    past = Loss(float("nan"))
    watch.on_before_backward(_trainer(24), past)  # past the window: a loss spike is the training's own business
    watch.on_before_backward(_trainer(25), past)
    assert past.reads == 0  # the watch was dropped: no sync on the steps after the window


def test_a_snapshot_newer_than_the_disk_checkpoint_is_what_the_watch_names():
    watch = ResumeLossWatch()
    watch.on_checkpoint_loaded_verified(LoadResult(state={}, path="/ckpt/step=20.ckpt", rejected=[], step=20))
    watch.on_fit_start(LoadResult(state={}, path="snapshot:25:ab12", rejected=[], step=25))
    watch.on_train_start(_trainer(25), window=5)
    with pytest.raises(NonFiniteLossError, match="snapshot:25:ab12"):
        watch.on_before_backward(_trainer(26), torch.tensor(float("nan")))
    watch.setup()  # a new fit: nothing resumed yet
    watch.on_train_start(_trainer(0), window=5)
    watch.on_before_backward(_trainer(1), torch.tensor(float("nan")))
