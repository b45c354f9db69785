"""A plain-torch job (gloo, 2 ranks) whose newest checkpoint loads and holds finite weights but is bad.

Checkpoints every ``--every`` steps (rank 0; ``ckpt_step<N>.pt``, each with its manifest, written
with :func:`ft_core.checkpoint_manifest.save_file_atomically`). In cycle 0 the checkpoint of
``--poison-step`` gets NaN in its SGD momentum buffers (a corrupt optimizer state: the weights
are finite, so the load's finite check of the weights passes), then rank 1 crashes a step later
(a transient fault). A resume loads with :func:`ft_integrations.checkpoint_guard.load_verified`
(newest first; records ``checkpoint_loaded``/``checkpoint_rejected`` for the launcher) and
watches the loss of the first steps with :class:`~ft_integrations.checkpoint_guard.LossWatch`:
from the poisoned checkpoint the loss turns NaN and the watch raises ``NonFiniteLossError``.
Each rank writes ``<out>/r<RANK>_c<cycle>.json``: the step it started from and its last step.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re

import torch
import torch.distributed as dist

from ft_core.checkpoint_manifest import save_file_atomically
from ft_core.client import RankMonitorClient
from ft_integrations.checkpoint_guard import LossWatch, load_verified


def checkpoints(directory: str) -> list[str]:
    """The job's checkpoints, newest step first."""
    found = glob.glob(os.path.join(directory, "ckpt_step*.pt"))
    return sorted(found, key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]), reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--poison-step", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rank, cycle = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start, watch = 0, None
    found = checkpoints(args.out)
    if found:
        result = load_verified(found[0], found[1:], torch.load, weights=lambda state: state["model"])
        model.load_state_dict(result.state["model"])
        optimizer.load_state_dict(result.state["optimizer"])
        start = result.state["step"]
        watch = LossWatch(start, result.path)
    data = torch.Generator().manual_seed(1234 + rank)
    for step in range(start + 1, args.steps + 1):
        client.set_iteration(step)
        x = torch.randn(8, 4, generator=data)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        if watch is not None:
            watch.check(loss, step)
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()
        optimizer.step()
        client.send_heartbeat()
        if step % args.every == 0:
            if rank == 0:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                if cycle == 0 and step == args.poison_step:
                    for buffers in state["optimizer"]["state"].values():
                        buffers["momentum_buffer"] = torch.full_like(buffers["momentum_buffer"], float("nan"))
                save_file_atomically(os.path.join(args.out, f"ckpt_step{step}.pt"),
                                     lambda temp, state=state: torch.save(state, temp), global_step=step)
                client.report_checkpoint(step)
            dist.barrier()
        if cycle == 0 and rank == 1 and step == args.poison_step + 1:
            os._exit(3)
    with open(os.path.join(args.out, f"r{rank}_c{cycle}.json"), "w", encoding="utf-8") as handle:
        json.dump({"start_step": start, "end_step": args.steps}, handle)
    client.shutdown_workload_monitoring(training_finished=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
