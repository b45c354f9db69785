"""The fault policy's rule 1 carried out on one node: mark what a faulty cycle resumed from, so the next resume skips it.

What the cycle resumed from is named by the ranks' records: a disk checkpoint by its absolute
path (``checkpoint_loaded``), an in-memory snapshot by its name (``resume_chosen``:
``snapshot:<step>:<lineage>``, :mod:`ft_core.snapshots.condemned`). Every node acts on the same
decision, each on what it holds: a checkpoint on its own disk (marked with
:func:`ft_core.checkpoint_manifest.mark_bad`), the snapshots in its own snapshot directory (every
rank there leaves the condemned one out of the next agreement). A snapshot's fault never marks the
disk checkpoint.
"""

from __future__ import annotations

import logging
import os

from ft_core.checkpoint_manifest import mark_bad
from ft_core.snapshots.condemned import condemn, parse_snapshot_name
from ft_core.snapshots.space import snapshot_dir_for_socket

__all__ = ["mark_bad_here"]

log = logging.getLogger("ft_core.launcher")


def mark_bad_here(name: str, reason: str, monitor_socket: str) -> bool:
    """Mark the checkpoint or snapshot ``name`` bad on this node; False when this node does not hold it."""
    if parse_snapshot_name(name) is not None:
        directory = snapshot_dir_for_socket(monitor_socket)
        if directory is None:
            log.warning("snapshot %s to be marked bad: this node has no snapshot directory", name)
            return False
        condemn(directory, name, reason)
        log.warning("%s marked bad, the next resume falls back to an older snapshot or the disk checkpoint: %s",
                    name, reason)
        return True
    # The path came from a rank's record: only an absolute path that exists here is marked (on another
    # node's local disk it is that node's to mark).
    if not (os.path.isabs(name) and os.path.exists(name)):
        log.warning("checkpoint %r to be marked bad is not on this node: left to the node that has it", name)
        return False
    mark_bad(name, reason)
    log.warning("checkpoint %s marked bad, the next resume falls back to an older one: %s", name, reason)
    return True
