"""Cost of in-memory snapshots (``ft_core.snapshots``) for a ~200 MB training state (prints JSON).

The state is a model's parameters and Adam's two moments (``--state-mb`` in all, float32).
Measured in one process, in this order:

* ``floor_memcpy_to_shm_s``: the raw copy of the same bytes into a ``/dev/shm`` file (``os.write``
  of each tensor's buffer), beside ``copy_on_training_thread_s`` (what ``save()`` blocks the
  training thread for: the tensors copied to host memory) and ``snapshot_write_s`` (copy,
  ``torch.save`` into the slot and its manifest's CRC-32, end to end);
* ``overhead_pct``: the step time of a training loop paced like a step (``--step-ms`` of real
  matmul compute, then an in-place update of every parameter and moment, as an optimizer does)
  with a snapshot every ``--snapshot-every`` steps, against the same loop without snapshots,
  in interleaved rounds (per-round means; median, p99, min, max over the rounds); the same in
  CPU seconds of the process (``cpu_overhead_pct``: on a shared machine, wall time is mostly
  the other processes' noise), from which ``cost_per_snapshot_cpu_s`` and the interval that
  keeps snapshots within 3 % of a step (``snapshot_every_for_3pct``) follow, beside the interval
  ``snapshot_every="auto"`` derives from what a job measures (``auto_snapshot_every``: the training
  thread's time plus the writer thread's CPU time per snapshot, ``auto_cost_per_snapshot_s``, within
  2 % of the wall step time, see ``ft_core.snapshots.interval``) and the overhead measured at that
  interval (``auto_overhead_pct``, ``auto_cpu_overhead_pct``: ``--auto-pairs`` pairs of blocks of
  that many steps, one snapshot in one block of each pair, none in the other, in alternating order,
  each step against the median of the steps around it, see ``overhead_at_interval``);
* ``resume_from_snapshot_s`` (agreement, checksums, ``torch.load(mmap=True)`` from shared memory)
  against ``resume_from_disk_s`` (the manifest's checksum and ``torch.load`` of the same state saved
  as a disk checkpoint in ``--disk-dir``, its pages dropped from the page cache first, as after a
  restart on another day; ``resume_from_disk_warm_s`` with the pages cached), each up to the loaded
  state copied into the training state's tensors (what ``load_state_dict`` does: a mapped tensor's
  pages are read then, so a lazy load is not counted as free); ``resume_snapshot_over_disk_warm``:
  each snapshot resume over the warm disk resume right after it (paired, robust to a shared
  machine's drifting load), and both in CPU seconds (``resume_from_snapshot_cpu_s``,
  ``resume_from_disk_warm_cpu_s``).

    python benchmarks/snapshot.py [--state-mb 192] [--repeats 10] [--rounds 4] [--steps 60]
                                  [--step-ms 200] [--snapshot-every N] [--auto-pairs 6]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, summarize  # noqa: E402

from ft_core.checkpoint_manifest import save_file_atomically, verify  # noqa: E402
from ft_core.jobdir import JobDir  # noqa: E402
from ft_core.snapshots.interval import SnapshotCost, interval_for  # noqa: E402
from ft_core.snapshots.node import NodeSnapshots  # noqa: E402
from ft_core.snapshots.slots import SnapshotSlots  # noqa: E402
from ft_core.snapshots.space import SHM_BASE  # noqa: E402
from ft_core.snapshots.writer import copy_state  # noqa: E402


def make_state(state_mb: int) -> dict:
    per = state_mb * (1 << 20) // 4 // 3 // 8  # float32 elements per tensor: 8 parameters, 3 copies each
    params = [torch.randn(per) for _ in range(8)]
    return {"step": 0, "model": {f"w{i}": p for i, p in enumerate(params)},
            "optimizer": {"exp_avg": [torch.zeros(per) for _ in params],
                          "exp_avg_sq": [torch.zeros(per) for _ in params]}}


def tensors(state: dict) -> list[torch.Tensor]:
    return [*state["model"].values(), *state["optimizer"]["exp_avg"], *state["optimizer"]["exp_avg_sq"]]


def floor_copy(state: dict, path: str) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for tensor in tensors(state):
            view = memoryview(tensor.numpy()).cast("B")
            while view:
                view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return time.perf_counter() - start


def restore(state: dict, loaded: dict) -> None:
    """Copy a loaded state into the training state's tensors, as ``load_state_dict`` does: part of a resume."""
    for tensor, value in zip(tensors(state), tensors(loaded)):
        tensor.copy_(value)


