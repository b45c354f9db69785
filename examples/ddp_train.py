"""Plain PyTorch DDP with the fault-tolerance client, under ``ft_launcher``: the script to copy.

Every rank reports where it is (sections ``setup``, ``step``, ``checkpointing``) to the
node monitor that ``ft_launcher`` starts; a rank stuck in one of them past its timeout is
killed with its stack dumped, and the launcher restarts every worker. The script resumes
from its newest checkpoint, which carries the learned timeouts (``client.state_dict()``),
and reports each save (``client.report_checkpoint``) so the launcher can tell a restart
that makes progress from one that does not.

    ft_launcher --nproc-per-node=2 --max-restarts=3 \\
        --ft-rank-section-timeouts=setup:600,step:180,checkpointing:600 \\
        --ft-rank-out-of-section-timeout=600 \\
        examples/ddp_train.py --steps 200 --ckpt-dir ckpt

``--hang-at-step N`` makes rank 1 hang in step N of the first run (a fault drill).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ft_core.client import RankMonitorClient


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps in all")
    parser.add_argument("--ckpt-dir", default="ckpt", help="where checkpoints are written and resumed from")
    parser.add_argument("--save-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--learn-after", type=int, default=20,
                        help="steps after which the section timeouts are learned (and at every save after)")
    parser.add_argument("--step-time", type=float, default=0.02, help="extra seconds per step (a heavier model)")
    parser.add_argument("--hang-at-step", type=int, default=None, help="rank 1 hangs in this step of the first run")
    return parser.parse_args()


def latest_checkpoint(ckpt_dir: str) -> str | None:
    """The newest complete checkpoint: ``latest`` names it, and is written only after the file is."""
    pointer = os.path.join(ckpt_dir, "latest")
    if not os.path.exists(pointer):
        return None
    with open(pointer, encoding="utf-8") as handle:
        return os.path.join(ckpt_dir, handle.read().strip())


def save_checkpoint(ckpt_dir: str, step: int, state: dict) -> None:
    """Write ``step_<N>.pt`` then the ``latest`` pointer, each by rename: a crash leaves the old pair whole."""
    name = f"step_{step:07d}.pt"
    torch.save(state, os.path.join(ckpt_dir, name + ".tmp"))
    os.replace(os.path.join(ckpt_dir, name + ".tmp"), os.path.join(ckpt_dir, name))
    with open(os.path.join(ckpt_dir, "latest.tmp"), "w", encoding="utf-8") as handle:
        handle.write(name)
    os.replace(os.path.join(ckpt_dir, "latest.tmp"), os.path.join(ckpt_dir, "latest"))


def main() -> None:
    args = parse_args()
    client = RankMonitorClient()
    client.init_workload_monitoring()  # ft_launcher's node monitor (FT_RANK_MONITOR_IPC_SOCKET)
    client.start_section("setup")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    os.makedirs(args.ckpt_dir, exist_ok=True)

    start = 0
    path = latest_checkpoint(args.ckpt_dir)
    if path is not None:
        state = torch.load(path, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        client.load_state_dict(state["ft_state"])  # the timeouts learned by earlier runs
        start = state["step"]
        print(f"rank {rank}: resumed from step {start} ({os.path.basename(path)})", flush=True)
    client.end_section("setup")

    first_run = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    generator = torch.Generator().manual_seed(rank)
    for step in range(start + 1, args.steps + 1):
        client.set_iteration(step)
        client.start_section("step")
        if args.hang_at_step == step and rank == 1 and first_run:
            time.sleep(3600)  # a fault drill: rank 1 never finishes this step
        inputs = torch.randn(16, 32, generator=generator)
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP's gradient all-reduce: the peer of a hung rank waits here
        optimizer.step()
        time.sleep(args.step_time)
        client.end_section("step")

        if step % args.save_every == 0 or step == args.steps:
            if step >= args.learn_after:
                # A collective: every rank calls it at the same step, before the save that keeps
                # the values. Learned values never fall below what the sections already needed;
                # "setup" is learned only by a resumed run (it loaded "ft_state"), and out of
                # section never below the launch value (docs/client.md, Learned timeouts).
                client.calculate_and_set_section_timeouts(skip_if_not_ready=True)
            client.start_section("checkpointing")
            if rank == 0:
                save_checkpoint(args.ckpt_dir, step, {
                    "model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step, "ft_state": client.state_dict()})
            dist.barrier()  # the other ranks wait for the save: inside the section too
            client.end_section("checkpointing")
            client.report_checkpoint(step)

    print(f"rank {rank}: training finished at step {args.steps}", flush=True)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
