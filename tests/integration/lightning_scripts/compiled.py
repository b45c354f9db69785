"""A Lightning run of a ``torch.compile``-d model that recompiles at the epoch's last, smaller batch.

Sections mode; timeouts are learned at global step ``--calc-steps``, past the default warm-up. The
dataset gives ``--batches`` full batches of 4 and one of 2 (``drop_last=False``): the shape change
recompiles at the last step, after learning. The compile backend is a real dynamo backend that
takes ``--compile-sleep`` seconds per graph (standing in for inductor's code generation on a big
model); ``--hang-compile N`` makes the N-th compile hang. The monitor is the test's.
"""

from __future__ import annotations

import argparse
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from ft_integrations.lightning import FaultToleranceCallback


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--calc-steps", type=int, default=8)
    parser.add_argument("--compile-sleep", type=float, default=1.0)
    parser.add_argument("--hang-compile", type=int, default=-1)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    compiles = []

    def slow_backend(gm: torch.fx.GraphModule, example_inputs):
        compiles.append(len(compiles) + 1)
        print(f"compile {len(compiles)}", flush=True)
        time.sleep(3600 if len(compiles) == args.hang_compile else args.compile_sleep)
        return gm.forward

    class Model(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.forward_fn = torch.compile(self.layer, backend=slow_backend, dynamic=False)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.forward_fn(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4 * args.batches + 2, 4), torch.randn(4 * args.batches + 2, 1))
    ft = FaultToleranceCallback(mode="sections", calculate_timeouts_after_steps=args.calc_steps, standalone="error")
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                      default_root_dir=args.out_dir, callbacks=[ft])
    trainer.fit(Model(), DataLoader(data, batch_size=4, drop_last=False))
    print(f"finished after {trainer.global_step} steps and {len(compiles)} compiles; "
          f"timeouts {ft.client.state_dict()}", flush=True)


if __name__ == "__main__":
    main()
