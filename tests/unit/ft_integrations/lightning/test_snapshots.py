"""The callback's state keeps what ``snapshot_every="auto"`` decided across resumes: the interval, or off for want
of room (a real slots and writer thread in one process; no trainer, no launcher)."""

from __future__ import annotations

import logging

import pytest
import torch

from ft_core.jobdir import JobDir
from ft_core.snapshots.interval import AutoInterval
from ft_core.snapshots.node import NodeSnapshots
from ft_core.snapshots.slots import SnapshotSlots
from ft_integrations.lightning.snapshots import LightningSnapshots


def _snapshots(tmp_path, name: str, every: int = 0, auto: bool = True) -> LightningSnapshots:
    job = JobDir(str(tmp_path / f"job-{name}")).create()
    slots = SnapshotSlots(str(tmp_path / f"shm-{name}"), 0, 1)
    return LightningSnapshots(NodeSnapshots(slots, job.monitor_socket, every, AutoInterval() if auto else None))


def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((1024,), float(step))}


@pytest.mark.timeout(60)
def test_auto_off_for_want_of_room_is_kept_and_a_resumed_run_stays_off(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(10 ** 12))  # no filesystem holds that many ranks' snapshots
    first = _snapshots(tmp_path, "first")
    first.node.resume(None)
    assert first.learned_every is None
    assert [step for step in range(1, 30) if first.node.maybe_save(step, lambda step=step: _state(step))] == []
    assert first.learned_every == 0  # what the callback's state_dict saves as "snapshot_every"
    first.close()

    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # room now: the job's decision holds all the same
    resumed = _snapshots(tmp_path, "resumed")
    with caplog.at_level(logging.INFO, logger="ft_integrations.lightning"):
        resumed.restore_every(0)
    assert resumed.node.off and resumed.learned_every == 0
    assert any("stay off" in r.getMessage() for r in caplog.records)
    assert not resumed.node.due(3, every=1)  # not even at the step timeouts are learned at
    assert [step for step in range(1, 30) if resumed.node.maybe_save(step, lambda step=step: _state(step))] == []


@pytest.mark.timeout(60)
def test_a_learned_interval_is_restored_and_a_number_given_by_the_user_stays(tmp_path):
    learned = _snapshots(tmp_path, "learned")
    learned.restore_every(120)
    assert learned.node.every == 120 and learned.learned_every == 120 and not learned.node.off
    fixed = _snapshots(tmp_path, "fixed", every=5, auto=False)
    fixed.restore_every(0)
    assert fixed.node.every == 5 and not fixed.node.off
