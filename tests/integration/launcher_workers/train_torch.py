"""A small deterministic DDP-style training run with plain torch (gloo), checkpoints and one crash.

Every rank trains a linear model on seeded synthetic data, all-reduces the gradients, saves a
checkpoint (rank 0) every ``--every`` steps and, in cycle 0, rank 1 exits with code 3 at
``--crash-step``. A restarted cycle resumes from the last checkpoint. Each rank writes
``<out>/train_r<RANK>_c<cycle>.json`` with the step it started from, its losses, the final step and
the final parameters. Rank 0 then marks training finished (``FAULT_TOL_FINISHED_FLAG_FILE``, when set).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from ft_core.autoresume import mark_training_finished


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--crash-step", type=int, default=7)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rank, cycle = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # torch seeds itself from the OS at start-up: reproducible runs set a seed
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    start = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    report = {"start_step": start, "losses": []}
    data = torch.Generator().manual_seed(1234 + rank)
    for _ in range(start):  # the data of the steps already done
        torch.randn(8, 4, generator=data)
    for step in range(start, args.steps):
        x = torch.randn(8, 4, generator=data)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()
        optimizer.step()
        report["losses"].append(loss.item())
        if (step + 1) % args.every == 0:
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
                           checkpoint + ".tmp")
                os.replace(checkpoint + ".tmp", checkpoint)
            dist.barrier()
        if cycle == 0 and rank == 1 and step + 1 == args.crash_step:
            os._exit(3)
    report.update(end_step=args.steps, params=[p.detach().flatten().tolist() for p in model.parameters()])
    with open(os.path.join(args.out, f"train_r{rank}_c{cycle}.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    dist.barrier()
    if rank == 0:
        # Training is complete: a rank that gloo aborts at interpreter exit ("terminate called without an
        # active exception", seen under load) is then not a fault to restart (see docs/launcher.md).
        mark_training_finished()
    dist.barrier()  # the flag exists before any rank ends its process group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
