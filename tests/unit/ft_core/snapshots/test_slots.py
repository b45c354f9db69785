"""The snapshot slots, their writer thread, its directory's lifetime and the resume choice (one process, no launcher)."""

from __future__ import annotations

import os
import stat
import threading

import pytest
import torch

from ft_core.checkpoint_manifest import DIR_MANIFEST
from ft_core.event_file import read_records
from ft_core.events import ResumeSource
from ft_core.jobdir import OWNER_FILE, JobDir, claim_job_dir
from ft_core.snapshots.node import NodeSnapshots
from ft_core.snapshots.resume import Agreement, agree, choose
from ft_core.snapshots.slots import STATE_FILE, SnapshotSlots
from ft_core.snapshots.space import claim_snapshot_dir, snapshot_dir_for_socket
from ft_core.snapshots.writer import SnapshotWriter, copy_state


def _write(slots: SnapshotSlots, slot: int, step: int, lineage: str = "0.1") -> None:
    slots.write(slot, step, lineage, lambda handle: torch.save({"step": step, "w": torch.full((64,), step)}, handle))


def test_writes_alternate_between_two_slots_and_the_newest_two_stay_whole(tmp_path):
    slots = SnapshotSlots(str(tmp_path), rank=0, world_size=2)
    writer = SnapshotWriter(slots, "0.1")
    for step in (5, 10, 15):
        assert writer.submit(step, copy_state({"step": step, "w": torch.full((64,), step)}))
        assert writer.wait(30)
    writer.close()
    good, rejected = slots.verified()
    assert [s.step for s in good] == [15, 10] and not rejected
    assert {s.slot for s in good} == {0, 1}
    assert torch.load(good[0].path, weights_only=False)["w"][0].item() == 15


def test_a_torn_write_leaves_the_previous_snapshot_to_resume_from(tmp_path):
    slots = SnapshotSlots(str(tmp_path), rank=0, world_size=1)
    _write(slots, 0, 5)

    def torn(handle):
        handle.write(b"half a pickle")
        raise KeyboardInterrupt  # the writer dies mid-write

    with pytest.raises(KeyboardInterrupt):
        slots.write(1, 10, "0.1", torn)
    assert not os.path.exists(os.path.join(slots.slot_dir(1), DIR_MANIFEST))
    good, _ = slots.verified()
    assert [s.step for s in good] == [5]
    assert slots.next_slot() == 1  # the next write goes to the torn slot again, never over step 5


def test_a_snapshot_whose_bytes_changed_fails_its_checksum(tmp_path):
    slots = SnapshotSlots(str(tmp_path), rank=0, world_size=1)
    _write(slots, 0, 5)
    _write(slots, 1, 10)
    with open(slots.state_file(1), "r+b") as handle:  # same size, one byte flipped
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    good, rejected = slots.verified()
    assert [s.step for s in good] == [5]
    assert len(rejected) == 1 and "checksum" in rejected[0].reason


def test_snapshot_files_are_0600_in_0700_directories(tmp_path):
    slots = SnapshotSlots(str(tmp_path), rank=1, world_size=2)
    _write(slots, 0, 5)
    for path in (slots.path, slots.slot_dir(0)):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    for name in (STATE_FILE, DIR_MANIFEST):
        assert stat.S_IMODE(os.stat(os.path.join(slots.slot_dir(0), name)).st_mode) == 0o600


def test_copy_state_is_a_copy_and_keeps_tied_tensors_tied():
    weight = torch.ones(4)
    state = {"a": weight, "b": [weight, weight[:2]], "n": 3}
    copied = copy_state(state)
    weight.add_(1)  # training goes on
    assert copied["a"].tolist() == [1.0] * 4 and copied["n"] == 3
    assert copied["a"] is copied["b"][0] and copied["b"][1] is not copied["a"]


