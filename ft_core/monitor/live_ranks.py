"""The evidence of every live rank of the node, taken when the launcher asks at the end of a faulty cycle.

The launcher sends :data:`LIVE_RANKS_SIGNAL` to the monitor when a cycle ends
for a hang (here or on another node). The monitor then asks every live rank
for a stack dump -- the same faulthandler dump it asks of a hung rank, which
only writes a file -- and, once the dumps settled or ``stack_dump_timeout``
passed, writes one ``ranks_snapshot`` record: what each rank was doing, and
whether its stack shows it blocked in a collective. The launcher feeds that to
:func:`ft_core.diagnosis.diagnose`. Taking it never kills nor delays a kill:
hung ranks are handled by :mod:`.hang` as before, and only ranks that said
they can dump (they sent a dump path and a first sign of life) are signalled.

Like :class:`~ft_core.monitor.hang.Hang`, the object decides and the server
acts, so the waiting is testable without a process.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from typing import Optional

import msgspec

from ft_core.diagnosis import stack_in_collective
from ft_core.events import LiveRanks, RankEvidence
from ft_core.monitor.hang import DumpWait

__all__ = ["LIVE_RANKS_SIGNAL", "LiveRanksEvidence"]

#: What the launcher sends the monitor process to ask for the evidence of its live ranks.
LIVE_RANKS_SIGNAL = signal.SIGUSR1


@dataclasses.dataclass
class _Pending:
    evidence: RankEvidence
    dump_path: Optional[str]
    dump: Optional[DumpWait]


@dataclasses.dataclass
class LiveRanksEvidence:
    """The evidence of the live ranks, waiting for the stack dumps that were asked for."""

    _ranks: list[_Pending] = dataclasses.field(default_factory=list)

    def add(self, evidence: RankEvidence, dump_path: Optional[str] = None, dump: Optional[DumpWait] = None) -> None:
        """One rank; ``dump`` when its stack dump was asked for (``dump_path`` is its dump file)."""
        self._ranks.append(_Pending(evidence, dump_path, dump))

    def poll(self, now: float, dump_size: Callable[[str], int]) -> Optional[float]:
        """Seconds to wait for the dumps still being written, or None once every one settled or timed out."""
        waits = [p.dump.poll(now, dump_size(p.dump_path)) for p in self._ranks
                 if p.dump is not None and p.dump_path is not None]
        pending = [w for w in waits if w is not None]
        return min(pending) if pending else None

    def record(self, read_stack: Callable[[str, int], Optional[str]]) -> LiveRanks:
        """The ``ranks_snapshot`` record; ``read_stack(path, offset)`` reads what a dump file gained."""
        ranks = []
        for p in self._ranks:
            evidence = p.evidence
            if p.dump is not None and p.dump_path is not None:
                verdict = stack_in_collective(read_stack(p.dump_path, p.dump.offset))
                evidence = msgspec.structs.replace(evidence, in_collective=verdict, stack_dump_file=p.dump_path)
            ranks.append(evidence)
        return LiveRanks(ranks=sorted(ranks, key=lambda e: e.rank))
