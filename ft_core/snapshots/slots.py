"""A rank's two snapshot slots, each a state file and a checkpoint manifest, written in turn.

::

    <snapshot dir>/world<W>/rank<R>/
      slot0/state.pt  slot0/ft_manifest.json      0600 files in 0700 directories
      slot1/state.pt  slot1/ft_manifest.json

A write goes to the slot that does not hold the newest snapshot: first its manifest is
removed (the slot is invalid from then on), then the state is written, then a new
manifest lists its size and CRC-32 (:func:`ft_core.checkpoint_manifest.write_dir_manifest`,
written atomically). A kill at any instant of a write leaves the other slot whole, and
the torn slot without a manifest or with a state that fails its checksum
(:func:`ft_core.checkpoint_manifest.verified_version`): it is never loaded.

A manifest's ``global_step`` is the snapshot's step and its ``run`` the snapshot's
*lineage*: a token the ranks agree on at each resume (:mod:`ft_core.snapshots.resume`),
so that after a resume from an older state a slot still holding a newer step of the
abandoned history never pairs with another rank's snapshot of the same step. The world
size is part of the path: a job resumed with another world size finds no snapshot.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable
from typing import Any, BinaryIO, Optional

from ft_core.checkpoint_manifest import (
    DIR_MANIFEST,
    Rejection,
    read_manifest,
    verified_version,
    write_dir_manifest,
)
from ft_core.jobdir import create_private_file, make_private_dir

__all__ = ["SLOTS", "STATE_FILE", "Snapshot", "SnapshotSlots"]

log = logging.getLogger("ft_core.snapshots")

#: Slots per rank: double buffering.
SLOTS = 2
#: The serialised state in a slot.
STATE_FILE = "state.pt"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One snapshot a slot holds (verified or only listed, as the caller asked)."""

    slot: int
    step: int
    lineage: str
    #: Unix time the snapshot was taken.
    written: float
    path: str


class SnapshotSlots:
    """The two slots of global rank ``rank`` in a job of ``world_size`` ranks, under ``directory``."""

    def __init__(self, directory: str, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        #: The job's snapshot directory (every rank's slots are under it).
        self.directory = directory
        self.path = os.path.join(directory, f"world{world_size}", f"rank{rank}")

    def slot_dir(self, slot: int) -> str:
        return os.path.join(self.path, f"slot{slot}")

    def state_file(self, slot: int) -> str:
        return os.path.join(self.slot_dir(slot), STATE_FILE)

    # -- reading ------------------------------------------------------------
    def listed(self) -> list[Snapshot]:
        """The snapshots the slots' manifests list, newest first; contents not checked (cheap)."""
        found = []
        for slot in range(SLOTS):
            try:
                manifest = read_manifest(self.slot_dir(slot))
            except (OSError, ValueError):
                continue
            if manifest is None or not manifest.versions or manifest.global_step is None:
                continue
            version = manifest.versions[0]
            found.append(Snapshot(slot, int(manifest.global_step), str(version.run or ""), version.written,
                                  self.state_file(slot)))
        return sorted(found, key=lambda s: s.step, reverse=True)

    def verify(self, snapshot: Snapshot) -> Optional[Rejection]:
        """Why ``snapshot`` (from :meth:`listed`) must not be loaded: its slot no longer holds it whole; else None."""
        found = verified_version(self.slot_dir(snapshot.slot), mapped=True)  # slot files are replaced, never changed
        if isinstance(found, Rejection):
            return found
        if found is None or (found.global_step, str(found.run or "")) != (snapshot.step, snapshot.lineage):
            return Rejection(self.slot_dir(snapshot.slot), "the slot holds another snapshot now")
        return None

    def verified(self) -> tuple[list[Snapshot], list[Rejection]]:
        """The snapshots whose state matches its manifest (size and CRC-32), newest first, and the rejected slots."""
        good: list[Snapshot] = []
        rejected: list[Rejection] = []
        for slot in range(SLOTS):
            directory = self.slot_dir(slot)
            if not os.path.isdir(directory):
                continue
            found = verified_version(directory, mapped=True)
            if isinstance(found, Rejection) or found is None or found.global_step is None:
                rejected.append(found if isinstance(found, Rejection) else Rejection(directory, "no step"))
                continue
            good.append(Snapshot(slot, found.global_step, str(found.run or ""), found.written,
                                 self.state_file(slot)))
        return sorted(good, key=lambda s: s.step, reverse=True), rejected

    @staticmethod
    def load(snapshot: Snapshot) -> Any:
        """The state of ``snapshot`` (verified first: :meth:`verify`), its tensors mapped from the slot's file.

        ``torch.load(mmap=True)``: no copy at load; a tensor's pages are read from shared memory
        when first used (a ``load_state_dict`` copies them once, as from any state) and are
        copy-on-write, so training never changes the slot. The mapping keeps the file's memory
        until the last tensor from it is freed, even after a newer snapshot replaced the slot
        (a writer unlinks a slot's file and creates a new one: never a change in place).
        """
        import torch

        return torch.load(snapshot.path, map_location="cpu", weights_only=False, mmap=True)

    # -- writing ------------------------------------------------------------
    def next_slot(self) -> int:
        """The slot a new snapshot goes to: an empty one, else the one not holding the newest."""
        listed = self.listed()
        used = {s.slot for s in listed}
        free = [slot for slot in range(SLOTS) if slot not in used]
        return free[0] if free else listed[-1].slot

    def write(self, slot: int, step: int, lineage: str, write_state: Callable[[BinaryIO], None]) -> Snapshot:
        """Write a snapshot into ``slot`` with ``write_state(file)``; see the module docstring for the order."""
        directory = self.slot_dir(slot)
        make_private_dir(self.path)
        make_private_dir(directory)
        try:
            os.unlink(os.path.join(directory, DIR_MANIFEST))  # invalid from here until the new manifest
        except FileNotFoundError:
            pass
        with os.fdopen(create_private_file(self.state_file(slot), replace=True), "wb") as handle:
            write_state(handle)
        version = write_dir_manifest(directory, global_step=step, run=lineage).versions[0]
        return Snapshot(slot, step, lineage, version.written, self.state_file(slot))

    def discard(self, keep: Optional[int] = None) -> None:
        """Remove every slot but ``keep`` (None: all)."""
        for slot in range(SLOTS):
            if slot != keep:
                shutil.rmtree(self.slot_dir(slot), ignore_errors=True)
