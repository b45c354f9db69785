"""In-process restart: a fault on one rank restarts the training function on all ranks, in place.

Run (CPU, gloo)::

    torchrun --nproc-per-node=3 examples/inprocess_restart.py

Rank 1 raises in the first iteration. Every rank leaves ``train`` (rank 0 and
rank 2 were blocked in an all_reduce with rank 1: the abort releases them),
and all of them call ``train`` again in the same processes: the pids printed
for iteration 0 and iteration 1 are the same. Training resumes from the last
"checkpoint" (here a dict kept in memory) and finishes.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional

import torch
import torch.distributed as dist

from ft_core.inprocess import CallWrapper, RetryController, Wrapper

STEPS = 6
checkpoint = {"step": 0, "weights": torch.zeros(4)}  # stands in for a checkpoint on disk


@Wrapper(
    initialize=RetryController(max_iterations=3, min_world_size=2),
    soft_timeout=20.0,
    hard_timeout=40.0,
    heartbeat_timeout=30.0,
    barrier_timeout=90.0,
    monitor_process_interval=0.5,
)
def train(call_wrapper: Optional[CallWrapper] = None) -> torch.Tensor:
    rank = call_wrapper.rank
    print(f"[pid {os.getpid()}] iteration {call_wrapper.iteration}: rank {rank} of {call_wrapper.world_size}, "
          f"resuming at step {checkpoint['step']}", flush=True)
    # A fresh process group per iteration, on the iteration's own store namespace.
    dist.init_process_group("gloo", store=call_wrapper.store, rank=rank, world_size=call_wrapper.world_size)
    weights = checkpoint["weights"].clone()
    for step in range(checkpoint["step"], STEPS):
        if call_wrapper.iteration == 0 and rank == 1 and step == 3:
            raise RuntimeError("injected fault on rank 1")
        grad = torch.full((4,), float(rank + 1))
        dist.all_reduce(grad)
        weights += grad / call_wrapper.world_size
        with call_wrapper.atomic():  # a restart never cuts a checkpoint write in half
            checkpoint.update(step=step + 1, weights=weights.clone())
        time.sleep(0.1)
    dist.destroy_process_group()
    return weights


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    result = train()
    print(f"[pid {os.getpid()}] done: weights={result.tolist()}", flush=True)
