"""A real lightning.Trainer resuming from a bad ``last.ckpt`` falls back to the newest good checkpoint.

The callback's ``CheckpointIO`` wrapper writes every checkpoint atomically with a manifest;
on resume it checks the one Lightning asks for (``ckpt_path="last"``) and loads the
newest older checkpoint of the same directory that passes instead; after the resume the
callback watches the loss of the first steps. One process, no monitor
(``standalone="off"``: checkpoint safety does not need one). Each test takes 2-4 s.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from ft_core.checkpoint_manifest import save_file_atomically, verify
from ft_core.fault_policy import NonFiniteLossError
from ft_integrations.checkpoint_guard import fallback_candidates
from ft_integrations.lightning import FaultToleranceCallback

pytestmark = pytest.mark.timeout(120)


class _StartStep(Callback):
    """Records the global step training (re)started at."""

    def __init__(self) -> None:
        self.start = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = trainer.global_step


class _MomentumModel(BoringModel):
    """BoringModel with SGD momentum (an optimizer state that can be corrupt) and its step logged."""

    def training_step(self, batch, batch_idx):
        self.log("neg_step", -float(self.global_step))
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def _fit(ckpt_dir, max_steps: int, resume: bool, checkpoints=None, model=None) -> _StartStep:
    start = _StartStep()
    checkpoints = checkpoints or [ModelCheckpoint(dirpath=str(ckpt_dir), every_n_train_steps=5, save_top_k=-1,
                                                  save_last=True)]
    trainer = Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                      callbacks=[FaultToleranceCallback(standalone="off"), start, *checkpoints])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model or BoringModel(), ckpt_path="last" if resume else None)
    return start


def test_every_checkpoint_is_written_with_a_manifest(tmp_path):
    _fit(tmp_path, 10, resume=False)
    names = sorted(os.listdir(tmp_path))
    assert names == ["epoch=0-step=10.ckpt", "epoch=0-step=10.ckpt.manifest.json", "epoch=0-step=5.ckpt",
                     "epoch=0-step=5.ckpt.manifest.json", "last.ckpt", "last.ckpt.manifest.json"]
    assert all(verify(str(tmp_path / n)) is None for n in names if n.endswith(".ckpt"))
    assert _fit(tmp_path, 15, resume=True).start == 10  # a good last.ckpt is used as it is


def test_a_truncated_last_checkpoint_falls_back_to_the_newest_good_one(tmp_path, caplog):
    _fit(tmp_path, 10, resume=False)
    with open(tmp_path / "last.ckpt", "r+b") as handle:
        handle.truncate(100)  # a save killed by a full disk, say
    (tmp_path / "epoch=0-step=10.ckpt").unlink()  # and the step-10 copy gone: fall back to step 5
    assert _fit(tmp_path, 15, resume=True).start == 5
    assert "rejected" in caplog.text and "torn or truncated" in caplog.text


def test_a_checkpoint_with_nan_weights_is_not_resumed_from(tmp_path, caplog):
    _fit(tmp_path, 10, resume=False)
    last = str(tmp_path / "last.ckpt")
    state = torch.load(last, weights_only=False)
    state["state_dict"]["layer.weight"][0, 0] = float("nan")
    # A complete, well-formed file with a valid manifest: only the finite check can catch it.
    save_file_atomically(last, lambda temp: torch.save(state, temp), global_step=10)
    assert verify(last) is None
    assert _fit(tmp_path, 15, resume=True).start == 10  # epoch=0-step=10.ckpt, whose weights are finite
    assert "non-finite values in state_dict.layer.weight" in caplog.text


def test_fallback_takes_the_checkpoints_model_checkpoint_kept_newest_step_first(tmp_path):
    # Top-k by a metric that prefers early steps (it keeps 3 and 6, deletes 9 and 12), every-n files
    # (5, 10) of a second ModelCheckpoint in the same directory, and last.ckpt (step 12).
    top_k = ModelCheckpoint(dirpath=str(tmp_path), monitor="neg_step", mode="max", save_top_k=2,
                            every_n_train_steps=3, save_last=True)
    every_n = ModelCheckpoint(dirpath=str(tmp_path), filename="every-{step}", save_top_k=-1, every_n_train_steps=5)
    _fit(tmp_path, 12, resume=False, checkpoints=[top_k, every_n], model=_MomentumModel())
    last = str(tmp_path / "last.ckpt")
    assert [os.path.basename(p) for p in fallback_candidates(last)] == [
        "every-step=10.ckpt", "epoch=0-step=6.ckpt", "every-step=5.ckpt", "epoch=0-step=3.ckpt"]
    with open(last, "r+b") as handle:
        handle.truncate(100)
    assert _fit(tmp_path, 14, resume=True, checkpoints=[top_k, every_n], model=_MomentumModel()).start == 10


def _poison_momentum(path: str, value: float) -> None:
    state = torch.load(path, weights_only=False)
    for buffers in state["optimizer_states"][0]["state"].values():
        buffers["momentum_buffer"] = torch.full_like(buffers["momentum_buffer"], value)
    save_file_atomically(path, lambda temp: torch.save(state, temp), global_step=state["global_step"])


def test_a_nan_optimizer_state_is_rejected_before_it_is_loaded(tmp_path, caplog):
    _fit(tmp_path, 10, resume=False, model=_MomentumModel())
    _poison_momentum(str(tmp_path / "last.ckpt"), float("nan"))
    assert _fit(tmp_path, 12, resume=True, model=_MomentumModel()).start == 10  # the step-10 copy is whole
    assert "non-finite values in optimizer_states[0].state.0.momentum_buffer" in caplog.text


class _ManualModel(_MomentumModel):
    """The same model trained with manual optimization (``manual_backward``; ``training_step`` returns nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(self.step(batch))
        optimizer.step()


@pytest.mark.parametrize("model", [_MomentumModel, _ManualModel], ids=["automatic", "manual"])
def test_a_nan_loss_right_after_a_resume_raises_nonfinite_loss_error(tmp_path, model):
    # A corrupt but finite optimizer state (momentum 1e38): the checkpoint passes every load check;
    # its first update overflows the weights, and the loss of the next step says so.
    _fit(tmp_path, 10, resume=False, model=model())
    _poison_momentum(str(tmp_path / "last.ckpt"), 1e38)
    with pytest.raises(NonFiniteLossError, match=r"at step 11, 1 step\(s\) after resuming from .*last.ckpt"):
        _fit(tmp_path, 15, resume=True, model=model())


def test_ten_healthy_resumes_in_a_row_are_each_verified_and_watched_without_a_false_verdict(tmp_path):
    _fit(tmp_path, 5, resume=False, model=_MomentumModel())
    for resume in range(1, 11):
        assert _fit(tmp_path, 5 * (resume + 1), resume=True, model=_MomentumModel()).start == 5 * resume
    assert verify(str(tmp_path / "last.ckpt")) is None


class _NanLossAfter(_MomentumModel):
    """A finite run whose loss turns NaN from global step ``nan_from`` on (a loss spike of the training's own)."""

    def __init__(self, nan_from: int) -> None:
        super().__init__()
        self.nan_from = nan_from

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        return out if self.global_step < self.nan_from else {"loss": out["loss"] * float("nan")}


def test_a_nan_loss_past_the_window_is_left_to_the_training(tmp_path):
    _fit(tmp_path, 5, resume=False, model=_MomentumModel())
    # Resumed at 5, window 10 (the default): global step 16 is past it.
    assert _fit(tmp_path, 18, resume=True, model=_NanLossAfter(nan_from=16)).start == 5
    again = tmp_path / "again"
    _fit(again, 5, resume=False, model=_MomentumModel())
    with pytest.raises(NonFiniteLossError, match=r"at step 15, 10 step\(s\)"):  # the last step inside it
        _fit(again, 18, resume=True, model=_NanLossAfter(nan_from=15))
