"""A one-GPU Lightning run with the callback's defaults and the loss on the progress bar (``make test-gpu``).

``self.log(..., prog_bar=True)`` moves the loss to the host for the bar at every step: the callback's
hooks run beside that synchronisation on a real device. In cycle 0, rank 0 hangs at ``--hang-step``
(after the timeouts were learned at step 100): the learned timeout must catch it, the next cycle resume
from the last checkpoint and finish. Writes ``<out>/report_c<cycle>.json``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from ft_integrations.lightning import FaultToleranceCallback


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Report(Callback):
    def __init__(self, ft: FaultToleranceCallback, out_dir: str) -> None:
        self.ft = ft
        self.path = os.path.join(out_dir, f"report_c{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}.json")
        self.data: dict = {}

    def on_train_start(self, trainer, pl_module):
        self.data.update(start_step=trainer.global_step, device=str(pl_module.device), start_timeouts=self.ft.state_dict())
        self._write()

    def on_fit_end(self, trainer, pl_module):
        self.data.update(end_step=trainer.global_step)
        self._write()

    def _write(self) -> None:
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump(self.data, handle)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=160)
    parser.add_argument("--hang-step", type=int, default=130)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    ft = FaultToleranceCallback(simulated_fault={"kind": "hang_step", "rank": 0, "step": args.hang_step})
    data = TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1))
    trainer = Trainer(
        accelerator="gpu", devices=1, max_steps=args.max_steps, logger=False, enable_progress_bar=True,
        enable_model_summary=False, limit_val_batches=0, default_root_dir=args.out_dir,
        callbacks=[ft, Report(ft, args.out_dir),
                   ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, every_n_train_steps=20)],
    )
    trainer.fit(Model(), DataLoader(data, batch_size=64), ckpt_path="last")


if __name__ == "__main__":
    main()
