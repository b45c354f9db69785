"""Checkpoint directories a strategy writes itself get a manifest of every file; a resume verifies it.

What is real: ``lightning.Trainer``, ``ModelCheckpoint``, the callback, and the sharded save
and load of ``torch.distributed.checkpoint`` (DCP) into a checkpoint directory, with the calls
and layout ``FSDPStrategy(state_dict_type="sharded")`` uses (``dcp.save`` of
``{"model", "optimizer_0"}``, rank 0's ``meta.pt`` for the rest, ``restore_checkpoint_after_setup``,
the model and optimizers loaded in place). What stands in: Lightning refuses ``FSDPStrategy``
without a GPU ("requires a GPU accelerator"), so :class:`DCPStrategy`, a one-process
``SingleDeviceStrategy`` that saves and loads the way it does, replaces it (DCP writes its
``.distcp`` shard files and ``.metadata`` without a process group). Each test takes 1-2 s.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
import torch.distributed.checkpoint as dcp
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import SingleDeviceStrategy

from ft_core.checkpoint_manifest import DIR_MANIFEST, read_manifest, verify
from ft_integrations.checkpoint_guard import NoGoodCheckpointError
from ft_integrations.lightning import FaultToleranceCallback

pytestmark = pytest.mark.timeout(120)
META = "meta.pt"  # FSDPStrategy's _METADATA_FILENAME


class DCPStrategy(SingleDeviceStrategy):
    """Saves and loads a checkpoint directory through DCP, as ``FSDPStrategy`` does with sharded state dicts."""

    def __init__(self) -> None:
        super().__init__(device=torch.device("cpu"))

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False  # loaded in load_checkpoint, as FSDPStrategy does

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        path = Path(filepath)
        if path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        converted = {"model": checkpoint.pop("state_dict")}
        converted.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        dcp.save(converted, checkpoint_id=path)
        if self.global_rank == 0:
            torch.save(checkpoint, path / META)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> dict[str, Any]:
        path = Path(checkpoint_path)
        state = {"model": self.model.state_dict(), "optimizer_0": self.optimizers[0].state_dict()}
        dcp.load(state, checkpoint_id=path)
        self.model.load_state_dict(state["model"])
        self.optimizers[0].load_state_dict(state["optimizer_0"])
        return torch.load(path / META, weights_only=False)

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        pass  # loaded in load_checkpoint, as FSDPStrategy does

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        pass


class _StartStep(Callback):
    start: Optional[int] = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = trainer.global_step


def _fit(ckpt_dir: Path, max_steps: int, resume: bool) -> Optional[int]:
    start = _StartStep()
    trainer = Trainer(max_steps=max_steps, accelerator="cpu", strategy=DCPStrategy(), logger=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      num_sanity_val_steps=0,
                      callbacks=[FaultToleranceCallback(standalone="off"), start,
                                 ModelCheckpoint(dirpath=str(ckpt_dir), every_n_train_steps=5, save_top_k=-1,
                                                 save_last=True)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(BoringModel(), ckpt_path="last" if resume else None)
    return start.start


def _files(directory: Path) -> set[str]:
    return {os.path.relpath(os.path.join(root, name), directory)
            for root, _, names in os.walk(directory) for name in names} - {DIR_MANIFEST}


def _shards(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.distcp"))


def test_a_sharded_save_gets_a_manifest_listing_every_file_and_a_good_one_is_resumed_from(tmp_path):
    _fit(tmp_path, 10, resume=False)
    names = ["epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt", "last.ckpt"]
    assert sorted(os.listdir(tmp_path)) == names  # directories only: no file manifests beside them
    for name in names:
        directory = tmp_path / name
        manifest = read_manifest(str(directory))
        assert manifest is not None and verify(str(directory)) is None
        assert {entry.name for entry in manifest.versions[0].files} == _files(directory)
        assert {".metadata", META} < _files(directory) and _shards(directory)
        assert manifest.global_step == (5 if "step=5" in name else 10)
    assert _fit(tmp_path, 15, resume=True) == 10
    last = str(tmp_path / "last.ckpt")  # saved again in place, at step 15: its manifest follows
    assert verify(last) is None and read_manifest(last).global_step == 15  # type: ignore[union-attr]


def _tear_step_10(ckpt_dir: Path) -> None:
    for name in ("last.ckpt", "epoch=0-step=10.ckpt"):  # both copies of step 10 torn: a full disk, say
        shard = _shards(ckpt_dir / name)[0]
        with open(shard, "r+b") as handle:
            handle.truncate(shard.stat().st_size // 2)


def test_a_torn_shard_of_the_latest_falls_back_to_the_previous_directory(tmp_path, caplog):
    _fit(tmp_path, 10, resume=False)
    _tear_step_10(tmp_path)
    assert _fit(tmp_path, 12, resume=True) == 5
    assert "torn or truncated" in caplog.text


def test_without_a_whole_directory_the_resume_fails_instead_of_loading_a_torn_one(tmp_path):
    _fit(tmp_path, 10, resume=False)
    _tear_step_10(tmp_path)
    os.unlink(tmp_path / "epoch=0-step=5.ckpt" / DIR_MANIFEST)  # a save killed before its manifest
    with pytest.raises(NoGoodCheckpointError) as error:
        _fit(tmp_path, 12, resume=True)
    # Both copies of step 10 rejected; step 5, without a manifest, is not even a candidate.
    assert [os.path.basename(r.path) for r in error.value.rejections] == ["last.ckpt", "epoch=0-step=10.ckpt"]
