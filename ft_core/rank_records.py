"""Records a rank writes itself into its node's event file: what it resumed from, and what it skipped.

Some facts are known only inside a rank, at a moment the monitor protocol has no
message for: which checkpoint the ranks agreed to resume from, which newer ones
they rejected and why, whether they chose a snapshot. A rank appends such a record
(one JSON line, :class:`ft_core.event_file.EventWriter`) to the monitor's event file of
its job directory, found from ``FT_RANK_MONITOR_IPC_SOCKET``; the launcher reads it
with the monitor's records and forwards it to the job's event log. Without a
monitor (a plain ``torchrun`` run, a unit test) there is nowhere to write: nothing
is written.

The record's fields are typed (:mod:`ft_core.events`): the launcher decodes them
with the same types, so a malformed line is skipped with a warning, never acted on.
"""

from __future__ import annotations

import os
from typing import Optional

from ft_core.event_file import EventWriter
from ft_core.events import Event
from ft_core.jobdir import MONITOR_SOCKET_ENV, JobDir

__all__ = ["current_cycle", "write_rank_record"]


def current_cycle() -> int:
    """This worker's cycle: ``TORCHELASTIC_RESTART_COUNT`` (0 outside a launcher)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def write_rank_record(record: Event, socket_path: Optional[str] = None) -> bool:
    """Append ``record`` to this job's monitor event file; False when no monitor watches this rank.

    ``socket_path``: the monitor's socket (default: ``FT_RANK_MONITOR_IPC_SOCKET``).
    """
    socket_path = socket_path or os.environ.get(MONITOR_SOCKET_ENV)
    if not socket_path:
        return False
    with EventWriter(JobDir.of_socket(socket_path).monitor_events) as out:
        out.write(record)
    return True
