"""Two fits of a 2-rank Lightning DDP job saving checkpoint directories through DCP (any launcher).

Fit 1 trains to step 10 with ``ModelCheckpoint`` every 5 steps (directories with a manifest
each, written by the callback's sharded guard); then rank 0 tears one ``.distcp`` file of both
copies of step 10 (``last.ckpt`` and the step-10 directory); fit 2 resumes from ``last``.
Each rank writes ``<out>/sharded_r<RANK>.json``: the step fit 2 started from and the files
of every checkpoint directory's manifest as fit 1 left it.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings

import torch
import torch.distributed as dist
from dcp_strategy import DDPDCPStrategy
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from ft_core.checkpoint_manifest import read_manifest
from ft_integrations.lightning import FaultToleranceCallback


class _StartStep(Callback):
    start = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = trainer.global_step


def _fit(ckpt_dir: str, max_steps: int, resume: bool) -> int:
    start = _StartStep()
    trainer = Trainer(max_steps=max_steps, accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                      strategy=DDPDCPStrategy(), logger=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, num_sanity_val_steps=0,
                      callbacks=[FaultToleranceCallback(standalone="off"), start,
                                 ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=5, save_top_k=-1,
                                                 save_last=True)])
    trainer.fit(BoringModel(), ckpt_path="last" if resume else None)
    return start.start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    rank = int(os.environ["RANK"])
    _fit(args.ckpt_dir, 10, resume=False)
    manifests = {}
    for name in sorted(os.listdir(args.ckpt_dir)):
        manifest = read_manifest(os.path.join(args.ckpt_dir, name))
        manifests[name] = sorted(e.name for e in manifest.versions[0].files) if manifest else None
    dist.barrier()
    if rank == 0:
        for name in ("last.ckpt", "epoch=0-step=10.ckpt"):
            shard = os.path.join(args.ckpt_dir, name, "__1_0.distcp")  # rank 1's file
            with open(shard, "r+b") as handle:
                handle.truncate(os.path.getsize(shard) // 2)
    dist.barrier()
    start = _fit(args.ckpt_dir, 12, resume=True)
    with open(os.path.join(args.out_dir, f"sharded_r{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump({"start": start, "manifests": manifests}, handle)
    # Lightning leaves the process group to the interpreter's exit, where gloo's threads can abort the process
    # ("terminate called without an active exception", seen in CI): end it, as a script run by torchrun should.
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
