"""SIGKILLs a snapshot-writing process at ``KILLS`` random instants; prints what every resume found (JSON lines).

Usage: ``kill_loop.py DIR KILLS SEED``. The driver imports torch once and forks each victim
(a fork costs milliseconds where a fresh interpreter importing torch costs seconds); it
runs no torch operation itself, so every fork is safe. Each victim resumes like a
restarted rank (:meth:`NodeSnapshots.resume`: agreement, checksum, load, discard, writer
thread), appends what it resumed from to ``DIR/resumes.jsonl`` (whether the state it
loaded is exactly the step it claims), tells the driver, and writes snapshots of a
~2 MB state (every tensor filled with its step) until it is killed. One more victim
after the last kill only resumes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

import torch

from ft_core.jobdir import JobDir
from ft_core.snapshots.node import NodeSnapshots
from ft_core.snapshots.store import SnapshotStore

ELEMENTS = 1 << 18  # 1 MiB of float32 per tensor


def victim(directory: str, kill: int, ready_fd: int, write_forever: bool) -> None:
    torch.set_num_threads(1)
    job = JobDir(os.path.join(directory, "job-x"))
    store = SnapshotStore(os.path.join(directory, "shm"), rank=0, world_size=1)
    torn = len(store.verified()[1])
    node = NodeSnapshots(store, job.monitor_socket, every=1)
    state = node.resume(disk_step=0)  # the disk checkpoint: step 0, always there
    step = int(state["step"]) if state is not None else 0
    whole = state is None or all(bool((t == step).all()) for t in (state["a"], state["b"]))
    with open(os.path.join(directory, "resumes.jsonl"), "a", encoding="utf-8") as out:
        out.write(json.dumps({"kill": kill, "source": node.source.value if node.source else None, "step": step,
                              "whole": whole, "torn_slots": torn}) + "\n")
    os.write(ready_fd, b"1")
    while write_forever:
        step += 1
        node.save(step, {"step": step, "a": torch.full((ELEMENTS,), float(step)),
                         "b": torch.full((ELEMENTS,), float(step))})
        assert node.writer is not None
        node.writer.wait()
    node.close()


def main() -> None:
    directory, kills, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    JobDir(os.path.join(directory, "job-x")).create()
    rng = random.Random(seed)
    for kill in range(kills + 1):
        last = kill == kills
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            code = 0
            try:
                victim(directory, kill, write_fd, write_forever=not last)
            except BaseException:  # noqa: BLE001 - report and leave: never return into the driver's loop
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        os.close(write_fd)
        ready = os.read(read_fd, 1)
        os.close(read_fd)
        if not last and ready:
            time.sleep(rng.uniform(0.0, 0.06))  # anywhere in the next writes
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not ready or (last and status != 0):
            sys.exit(f"victim {kill} failed (status {status})")
    print("done", flush=True)


if __name__ == "__main__":
    main()
