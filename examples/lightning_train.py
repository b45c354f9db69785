"""Fault-tolerant Lightning training: one callback, nothing else changes.

Run it under ft_launcher (a drop-in for torchrun) so hung or crashed ranks are
restarted and training resumes from the last checkpoint::

    ft_launcher --nproc-per-node=2 --max-restarts=3 \
        --ft-rank-section-timeouts=setup:600,step:180,validation:600,checkpointing:600 \
        examples/lightning_train.py --mode sections --max-steps 200

Add ``--simulate-hang-at 50`` for a drill: rank 0 hangs at step 50 in the first
cycle, the monitor kills it, all workers restart and resume from the step-40
checkpoint. Under plain ``python`` or ``torchrun`` the callback starts its own
node monitor: hangs are still detected and the rank killed, but not restarted.
"""

from __future__ import annotations

import argparse
import os

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from ft_integrations.lightning import FaultToleranceCallback, SimulatedFault


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["heartbeats", "sections"], default="sections")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--ckpt-dir", default="checkpoints")
    parser.add_argument("--simulate-hang-at", type=int, default=None, metavar="STEP")
    args = parser.parse_args()

    fault = SimulatedFault("hang_step", rank=0, step=args.simulate_hang_at) if args.simulate_hang_at else None
    trainer = Trainer(
        accelerator="cpu" if not torch.cuda.is_available() else "auto",
        # As launched: processes per node and nodes (torchrun/ft_launcher set both; one node otherwise).
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
        max_steps=args.max_steps,
        logger=False,
        callbacks=[
            FaultToleranceCallback(mode=args.mode, calculate_timeouts_after_steps=20, autoresume=True,
                                   simulated_fault=fault),
            ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, every_n_train_steps=20),
        ],
    )
    # "last": resume after a restart or a requeue; a fresh start when there is no checkpoint yet.
    trainer.fit(BoringModel(), ckpt_path="last")


if __name__ == "__main__":
    main()
