"""A Lightning DDP job (any launcher) whose checkpoints go bad, or whose training step fails deterministically.

``--corrupt='{"8": "truncate", "6": "nan_weights", "4": "huge_momentum"}'``: in cycle 0,
once the checkpoint of ``--crash-step`` is saved, rank 0 damages the checkpoint files of
those steps (the step's ``ModelCheckpoint`` file, and ``last.ckpt`` for the newest step)
and crashes (a transient fault). ``truncate`` cuts the file (a full disk), ``nan_weights``
and ``huge_momentum`` rewrite it whole, with a valid manifest, holding a NaN weight or an
SGD momentum of 1e38: finite, so it passes every load check, and its first update
overflows the weights, so the loss of the next step is infinite.

``--damage-state=STEP:KIND --snapshot-every=N``: in cycle 0, at the end of step STEP (before
the callback's in-memory snapshot of that step), every rank damages its live state the same
way (``nan_weights`` or ``huge_momentum``), and once every rank's snapshot of STEP is written
rank 0 crashes at the start of the next step: the snapshot of STEP holds the damage, the
older ones and the disk checkpoints do not.

``--raise-at=STEP --raise-rank=R``: rank R raises ``ValueError`` in ``training_step`` at
global step STEP, in every cycle (a deterministic fault).

Each rank writes ``<out>/report_r<RANK>_c<cycle>.json``: the step it started from and
the step it finished at.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from ft_core.checkpoint_manifest import save_file_atomically
from ft_integrations.lightning import FaultToleranceCallback

CYCLE = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
RANK = int(os.environ.get("RANK", "0"))


class Model(LightningModule):
    def __init__(self, raise_at: int, raise_rank: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.raise_at, self.raise_rank = raise_at, raise_rank

    def training_step(self, batch, batch_idx):
        if self.global_step == self.raise_at and self.global_rank == self.raise_rank:
            raise ValueError(f"bad batch at step {self.global_step}")
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def _rewrite(path: str, change) -> None:
    state = torch.load(path, weights_only=False)
    change(state)
    save_file_atomically(path, lambda temp: torch.save(state, temp), global_step=state["global_step"])


def _nan_weight(state: dict) -> None:
    state["state_dict"]["layer.weight"][0, 0] = float("nan")


def _huge_momentum(state: dict) -> None:
    for buffers in state["optimizer_states"][0]["state"].values():
        buffers["momentum_buffer"] = torch.full_like(buffers["momentum_buffer"], 1e38)


def _truncate(path: str) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(100)


DAMAGE = {"truncate": _truncate, "nan_weights": lambda p: _rewrite(p, _nan_weight),
          "huge_momentum": lambda p: _rewrite(p, _huge_momentum)}


class Damage(Callback):
    """Cycle 0, rank 0: once the checkpoint of ``crash_step`` is written, damage checkpoints and crash."""

    def __init__(self, ckpt_dir: str, crash_step: int, corrupt: dict[str, str]) -> None:
        self.ckpt_dir, self.crash_step, self.corrupt = ckpt_dir, crash_step, corrupt

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if CYCLE != 0 or RANK != 0 or not self.corrupt or trainer.global_step != self.crash_step:
            return
        for step, kind in self.corrupt.items():
            paths = glob.glob(os.path.join(self.ckpt_dir, f"epoch=*-step={step}.ckpt"))
            if int(step) == self.crash_step:
                paths.append(os.path.join(self.ckpt_dir, "last.ckpt"))
            for path in paths:
                DAMAGE[kind](path)
        os._exit(3)


class DamageState(Callback):
    """Cycle 0: at the end of ``step`` every rank damages its live state; at the next step's start rank 0 crashes."""

    def __init__(self, step: int, kind: str) -> None:
        self.step, self.kind = step, kind

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if CYCLE == 0 and trainer.global_step == self.step:
            state = {"state_dict": pl_module.state_dict(keep_vars=True),
                     "optimizer_states": [trainer.optimizers[0].state_dict()]}
            with torch.no_grad():
                {"nan_weights": _nan_weight, "huge_momentum": _huge_momentum}[self.kind](state)
            if self.kind == "huge_momentum":  # state_dict() holds the buffers themselves: write them back
                trainer.optimizers[0].load_state_dict(state["optimizer_states"][0])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if CYCLE == 0 and trainer.global_step == self.step:
            # Every rank's snapshot of the step whole first (its writer thread would die with the process).
            (ft,) = [c for c in trainer.callbacks if isinstance(c, FaultToleranceCallback)]
            assert ft._snapshots is not None and ft._snapshots.node.writer is not None
            assert ft._snapshots.node.writer.wait(60)
            if RANK == 0:
                os._exit(3)


class Report(Callback):
    def __init__(self, out_dir: str) -> None:
        self.path = os.path.join(out_dir, f"report_r{RANK}_c{CYCLE}.json")
        self.data: dict = {}

    def _write(self) -> None:
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump(self.data, handle)

    def on_train_start(self, trainer, pl_module) -> None:
        self.data["start_step"] = trainer.global_step
        self._write()

    def on_fit_end(self, trainer, pl_module) -> None:
        self.data["end_step"] = trainer.global_step
        self._write()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--crash-step", type=int, default=8)
    parser.add_argument("--corrupt", default="{}", help='{"<step>": "truncate|nan_weights|huge_momentum"}')
    parser.add_argument("--damage-state", default="", help="STEP:nan_weights|huge_momentum")
    parser.add_argument("--snapshot-every", default="auto")
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=1)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    every = args.snapshot_every if args.snapshot_every == "auto" else int(args.snapshot_every)
    damage_state = []
    if args.damage_state:
        step, kind = args.damage_state.split(":")
        damage_state.append(DamageState(int(step), kind))
    data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    trainer = Trainer(
        accelerator="cpu", strategy="ddp", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        max_steps=args.max_steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, default_root_dir=args.out_dir,
        callbacks=[*damage_state,  # before the fault-tolerance callback: its snapshot of the step holds the damage
                   FaultToleranceCallback(calculate_timeouts=False, autoresume=True, snapshot_every=every),
                   Damage(args.ckpt_dir, args.crash_step, json.loads(args.corrupt)), Report(args.out_dir),
                   ModelCheckpoint(dirpath=args.ckpt_dir, save_top_k=-1, save_last=True,
                                   every_n_train_steps=args.every)],
    )
    trainer.fit(Model(args.raise_at, args.raise_rank), DataLoader(data, batch_size=4), ckpt_path="last")


if __name__ == "__main__":
    main()
