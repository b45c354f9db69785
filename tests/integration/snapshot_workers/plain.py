"""A plain-torch training loop with in-memory snapshots through the client API, for ft_launcher tests.

Every rank all-reduces a step's update over gloo, saves a snapshot every 2 steps
(``ft_core.save_snapshot``, waiting for the write so the test knows what each
rank holds) and, on a restart, resumes from ``load_snapshot()`` (no disk checkpoint).
Appends ``{rank, cycle, resumed_step, slots, weight}`` to ``SNAP_OUT`` at start and at the end.
``SNAP_STEPS``: steps to reach; ``SNAP_KILL_AT``: global rank 1 SIGKILLs itself after that step in cycle 0.
``SNAP_NAN_AT``: in cycle 0 every rank's weight turns NaN at that step (its snapshot holds the NaN).
``SNAP_BAD_STEP``: global rank 1, resumed from the snapshot of that step, raises ``ValueError`` at the
next step, in every cycle (a snapshot that loads and is finite, yet bad; one rank, so that every
such fault names the same culprit).
"""

from __future__ import annotations

import json
import os
import signal
import time

import torch
import torch.distributed as dist

from ft_core.client import RankMonitorClient
from ft_core.snapshots.node import load_snapshot, process_snapshots, save_snapshot

rank, cycle = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
steps, kill_at = int(os.environ["SNAP_STEPS"]), int(os.environ.get("SNAP_KILL_AT", "-1"))
nan_at, bad_step = int(os.environ.get("SNAP_NAN_AT", "-1")), int(os.environ.get("SNAP_BAD_STEP", "-1"))
dist.init_process_group("gloo")
client = RankMonitorClient()
client.init_workload_monitoring()
weight = torch.zeros(1024)


def record(**fields) -> None:
    with open(os.environ["SNAP_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps({"rank": rank, "cycle": cycle, **fields}) + "\n")


state = load_snapshot(disk_step=None)
step = 0
if state is not None:
    weight, step = state["weight"], state["step"]
snapshots = process_snapshots()
record(resumed_step=step, slots=snapshots.slots.path if snapshots is not None else None)
resumed_bad = state is not None and step == bad_step and rank == 1
while step < steps:
    step += 1
    client.set_iteration(step)
    if resumed_bad:
        raise ValueError(f"bad state resumed from the snapshot of step {bad_step}")
    update = torch.ones(1024)
    dist.all_reduce(update)
    weight += update
    if cycle == 0 and step == nan_at:
        weight[0] = float("nan")
    client.send_heartbeat()
    if step % 2 == 0:
        save_snapshot({"weight": weight, "step": step}, step, wait=True)
    if cycle == 0 and rank == 1 and step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
record(end_step=step, weight=float(weight[0]))
client.shutdown_workload_monitoring()
dist.destroy_process_group()
