"""A small Lightning DDP training run for the fault tolerance tests (any launcher).

Writes ``<out>/report_r<RANK>_c<TORCHELASTIC_RESTART_COUNT>.json`` with the step the
run started from, the timeouts in force at train start, and the step it finished at.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from ft_core.data import WorkloadAction, WorkloadControlRequest
from ft_integrations.lightning import FaultToleranceCallback


class SlowModel(LightningModule):
    """A linear model whose step and checkpoint take a known minimum time."""

    def __init__(self, step_sleep: float, save_sleep: float, setup_sleep: float, load_sleep: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.step_sleep = step_sleep
        self.save_sleep = save_sleep
        self.setup_sleep = setup_sleep
        self.load_sleep = load_sleep

    def setup(self, stage):
        # Floors under the learned timeouts, so a loaded test machine cannot trip them.
        time.sleep(self.setup_sleep)

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_sleep)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_save_checkpoint(self, checkpoint):
        time.sleep(self.save_sleep)

    def on_load_checkpoint(self, checkpoint):
        # A resume's setup is longer than a fresh start's: it loads a checkpoint.
        time.sleep(self.load_sleep)


class Report(Callback):
    """Records what the tests check, per rank and restart cycle."""

    def __init__(self, ft: FaultToleranceCallback, out_dir: str) -> None:
        self.ft = ft
        cycle = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.path = os.path.join(out_dir, f"report_r{os.environ.get('RANK', '0')}_c{cycle}.json")
        self.data: dict = {}

    def _write(self) -> None:
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump(self.data, handle)

    def setup(self, trainer, pl_module, stage):
        self._setup_started = time.monotonic()

    def on_train_start(self, trainer, pl_module):
        self.data.update(start_step=trainer.global_step, start_timeouts=self.ft.client.state_dict(),
                         active=self.ft.active, setup_seconds=time.monotonic() - self._setup_started,
                         prewarmed="ft_core.launcher.startup.zygote" in sys.modules,
                         snapshot_slots=self.ft._snapshots.node.slots.path if self.ft._snapshots else None,
                         start_snapshot_every=self.ft._snapshots.node.every if self.ft._snapshots else None)
        self._write()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # After the fault tolerance callback's: the steps it took a snapshot at, with the interval then in force.
        node = self.ft._snapshots.node if self.ft._snapshots else None
        taken = self.data.setdefault("snapshots", [])
        step = trainer.global_step
        if node is not None and node._last_step == step and (not taken or taken[-1][0] != step):
            taken.append([step, node.every])
            self._write()  # a killed rank's report keeps them

    def on_fit_end(self, trainer, pl_module):
        self.data.update(end_step=trainer.global_step, end_timeouts=self.ft.state_dict(),
                         params=[p.detach().flatten().tolist() for p in pl_module.parameters()])
        self._write()


def shutdown_policy(exc: BaseException) -> WorkloadControlRequest:
    return WorkloadControlRequest(WorkloadAction.ShutdownWorkload, f"unrecoverable: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="heartbeats")
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--every-n-steps", type=int, default=2)
    parser.add_argument("--calc-steps", type=int, default=3)
    parser.add_argument("--no-calculate-timeouts", action="store_true")
    parser.add_argument("--step-sleep", type=float, default=0.1)
    parser.add_argument("--save-sleep", type=float, default=0.3)
    parser.add_argument("--setup-sleep", type=float, default=0.5)
    parser.add_argument("--load-sleep", type=float, default=0.0, help="seconds a checkpoint load takes")
    parser.add_argument("--fault", default=None, help="SimulatedFault fields as JSON")
    parser.add_argument("--policy", choices=["none", "shutdown"], default="none")
    parser.add_argument("--standalone", default="monitor")
    parser.add_argument("--config-json", default=None, help="config of a standalone monitor")
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--seed", type=int, default=None, help="seed torch before the data and the model")
    parser.add_argument("--snapshot-every", type=int, default=None,
                        help="FaultToleranceCallback(snapshot_every=); not given: the callback's default")
    args = parser.parse_args()
    if args.seed is not None:
        torch.manual_seed(args.seed)

    ft = FaultToleranceCallback(
        mode=args.mode,
        calculate_timeouts=not args.no_calculate_timeouts,
        calculate_timeouts_after_steps=args.calc_steps,
        autoresume=True,
        simulated_fault=json.loads(args.fault) if args.fault else None,
        exc_handling_policy=shutdown_policy if args.policy == "shutdown" else None,
        standalone=args.standalone,
        config=json.loads(args.config_json) if args.config_json else None,
        **({} if args.snapshot_every is None else {"snapshot_every": args.snapshot_every}),
    )
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = Trainer(
        accelerator="cpu", strategy="ddp", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        max_steps=args.max_steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, default_root_dir=args.out_dir,
        callbacks=[ft, Report(ft, args.out_dir),
                   ModelCheckpoint(dirpath=args.ckpt_dir, save_top_k=-1, save_last=True,
                                   every_n_train_steps=args.every_n_steps)],
    )
    trainer.fit(SlowModel(args.step_sleep, args.save_sleep, args.setup_sleep, args.load_sleep), DataLoader(data, batch_size=4), ckpt_path="last")


if __name__ == "__main__":
    main()
