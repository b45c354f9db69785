"""Synthetic regression data generated from a seed: ships with the project, no downloads."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class SyntheticRegressionData(pl.LightningDataModule):
    """``y = x @ w + noise`` with a fixed seed, identical on every rank and every restart.

    Args:
        num_samples: training samples (validation gets a quarter as many).
        in_features: input width.
        batch_size: per-rank batch size.
        noise: standard deviation of the label noise.
        seed: generator seed.
    """

    def __init__(self, num_samples: int = 2048, in_features: int = 16, batch_size: int = 32,
                 noise: float = 0.1, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        h = self.hparams
        generator = torch.Generator().manual_seed(h.seed)
        weights = torch.randn(h.in_features, generator=generator)

        def make(n: int) -> TensorDataset:
            x = torch.randn(n, h.in_features, generator=generator)
            return TensorDataset(x, x @ weights + h.noise * torch.randn(n, generator=generator))

        self.train_set, self.val_set = make(h.num_samples), make(max(h.num_samples // 4, h.batch_size))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)
