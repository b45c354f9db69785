"""A snapshot's name, the marks of condemned snapshots, and a resume that skips a condemned or non-finite one.

One process, no launcher: the agreement of one rank is its own slots (``tests/integration/ft_core/snapshots/
test_guard.py`` runs the same under ``ft_launcher`` with two ranks).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from ft_core.event_file import read_records
from ft_core.events import ResumeSource
from ft_core.jobdir import JobDir
from ft_core.snapshots.condemned import MARKS_FILE, condemn, condemned, parse_snapshot_name, snapshot_name
from ft_core.snapshots.node import NodeSnapshots
from ft_core.snapshots.slots import SnapshotSlots


def _write(slots: SnapshotSlots, slot: int, step: int, lineage: str = "0.1", value: float = 1.0) -> None:
    slots.write(slot, step, lineage, lambda handle: torch.save({"step": step, "w": torch.full((8,), value)}, handle))


def test_a_snapshot_name_round_trips_and_a_disk_path_is_no_snapshot_name():
    assert snapshot_name(20, "1.2") == "snapshot:20:1.2"
    assert parse_snapshot_name("snapshot:20:1.2") == (20, "1.2")
    assert parse_snapshot_name("/ckpt/step=20.ckpt") is None
    for bad in ("snapshot:", "snapshot:x:1.1", "snapshot:20", "snapshot:20:", "snapshot:-1:1.1"):
        with pytest.raises(ValueError, match=r"expected snapshot:<step>:<lineage>") as info:
            parse_snapshot_name(bad)
        assert repr(bad) in str(info.value)


def test_marks_accumulate_once_per_snapshot_and_bad_marks_name_the_key_and_the_value(tmp_path):
    assert condemned(str(tmp_path)) == frozenset()
    condemn(str(tmp_path), "snapshot:20:1.1", "non-finite loss")
    condemn(str(tmp_path), "snapshot:20:1.1", "again")
    condemn(str(tmp_path), "snapshot:8:0.1", "twice")
    assert condemned(str(tmp_path)) == {(20, "1.1"), (8, "0.1")}
    marks = json.loads((tmp_path / MARKS_FILE).read_text())["condemned"]
    assert [(m["snapshot"], m["reason"]) for m in marks] == [("snapshot:20:1.1", "non-finite loss"),
                                                             ("snapshot:8:0.1", "twice")]
    with pytest.raises(ValueError, match="expected snapshot:<step>:<lineage>"):
        condemn(str(tmp_path), "/ckpt/step=20.ckpt", "not a snapshot")
    (tmp_path / MARKS_FILE).write_text(json.dumps({"condemned": [{"snapshot": "step 20"}]}))
    with pytest.raises(ValueError, match="key 'snapshot' is 'step 20'"):
        condemned(str(tmp_path))
    (tmp_path / MARKS_FILE).write_text(json.dumps({"condemned": "all"}))
    with pytest.raises(ValueError, match="key 'condemned' is 'all': expected a list"):
        condemned(str(tmp_path))


def test_a_condemned_snapshot_is_not_resumed_from_the_older_one_is_and_the_event_names_it(tmp_path):
    job = JobDir(str(tmp_path / "job-x")).create()
    slots = SnapshotSlots(str(tmp_path / "shm"), rank=0, world_size=1)
    _write(slots, 0, 15)
    _write(slots, 1, 20)
    condemn(slots.directory, snapshot_name(20, "0.1"), "non-finite loss 1 step(s) after resuming")
    node = NodeSnapshots(slots, job.monitor_socket, every=5)
    state = node.resume(disk_step=10)
    node.close()
    assert state is not None and state["step"] == 15
    [record] = read_records(job.monitor_events)[0]
    assert (record.source, record.step, record.snapshot) == (ResumeSource.SNAPSHOT, 15, "snapshot:15:0.1")
    assert [s.step for s in slots.listed()] == [15]  # the condemned slot is discarded with the resume


def test_a_non_finite_snapshot_is_skipped_like_a_torn_one_unless_the_check_is_off(tmp_path):
    job = JobDir(str(tmp_path / "job-x")).create()
    slots = SnapshotSlots(str(tmp_path / "shm"), rank=0, world_size=1)
    _write(slots, 0, 15)
    _write(slots, 1, 20, value=math.inf)
    node = NodeSnapshots(slots, job.monitor_socket, every=5)
    state = node.resume(disk_step=10, weights=None)  # not checked: loaded as it is
    assert state is not None and state["step"] == 20
    node.close()
    _write(slots, 0, 15)
    _write(slots, 1, 20, value=math.inf)
    node = NodeSnapshots(slots, job.monitor_socket, every=5)
    state = node.resume(disk_step=10)
    node.close()
    assert state is not None and state["step"] == 15
    record = read_records(job.monitor_events)[0][-1]
    assert record.step == 15 and "skipped the snapshot of step 20: non-finite values in w" in record.reason
    # Both bad: the disk checkpoint, with both named.
    _write(slots, 0, 15, value=math.nan)
    _write(slots, 1, 20, value=math.inf)
    node = NodeSnapshots(slots, job.monitor_socket, every=5)
    assert node.resume(disk_step=10) is None
    node.close()
    record = read_records(job.monitor_events)[0][-1]
    assert (record.source, record.step, record.snapshot) == (ResumeSource.DISK, 10, None)
    assert "skipped the snapshot of step 20: non-finite values in w; of step 15: non-finite values in w" \
        in record.reason, record.reason


def test_unreadable_marks_offer_no_snapshot_and_the_resume_is_from_disk(tmp_path):
    job = JobDir(str(tmp_path / "job-x")).create()
    slots = SnapshotSlots(str(tmp_path / "shm"), rank=0, world_size=1)
    _write(slots, 0, 15)
    (tmp_path / "shm" / MARKS_FILE).write_text("{torn")
    node = NodeSnapshots(slots, job.monitor_socket, every=5)
    assert node.resume(disk_step=10) is None and node.source is ResumeSource.DISK
    node.close()
