"""Two real gloo ranks agree on the snapshot to resume from: the newest both hold whole, else the disk checkpoint.

The stores are prepared on disk, then two processes (``snapshot_workers/agree.py``) resume from each
scenario in turn: both hold steps 10 and 20; rank 1's step 20 is torn; rank 1 holds nothing (a replaced
node); the snapshots were written by a job of another world size. About 10 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import REPO_ROOT, free_port, python_env

from ft_core.event_file import read_records
from ft_core.jobdir import JobDir
from ft_core.snapshots.slots import SnapshotSlots

AGREE = os.path.join(REPO_ROOT, "tests", "integration", "snapshot_workers", "agree.py")


def _write(directory, rank: int, world: int, slot: int, step: int) -> SnapshotSlots:
    slots = SnapshotSlots(str(directory / "shm"), rank, world)
    slots.write(slot, step, "0.1", lambda handle: torch.save({"step": step}, handle))
    return slots


@pytest.mark.timeout(180)
def test_two_ranks_resume_from_the_newest_snapshot_both_hold_whole_or_from_disk(tmp_path):
    scenarios = {name: tmp_path / name for name in ("both", "torn", "replaced", "other_world")}
    for directory in scenarios.values():
        JobDir(str(directory / "job-x")).create()
    for rank in (0, 1):
        for name in ("both", "torn"):
            _write(scenarios[name], rank, 2, 0, 10)
            _write(scenarios[name], rank, 2, 1, 20)
        _write(scenarios["other_world"], rank, 3, 0, 30)
    _write(scenarios["replaced"], 0, 2, 0, 10)
    with open(SnapshotSlots(str(scenarios["torn"] / "shm"), 1, 2).state_file(1), "r+b") as handle:
        handle.seek(40)
        handle.write(b"torn")
    out = tmp_path / "out.jsonl"
    port = free_port()
    procs = [subprocess.Popen([sys.executable, AGREE, str(out), *map(str, scenarios.values())],
                              env=python_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                                             WORLD_SIZE="2", LOCAL_RANK=str(rank)), start_new_session=True)
             for rank in (0, 1)]
    try:
        assert [proc.wait(150) for proc in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    with open(out, encoding="utf-8") as handle:
        results = {(r["dir"], r["rank"]): r for r in map(json.loads, handle)}
    chosen = {(name, rank): (r["source"], r["step"]) for (name, rank), r in results.items()}
    assert chosen == {("both", 0): ("snapshot", 20), ("both", 1): ("snapshot", 20),
                      ("torn", 0): ("snapshot", 10), ("torn", 1): ("snapshot", 10),
                      ("replaced", 0): ("disk", None), ("replaced", 1): ("disk", None),
                      ("other_world", 0): ("disk", None), ("other_world", 1): ("disk", None)}
    assert "fail their checksum on some rank: steps 20" in results["torn", 0]["reason"]
    assert results["replaced", 0]["reason"] == "rank(s) 1 hold no verified snapshot"
    assert results["other_world", 1]["reason"] == "no rank holds a verified snapshot"
    # One event per resume, from global rank 0, with the reason.
    (record,) = read_records(str(scenarios["replaced"] / "job-x" / "monitor_events.jsonl"))[0]
    assert (record.source.value, record.step, record.disk_step, record.world_size) == ("disk", 5, 5, 2)
    assert record.reason == "rank(s) 1 hold no verified snapshot: resuming from the disk checkpoint of step 5"
