"""One rank taking ``snapshot_every="auto"`` snapshots of a state of ``SNAP_MB`` MiB, for the room tests.

The rank (no launcher; a gloo process group when ``WORLD_SIZE`` > 1, one local rank
each) allocates its state (pages touched), then runs 30 steps of :class:`~ft_core.snapshots.node.NodeSnapshots` with the
default ``auto`` interval: with ``SNAP_PATH=learn`` a snapshot is taken at step 3 as the
Lightning callback takes one at the step it learns timeouts at, then the auto interval's
(the probe at step 10, ...); with ``SNAP_PATH=probe`` only the auto interval's.
``SNAP_CGROUP``: a memory cgroup directory to join first; once the state is allocated,
its limit is set to what it uses plus ``SNAP_BUDGET_MB`` MiB (``SNAP_LIMIT_FILE``,
``SNAP_USAGE_FILE``: v1's or v2's file names). Prints one JSON line: the peak RSS before
and after the steps (KiB), the steps snapshotted, whether snapshots are off.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
cgroup = os.environ.get("SNAP_CGROUP")
if cgroup:
    with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="ascii") as procs:
        procs.write(str(os.getpid()))

import torch  # noqa: E402

from ft_core.jobdir import JobDir  # noqa: E402
from ft_core.snapshots.interval import AutoInterval  # noqa: E402
from ft_core.snapshots.node import NodeSnapshots  # noqa: E402
from ft_core.snapshots.slots import SnapshotSlots  # noqa: E402

numel = int(os.environ["SNAP_MB"]) * (1 << 20) // 4
state = {"model": {"w": torch.ones(numel // 2)}, "optimizer": {"exp_avg": torch.ones(numel - numel // 2)}, "step": 0}
if cgroup:
    with open(os.path.join(cgroup, os.environ["SNAP_USAGE_FILE"]), encoding="ascii") as usage:
        used = int(usage.read())
    with open(os.path.join(cgroup, os.environ["SNAP_LIMIT_FILE"]), "w", encoding="ascii") as limit:
        limit.write(str(used + int(os.environ["SNAP_BUDGET_MB"]) * (1 << 20)))

rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
if world_size > 1:
    torch.distributed.init_process_group("gloo")
job = JobDir(os.environ["SNAP_JOB_DIR"]).create()
node = NodeSnapshots(SnapshotSlots(os.environ["SNAP_DIR"], rank, world_size), job.monitor_socket, 0, AutoInterval())
node.resume(None)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
taken = []
for step in range(1, 31):
    state["step"] = step
    if os.environ["SNAP_PATH"] == "learn" and step == 3 and node.due(step, every=1):
        took = node.take(step, lambda: state)
    else:
        took = node.maybe_save(step, lambda: state)
    if took:
        taken.append(step)
        assert node.writer is not None and node.writer.wait(60)
node.close()
if world_size > 1:
    torch.distributed.destroy_process_group()
print(json.dumps({"before_kib": before, "after_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "taken": taken, "off": node.every == 0}), flush=True)