def test_the_snapshot_dir_lives_and_dies_with_the_job_dir_and_a_sigkilled_launchers_is_swept(tmp_path):
    base = tmp_path / "shm"
    base.mkdir()
    job = JobDir(str(tmp_path / "runtime" / "job-abc")).create()
    claim = claim_snapshot_dir(job, base=str(base))
    assert claim is not None
    path = claim.job_dir.path
    assert os.path.basename(path) == "job-abc" and stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert snapshot_dir_for_socket(job.monitor_socket, base=str(base)) == path
    # A launcher SIGKILLed: its lock is gone with it (here: a directory nobody locks).
    stale = os.path.join(os.path.dirname(path), "job-dead")
    os.mkdir(stale, 0o700)
    open(os.path.join(stale, OWNER_FILE), "w").close()
    other = claim_snapshot_dir(JobDir(str(tmp_path / "runtime" / "job-def")).create(), base=str(base))
    assert other is not None
    assert not os.path.exists(stale) and os.path.exists(path)  # the live launcher's dir is kept
    claim.release()
    other.release()
    assert os.listdir(os.path.dirname(path)) == []


def test_the_snapshot_dir_of_a_job_dir_is_found_from_its_monitor_socket(tmp_path):
    claim = claim_job_dir(str(tmp_path / "runtime"))
    snapshots = claim_snapshot_dir(claim.job_dir)
    try:
        if snapshots is None:
            pytest.skip("no /dev/shm here")
        assert snapshot_dir_for_socket(claim.job_dir.monitor_socket) == snapshots.job_dir.path
    finally:
        if snapshots is not None:
            snapshots.release()
        claim.release()
    assert snapshots is None or not os.path.exists(snapshots.job_dir.path)


def test_no_launcher_no_snapshots(tmp_path, monkeypatch):
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)
    assert NodeSnapshots.for_rank(0, 1) is None
    assert snapshot_dir_for_socket(str(tmp_path / "standalone-x" / "monitor.sock")) is None


def test_the_snapshot_is_chosen_only_when_newer_than_the_disk_checkpoint(tmp_path):
    slots = SnapshotSlots(str(tmp_path), rank=0, world_size=1)
    assert choose(agree(slots), 10) == (ResumeSource.DISK, "no rank holds a verified snapshot: resuming from "
                                                           "the disk checkpoint of step 10")
    _write(slots, 0, 15)
    agreement = agree(slots)
    assert agreement.snapshot is not None and agreement.snapshot.step == 15
    assert choose(agreement, 10)[0] is ResumeSource.SNAPSHOT
    assert choose(agreement, None)[0] is ResumeSource.SNAPSHOT
    assert choose(agreement, 15)[0] is ResumeSource.DISK
    assert choose(Agreement(None, "rank(s) 1 hold no verified snapshot", 2), 10)[0] is ResumeSource.DISK


