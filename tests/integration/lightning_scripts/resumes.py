"""One job's life in one process: a fresh Lightning run, then resumes from its checkpoints.

Each run is what a requeued job does: a new ``Trainer``, a new ``FaultToleranceCallback``
(heartbeats mode, learning on: the defaults) and a new model, ``fit(ckpt_path="last")``.
The fresh run saves twice (every ``--every`` steps); each resume does ``--every + 1`` steps
of its own with exactly one save of ``--save-sleep`` seconds; start-up alternates between
``--setup-sleep`` and twice that. The monitor is the test's (``FT_RANK_MONITOR_IPC_SOCKET``).

Writes ``<out>/run<N>.json`` per run (N = 0 for the fresh run): the timeouts in force at
train start and at the end. ``--hang-run N`` makes run N hang (a real sleep, no heartbeat)
in its last step, after its save.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset
from train import SlowModel  # this directory's train.py (on the path: the script's own directory)

from ft_integrations.lightning import FaultToleranceCallback


class Model(SlowModel):
    """train.py's model that hangs (a real sleep, no heartbeat) in step ``hang_step``."""

    def __init__(self, step_sleep: float, save_sleep: float, setup_sleep: float, hang_step: int) -> None:
        super().__init__(step_sleep, save_sleep, setup_sleep)
        self.hang_step = hang_step

    def training_step(self, batch, batch_idx):
        if self.global_step == self.hang_step:
            print(f"hanging at step {self.global_step}", flush=True)
            time.sleep(3600)
        return super().training_step(batch, batch_idx)


class Report(Callback):
    def __init__(self, ft: FaultToleranceCallback, path: str) -> None:
        self.ft, self.path, self.data = ft, path, {}

    def on_train_start(self, trainer, pl_module):
        self.data.update(start_step=trainer.global_step, start=self.ft.client.state_dict())

    def on_fit_end(self, trainer, pl_module):
        self.data.update(end_step=trainer.global_step, end=self.ft.state_dict())
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump(self.data, handle)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resumes", type=int, default=10)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--save-sleep", type=float, default=0.75)
    parser.add_argument("--setup-sleep", type=float, default=0.2)
    parser.add_argument("--hang-run", type=int, default=-1)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    every = args.every
    for run in range(args.resumes + 1):
        # The fresh run ends one step past its second save; each resume one step past its only save.
        max_steps = (run + 2) * every + 1
        ft = FaultToleranceCallback(calculate_timeouts_after_steps=every + 1, standalone="error")
        trainer = Trainer(
            accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=True, limit_val_batches=0, default_root_dir=args.out_dir,
            callbacks=[ft, Report(ft, os.path.join(args.out_dir, f"run{run}.json")),
                       ModelCheckpoint(dirpath=os.path.join(args.out_dir, "ckpt"), save_top_k=0, save_last=True,
                                       every_n_train_steps=every)])
        setup_sleep = args.setup_sleep * (1 + run % 2)  # start-up varies 2x between runs
        model = Model(args.step_sleep, args.save_sleep, setup_sleep, max_steps - 1 if run == args.hang_run else -1)
        trainer.fit(model, DataLoader(data, batch_size=4), ckpt_path="last")


if __name__ == "__main__":
    main()
