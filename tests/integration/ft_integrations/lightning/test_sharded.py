"""Checkpoint directories a strategy writes itself get a manifest of every file; a resume verifies it.

What is real: ``lightning.Trainer``, ``ModelCheckpoint``, the callback, and the save and load
of ``torch.distributed.checkpoint`` (DCP) into a checkpoint directory, with the calls and layout
``FSDPStrategy(state_dict_type="sharded")`` uses. What stands in: Lightning refuses
``FSDPStrategy`` without a GPU ("requires a GPU accelerator"), so the strategies of
``lightning_scripts/dcp_strategy.py`` save and load the way it does (one process here, DDP
with 2 ranks under torchrun in the last test). The one-process tests take 1-2 s each.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Optional

import pytest
from helpers import free_port
from launcher_helpers import run_job
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning_scripts.dcp_strategy import META, DCPStrategy
from lightning_scripts.harness import SCRIPTS, base_env

from ft_core.checkpoint_manifest import DIR_MANIFEST, read_manifest, verify
from ft_integrations.checkpoint_guard import NoGoodCheckpointError
from ft_integrations.lightning import FaultToleranceCallback

pytestmark = pytest.mark.timeout(120)


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


@pytest.mark.timeout(300)
def test_two_ranks_write_one_manifest_of_all_their_files_and_fall_back_together(tmp_path):
    # 2 ranks under torchrun (gloo), DDP saving through DCP: each rank writes its own file into
    # every checkpoint directory. Rank 1's file of step 10 torn: both ranks resume from step 5.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=0",
           f"--master-port={free_port()}", str(SCRIPTS / "sharded_resume.py"), f"--ckpt-dir={tmp_path / 'ckpt'}",
           f"--out-dir={tmp_path}"]
    result = run_job(cmd, base_env(tmp_path), timeout=240, log_path=tmp_path / "torchrun.log")
    assert not result.timed_out and result.returncode == 0, result.output[-6000:]
    reports = [json.loads((tmp_path / f"sharded_r{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["start"] for r in reports] == [5, 5]
    files = [".metadata", "__0_0.distcp", "__1_0.distcp", META]
    assert reports[0]["manifests"] == {name: files for name in ("epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt",
                                                                "last.ckpt")}
    assert "__1_0.distcp has" in result.output and "torn or truncated" in result.output
