"""The ranks' agreement on the newest snapshot every rank holds, and the choice between it and the disk checkpoint.

Before loading, every rank lists the snapshots in its slots whose content passes its
checksum (:meth:`~ft_core.snapshots.slots.SnapshotSlots.verified`), and the ranks
exchange the lists through ``torch.distributed`` (:mod:`ft_core.all_ranks`: the default
process group). The agreed snapshot is the newest ``(step, lineage)``
every rank holds; when a rank holds none (a replaced node, a torn write, another world
size) there is none, and the job resumes from its disk checkpoint as without snapshots.
A snapshot is chosen only when it is newer than the disk checkpoint, and only when it
then loads and holds finite values on every rank (else the next older one is agreed on:
:meth:`ft_core.snapshots.node.NodeSnapshots.resume`); a snapshot the fault policy condemned
is never offered (:mod:`ft_core.snapshots.condemned`). Global rank 0 records the choice, its
reason and the snapshot's name in one ``resume_chosen`` event (:class:`ft_core.events.ResumeChosen`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from ft_core.all_ranks import all_ranks_ok, every_rank
from ft_core.events import ResumeChosen, ResumeSource
from ft_core.rank_records import write_rank_record
from ft_core.snapshots.condemned import condemned, snapshot_name
from ft_core.snapshots.slots import Snapshot, SnapshotSlots

__all__ = ["Agreement", "agree", "choose", "record_choice"]

log = logging.getLogger("ft_core.snapshots")

_MAX_LISTED = 4  # ranks named in a reason


@dataclasses.dataclass(frozen=True)
class Agreement:
    """This rank's copy of the newest snapshot every rank holds (None: there is none), and why."""

    snapshot: Optional[Snapshot]
    reason: str
    world_size: int


def agree(slots: SnapshotSlots, skip: frozenset[tuple[int, str]] = frozenset()) -> Agreement:
    """Agree with every rank on the newest snapshot all of them hold (a collective: call it on every rank).

    The ranks exchange what their slots' manifests list (cheap), then check the checksums of the
    candidates every rank lists, newest first, one all-reduce each, until one passes on every
    rank: usually one CRC-32 pass over one slot per rank. A rank offers no snapshot the fault
    policy condemned (:mod:`ft_core.snapshots.condemned`) nor one of ``skip`` (``(step, lineage)``:
    rejected at this resume already, by its load or its finite check).
    """
    try:
        skip = skip | condemned(slots.directory)
        mine = {(s.step, s.lineage): s for s in slots.listed() if (s.step, s.lineage) not in skip}
    except (OSError, ValueError) as exc:  # the marks say which snapshots are bad: unread, none is trusted
        log.warning("snapshots not offered for the resume: the marks of condemned snapshots are unreadable: %s", exc)
        mine = {}
    offered = sorted(mine)
    held = [{(int(step), str(lineage)) for step, lineage in offer} for offer in every_rank(offered)]
    common = set.intersection(*held) if held else set()
    torn: list[int] = []
    for step, lineage in sorted(common, reverse=True):
        snapshot = mine[step, lineage]
        problem = slots.verify(snapshot)
        if all_ranks_ok(problem is None):
            why = f"every rank holds a verified snapshot of step {step}"
            if torn:
                why += f" (newer ones fail their checksum on some rank: steps {', '.join(map(str, torn))})"
            return Agreement(snapshot, why, slots.world_size)
        torn.append(step)
        held = [{key for key in offer if key != (step, lineage)} for offer in held]
    if torn and not any(held):
        return Agreement(None, f"no verified snapshot (steps {', '.join(map(str, torn))} fail their checksum on "
                               "some rank)", slots.world_size)
    empty = [rank for rank, offer in enumerate(held) if not offer]
    if len(empty) == len(held):
        reason = "no rank holds a verified snapshot"
    elif empty:
        reason = f"rank(s) {', '.join(map(str, empty[:_MAX_LISTED]))} hold no verified snapshot"
    else:
        listed = "; ".join(f"rank {rank}: {sorted(step for step, _ in offer)}"
                           for rank, offer in list(enumerate(held))[:_MAX_LISTED])
        reason = f"no snapshot that every rank holds ({listed})"
    return Agreement(None, reason, slots.world_size)


def choose(agreement: Agreement, disk_step: Optional[int]) -> tuple[ResumeSource, str]:
    """Snapshot or disk, and why: the snapshot only when it is newer than the disk checkpoint."""
    snapshot = agreement.snapshot
    disk = "no disk checkpoint" if disk_step is None else f"the disk checkpoint of step {disk_step}"
    if snapshot is None:
        return ResumeSource.DISK, f"{agreement.reason}: resuming from {disk}"
    if disk_step is not None and disk_step >= snapshot.step:
        return ResumeSource.DISK, f"{agreement.reason}, not newer than {disk}"
    return ResumeSource.SNAPSHOT, f"{agreement.reason}, newer than {disk}"


def record_choice(socket_path: str, cycle: int, source: ResumeSource, reason: str, agreement: Agreement,
                  disk_step: Optional[int]) -> ResumeChosen:
    """Append the ``resume_chosen`` record to the monitor's event file; the launcher forwards it to the job's log."""
    snapshot = agreement.snapshot
    used = source is ResumeSource.SNAPSHOT and snapshot is not None
    record = ResumeChosen(
        cycle=cycle, source=source, step=snapshot.step if used and snapshot is not None else disk_step, reason=reason,
        world_size=agreement.world_size, disk_step=disk_step,
        snapshot_step=snapshot.step if snapshot is not None else None,
        snapshot_time=snapshot.written if used and snapshot is not None else None,
        snapshot=snapshot_name(snapshot.step, snapshot.lineage) if used and snapshot is not None else None)
    write_rank_record(record, socket_path)
    return record
