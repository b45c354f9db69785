"""A real lightning.Trainer resuming from a bad ``last.ckpt`` falls back to the newest good checkpoint.

The callback's ``CheckpointIO`` wrapper writes every checkpoint atomically with a manifest;
on resume it checks the one Lightning asks for (``ckpt_path="last"``) and loads the
newest older checkpoint of the same directory that passes instead. One process, no
monitor (``standalone="off"``: checkpoint safety does not need one).
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
from ft_integrations.lightning import FaultToleranceCallback

pytestmark = pytest.mark.timeout(120)


class _StartStep(Callback):
    """Records the global step training (re)started at."""

    def __init__(self) -> None:
        self.start = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = trainer.global_step


def _fit(ckpt_dir, max_steps: int, resume: bool) -> _StartStep:
    start = _StartStep()
    trainer = Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                      callbacks=[FaultToleranceCallback(standalone="off"), start,
                                 ModelCheckpoint(dirpath=str(ckpt_dir), every_n_train_steps=5, save_top_k=-1,
                                                 save_last=True)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(BoringModel(), ckpt_path="last" if resume else None)
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
