"""The writer thread: which slot a write goes to after a resume, what a failed write leaves, and its end.

Writes alternating between the slots, torn writes and skipped snapshots are tested with the slots in ``test_store.py``.
"""

from __future__ import annotations

import threading

import torch

from ft_core.snapshots.slots import SnapshotSlots
from ft_core.snapshots.writer import SnapshotWriter, copy_state


def _state(step: int) -> dict:
    return copy_state({"step": step, "w": torch.full((8,), float(step))})


def _slots(tmp_path) -> SnapshotSlots:
    """One rank's two slots, slot 0 holding step 10 (resumed from) and slot 1 the older step 5."""
    slots = SnapshotSlots(str(tmp_path), rank=0, world_size=1)
    for slot, step in ((1, 5), (0, 10)):
        slots.write(slot, step, "0.1", lambda handle, step=step: torch.save(_state(step), handle))
    return slots


def test_after_a_resume_the_other_slot_is_discarded_and_the_resumed_one_kept_until_a_newer_one_is_whole(tmp_path):
    slots = _slots(tmp_path)
    SnapshotWriter(slots, "0.2", keep_slot=0, discard=True).close()  # the thread discards first, then ends
    assert [(s.slot, s.step) for s in slots.listed()] == [(0, 10)]
    writer = SnapshotWriter(slots, "0.2", keep_slot=0)
    try:
        assert writer.submit(11, _state(11)) and writer.wait(30)
        assert [(s.slot, s.step, s.lineage) for s in slots.listed()] == [(1, 11, "0.2"), (0, 10, "0.1")]
        assert writer.submit(12, _state(12)) and writer.wait(30)  # a newer one is whole: the old slot is reused
        assert [(s.slot, s.step) for s in slots.listed()] == [(0, 12), (1, 11)]
    finally:
        writer.close()


def test_a_failed_write_is_recorded_and_the_next_one_succeeds(tmp_path):
    slots = SnapshotSlots(str(tmp_path), rank=0, world_size=1)
    writer = SnapshotWriter(slots, "0.1")
    try:
        assert writer.submit(1, {"lock": threading.Lock()}) and writer.wait(30)  # torch.save cannot pickle it
        assert isinstance(writer.error, TypeError) and writer.last is None
        assert writer.submit(2, _state(2)) and writer.wait(30)
        assert writer.error is None and writer.last is not None and writer.last.step == 2
        assert writer.last_cost is not None and writer.cost() == writer.last_cost and writer.idle
    finally:
        writer.close()
    assert not writer.submit(3, _state(3))  # closed: nothing more is written
    assert [s.step for s in slots.listed()] == [2]
