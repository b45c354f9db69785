"""One rank of a gloo job that resumes from the snapshot slots of several scenarios (``agree.py OUT DIR...``).

For each directory (prepared by the test: ``<dir>/shm`` holds the stores, ``<dir>/job-x`` the job dir),
the rank calls ``NodeSnapshots.resume(disk_step=5)`` and appends ``{dir, rank, step, source, reason}`` to OUT.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

from ft_core.snapshots.node import NodeSnapshots
from ft_core.snapshots.slots import SnapshotSlots

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out, directories = sys.argv[1], sys.argv[2:]
for directory in directories:
    node = NodeSnapshots(SnapshotSlots(os.path.join(directory, "shm"), rank, world),
                         os.path.join(directory, "job-x", "monitor.sock"), every=5)
    state = node.resume(disk_step=5)
    node.close()
    assert node.agreement is not None and node.source is not None
    with open(out, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"dir": os.path.basename(directory), "rank": rank, "source": node.source.value,
                                 "step": None if state is None else state["step"],
                                 "reason": node.agreement.reason}) + "\n")
dist.destroy_process_group()