def test_resume_loads_the_snapshot_keeps_its_slot_and_records_one_event(tmp_path, monkeypatch):
    job = JobDir(str(tmp_path / "job-x")).create()
    slots = SnapshotSlots(str(tmp_path / "shm"), rank=0, world_size=1)
    _write(slots, 0, 15, lineage="0.1")
    _write(slots, 1, 20, lineage="0.1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    node = NodeSnapshots(slots, job.monitor_socket, every=5)
    state = node.resume(disk_step=10)
    assert state is not None and state["step"] == 20
    assert node.save(25, {"step": 25, "w": torch.zeros(2)}) and node.writer is not None and node.writer.wait(30)
    node.close()
    good, _ = slots.verified()
    assert [(s.step, s.lineage) for s in good] == [(25, "1.1"), (20, "0.1")]  # 20 stayed until 25 was whole
    [record] = read_records(job.monitor_events)[0]
    assert record.source is ResumeSource.SNAPSHOT and (record.step, record.disk_step, record.cycle) == (20, 10, 1)
    assert record.snapshot_time is not None


def test_resume_from_disk_discards_every_slot(tmp_path):
    job = JobDir(str(tmp_path / "job-x")).create()
    slots = SnapshotSlots(str(tmp_path / "shm"), rank=0, world_size=1)
    _write(slots, 0, 15)
    node = NodeSnapshots(slots, job.monitor_socket, every=5)
    assert node.resume(disk_step=30) is None
    node.close()
    assert slots.listed() == []
    assert read_records(job.monitor_events)[0][0].source is ResumeSource.DISK


def test_snapshots_are_due_every_n_steps_once():
    node = NodeSnapshots(SnapshotSlots("/nonexistent", 0, 1), "/nonexistent/monitor.sock", every=5)
    assert [step for step in range(12) if node.due(step)] == [5, 10]


def test_copy_state_reuses_a_previous_copy_in_place():
    weight = torch.ones(4)
    first = copy_state({"w": weight, "tied": weight, "other": torch.zeros(2)})
    buffer = first["w"]
    weight.add_(1)
    second = copy_state({"w": weight, "tied": weight, "other": torch.zeros(3)}, reuse=first)
    assert second["w"] is buffer and second["w"].tolist() == [2.0] * 4 and second["tied"] is second["w"]
    assert second["other"].shape == (3,)  # another shape: a new copy


def test_a_snapshot_due_while_the_previous_is_written_is_skipped_without_copying(tmp_path):
    slots = SnapshotSlots(str(tmp_path), rank=0, world_size=1)
    node = NodeSnapshots(slots, str(tmp_path / "job-x" / "monitor.sock"), every=1)
    release = threading.Event()
    assert node.save(1, {"w": torch.zeros(2)}, wait=True)
    assert node.writer is not None
    node.writer.slots = _Blocking(slots, release)  # the next write blocks until released
    assert node.save(2, {"w": torch.zeros(2)})
    staging = node._staging
    assert not node.save(3, {"w": torch.ones(2)}) and node.writer.skipped == 1
    assert node._staging is staging and staging["w"].tolist() == [0.0, 0.0]  # the copy being written untouched
    release.set()
    node.close()
    assert [s.step for s in slots.verified()[0]] == [2, 1]


class _Blocking:
    def __init__(self, slots, release):
        self.slots, self.release = slots, release

    def write(self, *args):
        self.release.wait(30)
        return self.slots.write(*args)

    def __getattr__(self, name):
        return getattr(self.slots, name)


def test_the_agreement_skips_a_newest_snapshot_that_fails_its_checksum(tmp_path):
    slots = SnapshotSlots(str(tmp_path), rank=0, world_size=1)
    _write(slots, 0, 5)
    _write(slots, 1, 10)
    with open(slots.state_file(1), "r+b") as handle:
        handle.seek(100)
        handle.write(b"\0\1\2\3")
    agreement = agree(slots)
    assert agreement.snapshot is not None and agreement.snapshot.step == 5
    assert "fail their checksum on some rank: steps 10" in agreement.reason


@pytest.mark.parametrize("size", [0, 1, (8 << 20) + 3])
def test_a_mapped_checksum_is_the_read_one(tmp_path, size):
    # The slots checks its slots over memory maps (checksum(mapped=True)); manifests are the same either way.
    from ft_core.checkpoint_manifest import checksum

    path = tmp_path / "f"
    path.write_bytes(os.urandom(size))
    assert checksum(str(path), mapped=True) == checksum(str(path)) == (size, checksum(str(path))[1])


def test_a_resumed_state_is_mapped_copy_on_write_so_training_never_changes_the_slot(tmp_path):
    job = JobDir(str(tmp_path / "job-x")).create()
    slots = SnapshotSlots(str(tmp_path / "shm"), rank=0, world_size=1)
    _write(slots, 0, 15)
    node = NodeSnapshots(slots, job.monitor_socket, every=5)
    state = node.resume(disk_step=None)
    assert node.source is ResumeSource.SNAPSHOT and state["w"][0].item() == 15
    state["w"].add_(1)  # training updates what it loaded in place (a CPU optimizer keeps the loaded tensors)
    assert node.writer is not None and node.save(20, {"step": 20, "w": state["w"]}, wait=True)  # into slot 1
    node.close()
    assert state["w"][0].item() == 16
    assert slots.verify(slots.listed()[1]) is None  # slot 0 still holds step 15 whole
    assert torch.load(slots.state_file(0), weights_only=False)["w"][0].item() == 15
    assert torch.load(slots.state_file(1), weights_only=False)["w"][0].item() == 16