class Stepper:
    """A training step: ``step_ms`` of matmuls, then an in-place update of the whole state."""

    def __init__(self, state: dict, step_ms: float) -> None:
        self.state = state
        self.a = torch.randn(256, 256)
        self.matmuls = 1
        for _ in range(20):  # warm-up: the first matmuls start torch's thread pool and would count as steps
            self.a @ self.a
        start = time.perf_counter()
        for _ in range(20):
            self.a @ self.a
        per = (time.perf_counter() - start) / 20
        update = time.perf_counter()
        self._update()
        spent = time.perf_counter() - update
        self.matmuls = max(1, int((step_ms / 1000 - spent) / per))

    def _update(self) -> None:
        for tensor in tensors(self.state):
            tensor.mul_(0.999)

    def step(self) -> None:
        for _ in range(self.matmuls):
            self.a @ self.a
        self._update()
        self.state["step"] += 1


#: Steps on each side of a step in the local median its time is compared with (see ``overhead_at_interval``).
LOCAL_STEPS = 7


def excess(times: list[float]) -> tuple[float, float]:
    """(time beyond each step's local median, summed; the steps' median time) of a block of steps."""
    beyond = 0.0
    for i, value in enumerate(times):
        beyond += value - statistics.median(times[max(0, i - LOCAL_STEPS):i + LOCAL_STEPS + 1])
    return beyond, statistics.median(times)


