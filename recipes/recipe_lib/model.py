"""A small regression MLP: real Lightning training in a few seconds on a CPU."""

from __future__ import annotations

import time

import lightning.pytorch as pl
import torch
from torch import nn


class TinyRegressor(pl.LightningModule):
    """Two-layer MLP trained with MSE.

    Args:
        in_features: input width (must match the data).
        hidden: hidden width.
        lr: SGD learning rate.
        step_delay: extra seconds per training step, to give drills a realistic
            step time (a hang must be distinguishable from a slow step).
    """

    def __init__(self, in_features: int = 16, hidden: int = 32, lr: float = 0.05, step_delay: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.hparams.step_delay:
            time.sleep(self.hparams.step_delay)
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=False, sync_dist=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
