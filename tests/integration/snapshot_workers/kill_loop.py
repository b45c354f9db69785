"""SIGKILLs a snapshot-writing process at ``KILLS`` random instants; prints what every resume found (JSON lines).

Usage: ``kill_loop.py DIR KILLS SEED [EVERY]``. The driver imports torch once and forks each victim
(a fork costs milliseconds where a fresh interpreter importing torch costs seconds); it
runs no torch operation itself, so every fork is safe. Each victim resumes like a
restarted rank (:meth:`NodeSnapshots.resume`: agreement, checksum, load, discard, writer
thread), appends what it resumed from to ``DIR/resumes.jsonl`` (whether the state it
loaded is exactly the step it claims), tells the driver, and writes snapshots of a
~2 MB state (every tensor filled with its step) until it is killed. One more victim
after the last kill only resumes.

With ``EVERY``, each victim trains: steps of :data:`STEP_S`, a snapshot every ``EVERY`` steps
written in the background as a rank's are (``maybe_save``: the steps go on during the write),
its last completed step in memory shared with the driver. Half the kills land right after a
snapshot is handed to the writer (inside its write), the others anywhere in the next two
intervals; each resume also records the step its predecessor had reached when killed (the
steps recomputed are that minus the step resumed from) and the snapshots it skipped because
the previous write was still running.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import random
import signal
import struct
import sys
import time

import torch

from ft_core.jobdir import JobDir
from ft_core.snapshots.node import NodeSnapshots
from ft_core.snapshots.slots import SnapshotSlots

ELEMENTS = 1 << 18  # 1 MiB of float32 per tensor
#: A paced victim's step (``EVERY`` given).
STEP_S = 0.01
#: Shared with the driver: the last completed step, the last step handed to the writer, snapshots skipped.
PROGRESS = struct.Struct("qqq")


def _state(step: int) -> dict:
    return {"step": step, "a": torch.full((ELEMENTS,), float(step)), "b": torch.full((ELEMENTS,), float(step))}


def victim(directory: str, kill: int, ready_fd: int, write_forever: bool, every: int, progress: mmap.mmap) -> None:
    torch.set_num_threads(1)
    job = JobDir(os.path.join(directory, "job-x"))
    slots = SnapshotSlots(os.path.join(directory, "shm"), rank=0, world_size=1)
    torn = len(slots.verified()[1])
    killed_at, _, skipped = PROGRESS.unpack_from(progress)
    node = NodeSnapshots(slots, job.monitor_socket, every=every or 1)
    state = node.resume(disk_step=0)  # the disk checkpoint: step 0, always there
    step = int(state["step"]) if state is not None else 0
    whole = state is None or all(bool((t == step).all()) for t in (state["a"], state["b"]))
    with open(os.path.join(directory, "resumes.jsonl"), "a", encoding="utf-8") as out:
        out.write(json.dumps({"kill": kill, "source": node.source.value if node.source else None, "step": step,
                              "whole": whole, "torn_slots": torn, "killed_at": killed_at,
                              "skipped_before": skipped}) + "\n")
    PROGRESS.pack_into(progress, 0, step, -1, 0)
    os.write(ready_fd, b"1")
    while write_forever and every:
        time.sleep(STEP_S)  # the step's work
        step += 1
        taken = node.maybe_save(step, functools.partial(_state, step))
        assert node.writer is not None
        PROGRESS.pack_into(progress, 0, step, step if taken else PROGRESS.unpack_from(progress)[1],
                           node.writer.skipped)
    while write_forever:
        step += 1
        node.save(step, {"step": step, "a": torch.full((ELEMENTS,), float(step)),
                         "b": torch.full((ELEMENTS,), float(step))})
        assert node.writer is not None
        node.writer.wait()
    node.close()


def _wait_for_a_write(progress: mmap.mmap, deadline: float) -> None:
    """Return once the victim hands a snapshot to its writer (the kill then lands inside the write)."""
    first = PROGRESS.unpack_from(progress)[1]
    while PROGRESS.unpack_from(progress)[1] == first and time.monotonic() < deadline:
        time.sleep(0.0005)


def main() -> None:
    directory, kills, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    every = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    JobDir(os.path.join(directory, "job-x")).create()
    rng = random.Random(seed)
    progress = mmap.mmap(-1, PROGRESS.size)  # anonymous: shared with the forked victims
    PROGRESS.pack_into(progress, 0, -1, -1, 0)
    for kill in range(kills + 1):
        last = kill == kills
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            code = 0
            try:
                victim(directory, kill, write_fd, not last, every, progress)
            except BaseException:  # noqa: BLE001 - report and leave: never return into the driver's loop
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        os.close(write_fd)
        ready = os.read(read_fd, 1)
        os.close(read_fd)
        if not last and ready:
            if not every:
                time.sleep(rng.uniform(0.0, 0.06))  # anywhere in the next writes
            elif kill % 2:
                _wait_for_a_write(progress, deadline=time.monotonic() + 60)
            else:
                time.sleep(rng.uniform(0.0, 2 * every * STEP_S))  # anywhere in the next two intervals
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not ready or (last and status != 0):
            sys.exit(f"victim {kill} failed (status {status})")
    print("done", flush=True)


if __name__ == "__main__":
    main()