def overhead_at_interval(node: NodeSnapshots, stepper: Stepper, state: dict, every: int,
                         pairs: int) -> tuple[list[float], list[float]]:
    """Step-time overhead (wall %, CPU %) of a snapshot every ``every`` steps, measured directly.

    Each pair runs two blocks of ``every`` steps, one taking the one snapshot due in it and one
    taking none, in alternating order; a block waits for its snapshot's write to end, which
    belongs to its last step. This machine's speed drifts by 10-20 % over tens of steps, far more
    than a snapshot costs, so block totals cannot be compared: each step is compared with the
    median of the steps around it instead (``LOCAL_STEPS`` each side), which follows the drift
    while the few steps a snapshot slows stand out. The overhead is the block's time beyond those
    local medians with the snapshot, less the same without (the steps' own unevenness), over
    ``every`` median steps.
    """
    wall, cpu = [], []
    for pair in range(pairs):
        blocks: dict[bool, tuple[tuple[float, float], tuple[float, float]]] = {}
        for with_snapshot in ((False, True) if pair % 2 == 0 else (True, False)):
            assert node.writer is not None
            node.writer.wait()
            steps, cpu_steps = [], []
            for _ in range(every):
                start, cpu_start = time.perf_counter(), time.process_time()
                stepper.step()
                if with_snapshot and node.due(state["step"], every):
                    node.take(state["step"], lambda: state)
                steps.append(time.perf_counter() - start)
                cpu_steps.append(time.process_time() - cpu_start)
            start, cpu_start = time.perf_counter(), time.process_time()
            node.writer.wait()
            steps[-1] += time.perf_counter() - start
            cpu_steps[-1] += time.process_time() - cpu_start
            blocks[with_snapshot] = (excess(steps), excess(cpu_steps))
        for kind, samples in ((0, wall), (1, cpu)):
            (beyond_with, _), (beyond_without, median) = blocks[True][kind], blocks[False][kind]
            samples.append(100.0 * (beyond_with - beyond_without) / (every * median))
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-mb", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60, help="steps per round and variant")
    parser.add_argument("--step-ms", type=float, default=200.0)
    parser.add_argument("--snapshot-every", type=int, default=10,
                        help="snapshots in the measured loop (often, to measure their cost; the default interval "
                             "is 'auto': see auto_snapshot_every)")
    parser.add_argument("--auto-pairs", type=int, default=6,
                        help="pairs of blocks of auto_snapshot_every steps, with one snapshot and without, that "
                             "measure the overhead at the default interval directly (0: skip)")
    parser.add_argument("--disk-dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()

    state = make_state(args.state_mb)
    nbytes = sum(t.numel() * t.element_size() for t in tensors(state))
    shm = tempfile.mkdtemp(prefix="ft-snapshot-bench-", dir=SHM_BASE)
    disk = tempfile.mkdtemp(prefix=".snapshot-bench-", dir=args.disk_dir)
    try:
        job = JobDir(os.path.join(shm, "job-bench")).create()
        slots = SnapshotSlots(os.path.join(shm, "slots"), rank=0, world_size=1)
        node = NodeSnapshots(slots, job.monitor_socket, every=args.snapshot_every)
        node.resume(None)  # starts the writer, as a rank's first start does
        floor, copy, write, fresh, writer_costs = [], [], [], [], []
        for _ in range(args.repeats):
            floor.append(floor_copy(state, os.path.join(shm, "floor.bin")))
            start = time.perf_counter()
            copied = copy_state(state)  # into fresh memory: what reusing the buffers saves
            fresh.append(time.perf_counter() - start)
            del copied
            start = time.perf_counter()
            node.save(state["step"], state)  # what the training thread waits for
            copy.append(time.perf_counter() - start)
            assert node.writer is not None and node.writer.wait()
            write.append(time.perf_counter() - start)
            writer_costs.append(node.writer.last_cost)
            state["step"] += 1
        os.unlink(os.path.join(shm, "floor.bin"))

        stepper = Stepper(state, args.step_ms)
        without, with_snapshots, overhead, cpu_without, cpu_with, cpu_overhead = [], [], [], [], [], []
        for _ in range(args.rounds):
            means, cpu = {}, {}
            for variant in ("without", "with"):
                assert node.writer is not None
                node.writer.wait()
                start, cpu_start = time.perf_counter(), time.process_time()
                for _ in range(args.steps):
                    stepper.step()
                    if variant == "with":
                        node.maybe_save(state["step"], lambda: state)
                node.writer.wait()  # the last snapshot's write belongs to this variant
                means[variant] = (time.perf_counter() - start) / args.steps
                cpu[variant] = (time.process_time() - cpu_start) / args.steps
            without.append(means["without"])
            with_snapshots.append(means["with"])
            overhead.append(100.0 * (means["with"] / means["without"] - 1.0))
            cpu_without.append(cpu["without"])
            cpu_with.append(cpu["with"])
            cpu_overhead.append(100.0 * (cpu["with"] / cpu["without"] - 1.0))

        # What snapshot_every="auto" picks from the same measurements as a job makes them: the training thread's
        # time, the writer thread's CPU and wall time per snapshot, and the (wall) step time.
        auto_cost = SnapshotCost(statistics.median(copy), statistics.median(c[0] for c in writer_costs if c),
                                 statistics.median(c[1] for c in writer_costs if c))
        auto_every = interval_for(auto_cost, statistics.median(without))
        at_auto = overhead_at_interval(node, stepper, state, auto_every, args.auto_pairs)

        assert node.writer is not None
        node.writer.wait()
        skipped = node.writer.skipped
        node.close()
        checkpoint = os.path.join(disk, "last.ckpt")
        save_file_atomically(checkpoint, lambda temp: torch.save(state, temp), global_step=state["step"])
        from_snapshot, from_disk, from_disk_warm = [], [], []
        cpu_snapshot, cpu_disk_warm = [], []
        for _ in range(args.repeats):
            resumed = NodeSnapshots(slots, job.monitor_socket, every=args.snapshot_every)
            start, cpu_start = time.perf_counter(), time.process_time()
            loaded = resumed.resume(None)
            assert loaded is not None
            restore(state, loaded)
            from_snapshot.append(time.perf_counter() - start)
            cpu_snapshot.append(time.process_time() - cpu_start)
            resumed.close()
            del loaded
            for cold, samples in ((True, from_disk), (False, from_disk_warm)):
                if cold:
                    fd = os.open(checkpoint, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
                start, cpu_start = time.perf_counter(), time.process_time()
                assert verify(checkpoint) is None
                loaded = torch.load(checkpoint, map_location="cpu", weights_only=False)
                restore(state, loaded)
                samples.append(time.perf_counter() - start)
                if not cold:
                    cpu_disk_warm.append(time.process_time() - cpu_start)
                del loaded
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    cost = max(0.0, statistics.median(w - wo for w, wo in zip(with_snapshots, without)) * args.snapshot_every)
    # CPU seconds (every thread of the process): what a snapshot takes from training on saturated cores,
    # and far less disturbed than wall time by other processes on a shared machine.
    cpu_cost = max(0.0, statistics.median(w - wo for w, wo in zip(cpu_with, cpu_without)) * args.snapshot_every)
    every_for_3pct = max(1, math.ceil(cpu_cost / (0.03 * statistics.median(cpu_without))))
    emit({
        "state_mb": round(nbytes / (1 << 20), 1),
        "repeats": args.repeats,
        "floor_memcpy_to_shm_s": summarize(floor, digits=4),
        "copy_on_training_thread_s": summarize(copy, digits=4),
        "copy_into_fresh_memory_s": summarize(fresh, digits=4),
        "snapshot_write_s": summarize(write, digits=4),
        "step_ms": args.step_ms,
        "snapshot_every": args.snapshot_every,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "step_s_without": summarize(without, digits=4),
        "step_s_with": summarize(with_snapshots, digits=4),
        "overhead_pct": summarize(overhead, digits=2),
        # What one snapshot costs the loop, and the interval that keeps it within 3 % of the step time.
        "cost_per_snapshot_s": round(cost, 4),
        "step_cpu_s_without": summarize(cpu_without, digits=4),
        "cpu_overhead_pct": summarize(cpu_overhead, digits=2),
        "cost_per_snapshot_cpu_s": round(cpu_cost, 4),
        "snapshot_every_for_3pct": every_for_3pct,
        "auto_snapshot_every": auto_every,
        "auto_cost_per_snapshot_s": round(auto_cost.total_s, 4),
        # Measured at that interval, block against block (one snapshot in each block "with").
        "auto_pairs": args.auto_pairs,
        "auto_overhead_pct": summarize(at_auto[0], digits=2) if at_auto[0] else None,
        "auto_cpu_overhead_pct": summarize(at_auto[1], digits=2) if at_auto[1] else None,
        "snapshots_skipped": skipped,
        "resume_from_snapshot_s": summarize(from_snapshot, digits=4),
        "resume_from_disk_s": summarize(from_disk, digits=4),
        "resume_from_disk_warm_s": summarize(from_disk_warm, digits=4),
        # The same resumes in CPU seconds, and each snapshot resume over the warm disk resume that followed
        # it (paired: on a shared machine the load drifts between repeats, not within a pair).
        "resume_from_snapshot_cpu_s": summarize(cpu_snapshot, digits=4),
        "resume_from_disk_warm_cpu_s": summarize(cpu_disk_warm, digits=4),
        "resume_snapshot_over_disk_warm": summarize([a / b for a, b in zip(from_snapshot, from_disk_warm)],
                                                    digits=3),
    })


if __name__ == "__main__":
    main()
