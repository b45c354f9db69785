"""Snapshots the fault policy condemned: a snapshot's name, and the marks that keep the next resumes off it.

A resume from an in-memory snapshot is guarded like one from a disk checkpoint: global rank 0
names the snapshot in its ``resume_chosen`` record (:func:`snapshot_name`:
``snapshot:<step>:<lineage>``, the same on every rank), a fault right after the resume is
fingerprinted with that name (``resumed_from``), and the fault policy's bad-checkpoint rule
(:mod:`ft_core.fault_policy`, rule 1) may condemn it. Every node's launcher then records the
name in its snapshot directory (:func:`condemn`, ``<snapshot dir>/condemned.json``, written
atomically before the workers restart), and each rank leaves the snapshots marked there out
of what it offers to the agreement (:func:`condemned`): the next resume takes an older
snapshot or the disk checkpoint. The disk checkpoint is never marked for a snapshot's fault.
The marks live as long as the snapshot directory (the launcher's life), like the snapshots.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from ft_core.utils.fileutil import atomic_write_json, read_json

__all__ = ["MARKS_FILE", "SNAPSHOT_PREFIX", "condemn", "condemned", "parse_snapshot_name", "snapshot_name"]

#: How a fingerprint's ``resumed_from`` names an in-memory snapshot (a disk checkpoint's is an absolute path).
SNAPSHOT_PREFIX = "snapshot:"
#: The marks of the condemned snapshots, in the job's snapshot directory (one per node).
MARKS_FILE = "condemned.json"
_KEY = "condemned"


def snapshot_name(step: int, lineage: str) -> str:
    """The name of the snapshot of ``step`` in ``lineage``: ``snapshot:20:1.1``."""
    return f"{SNAPSHOT_PREFIX}{int(step)}:{lineage}"


def parse_snapshot_name(name: str) -> Optional[tuple[int, str]]:
    """``(step, lineage)`` of a :func:`snapshot_name`; None for any other name (a disk checkpoint's path).

    Raises:
        ValueError: ``name`` starts with ``snapshot:`` but is not ``snapshot:<step>:<lineage>``.
    """
    if not name.startswith(SNAPSHOT_PREFIX):
        return None
    step, separator, lineage = name[len(SNAPSHOT_PREFIX):].partition(":")
    if not (separator and step.isdigit() and lineage):
        raise ValueError(f"snapshot name {name!r}: expected {SNAPSHOT_PREFIX}<step>:<lineage>, "
                         "with a non-negative integer step and a non-empty lineage")
    return int(step), lineage


def _read(path: str) -> list[dict[str, Any]]:
    """The marks in ``path`` (validated); [] when there is none."""
    try:
        data = read_json(path)
    except FileNotFoundError:
        return []
    marks = data.get(_KEY) if isinstance(data, dict) else None
    if not isinstance(marks, list):
        raise ValueError(f"{path}: key {_KEY!r} is {marks!r}: expected a list of marks")
    for mark in marks:
        name = mark.get("snapshot") if isinstance(mark, dict) else None
        if not isinstance(name, str) or parse_snapshot_name(name) is None:
            raise ValueError(f"{path}: a mark's key 'snapshot' is {name!r}: expected {SNAPSHOT_PREFIX}<step>:<lineage>")
    return marks


def condemned(directory: str) -> frozenset[tuple[int, str]]:
    """``(step, lineage)`` of the snapshots condemned in the snapshot directory ``directory``.

    Raises:
        OSError, ValueError: the marks cannot be read, or are not what :func:`condemn` writes
            (the error names the key and the value).
    """
    found = set()
    for mark in _read(os.path.join(directory, MARKS_FILE)):
        parsed = parse_snapshot_name(mark["snapshot"])
        assert parsed is not None  # validated by _read
        found.add(parsed)
    return frozenset(found)


def condemn(directory: str, name: str, reason: str) -> None:
    """Mark the snapshot ``name`` (a :func:`snapshot_name`) condemned in ``directory``, atomically (the launcher)."""
    if parse_snapshot_name(name) is None:
        raise ValueError(f"snapshot name {name!r}: expected {SNAPSHOT_PREFIX}<step>:<lineage>")
    path = os.path.join(directory, MARKS_FILE)
    try:
        marks = _read(path)
    except (OSError, ValueError):
        marks = []  # unreadable marks are rewritten whole (the ranks refused every snapshot meanwhile)
    if all(mark["snapshot"] != name for mark in marks):
        marks.append({"snapshot": name, "reason": reason, "time": time.time()})
    atomic_write_json(path, {_KEY: marks})
