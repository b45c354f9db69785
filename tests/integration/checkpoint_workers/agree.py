"""Two ranks (gloo) load with ``load_verified`` where only rank 1 cannot load the newest checkpoint.

Rank 0 saves ``step=10/20/30.ckpt`` (with manifests); rank 1's ``load`` fails for step 30 (as
a node whose copy is unreadable would). Each rank writes ``<dir>/agree_r<RANK>.json``: the
checkpoint it resumed from and the reasons of the ones it skipped.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from ft_core.checkpoint_manifest import save_file_atomically
from ft_integrations.checkpoint_guard import fallback_candidates, load_verified

directory = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    for step in (10, 20, 30):
        state = {"w": torch.full((4,), float(step))}
        save_file_atomically(os.path.join(directory, f"step={step}.ckpt"),
                             lambda temp, state=state: torch.save(state, temp), global_step=step)
dist.barrier()


def load(path: str):
    if rank == 1 and path.endswith("step=30.ckpt"):
        raise OSError("Input/output error")
    return torch.load(path, weights_only=True)


newest = os.path.join(directory, "step=30.ckpt")
result = load_verified(newest, fallback_candidates(newest), load, weights=lambda state: state)
with open(os.path.join(directory, f"agree_r{rank}.json"), "w", encoding="utf-8") as handle:
    json.dump({"path": result.path, "step": result.step, "rejected": [r.reason for r in result.rejected]}, handle)
dist.destroy_process_group()
