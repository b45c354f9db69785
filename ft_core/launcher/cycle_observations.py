"""What a node saw in one cycle: one value, replaced at every cycle start, read by pure decisions.

:class:`~ft_core.launcher.agent.FtElasticAgent` makes a new :class:`CycleObservations`
when it starts a cycle's workers (nothing is carried over, nothing reset by hand),
feeds it every record of the node monitor (:meth:`CycleObservations.observe`) and
what it sees itself (the workers that failed, the evidence it took). What ends the
cycle (:mod:`.cycle_triggers`), the fault's fingerprint (:mod:`.fault_fingerprint`)
and the checkpoint the cycle resumed from (:mod:`.resumed_checkpoint`) are pure
functions of this value; the agent acts on them (waits, exchanges, writes). This is
the node monitor's pattern (state, decisions without I/O, an executor) applied to
the launcher, as torch's own rendezvous and NVRx's per-cycle progress tracker do.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ft_core.events import (
    CheckpointLoaded,
    Event,
    HangDetected,
    LiveRanks,
    RankConnected,
    RankDisconnected,
    RankEvidence,
    RankException,
    ResumeChosen,
    ResumeSource,
)

__all__ = ["CycleObservations"]


@dataclasses.dataclass
class CycleObservations:
    """What this node saw of one cycle (``cycle``, whose workers are ``pids``); the agent makes one per cycle."""

    #: The job-wide cycle number (-1: before the first cycle) and the pids of its workers on this node.
    cycle: int = -1
    pids: frozenset[int] = frozenset()
    #: Megatron-LM's ``--load`` in the workers' command line and its tracker's iteration as the cycle started.
    load_dir: Optional[str] = None
    tracker_at_start: Optional[int] = None
    #: ``hang_detected`` records of this cycle's workers, by pid.
    hangs: dict[int, HangDetected] = dataclasses.field(default_factory=dict)
    #: The exceptions this cycle's workers reported failing with (a fault's fingerprint), in arrival order.
    exceptions: list[RankException] = dataclasses.field(default_factory=list)
    #: The checkpoint this cycle's workers resumed from (their ``checkpoint_loaded`` record), if they said.
    loaded: Optional[CheckpointLoaded] = None
    #: The in-memory snapshot this cycle's ranks resumed from instead of ``loaded`` (their ``resume_chosen``).
    resumed_snapshot: Optional[ResumeChosen] = None
    #: local_rank -> (pid, exit code) of the workers that failed on their own this cycle, and when it was seen.
    failed: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    failed_at: float = 0.0
    #: Pids of this cycle's workers that connected to the monitor, and when each disconnected (the monitor's
    #: record of the end of its connection: at its exit at the latest).
    connected: set[int] = dataclasses.field(default_factory=set)
    gone_at: dict[int, float] = dataclasses.field(default_factory=dict)
    #: The evidence of this node's ranks for the diagnosis of this cycle's hang, once taken.
    evidence: Optional[list[RankEvidence]] = None
    #: The monitor's record of its live ranks, the last one it sent (the agent asks for it when taking evidence).
    live_ranks: Optional[LiveRanks] = None
    #: Pids of this cycle's workers whose graceful goodbye reported training complete.
    reported_finished: set[int] = dataclasses.field(default_factory=set)
    #: Every worker of this cycle reported training complete (the job store is told once).
    node_finished: bool = False
    #: Why training is finished, decided at the cycle's first worker failure; None: it is not.
    finished_reason: Optional[str] = None

    def observe(self, record: Event) -> bool:
        """Take in one record of the node monitor; True when it completes this node's finished reports.

        Only what the record says of this cycle is kept (records of an earlier cycle's
        workers are ignored). Forwarding records to the job's event log, progress and the
        straggler exchange is the agent's: it acts, this value only remembers. The return
        value is the one fact that calls for an action once (tell the job store that this
        node finished).
        """
        match record:
            case RankConnected() if record.pid in self.pids:
                self.connected.add(record.pid)
            case RankDisconnected() if record.pid in self.pids:
                self.gone_at.setdefault(record.pid, record.time)
                if record.graceful and record.training_finished:
                    self.reported_finished.add(record.pid)
                    if not self.node_finished and self.pids <= self.reported_finished:
                        self.node_finished = True
                        return True
            case HangDetected() if record.pid in self.pids:
                self.hangs[record.pid] = record
            case CheckpointLoaded() if record.cycle == self.cycle:  # written by a rank (ft_core.rank_records)
                self.loaded = record
            case ResumeChosen() if record.cycle == self.cycle:  # written by global rank 0 (ft_core.snapshots)
                self.resumed_snapshot = record if record.source is ResumeSource.SNAPSHOT else None
            case RankException() if record.pid in self.pids:
                self.exceptions.append(record)
            case LiveRanks():
                self.live_ranks = record
        return False
