"""Every event record of the monitor and the launcher: the one schema of the JSON-lines event files.

The monitor writes typed records to ``monitor_events.jsonl``; the launcher
reads them back as the same types, forwards the ones the job's event log
(``ft_events.jsonl``) carries as they are, and writes its own records with
the same writer, which adds its ``node`` field. A record is one JSON object
per line: ``event`` (an :class:`EventName` value), ``time`` (unix seconds),
``node`` (``host:pid``, launcher records only) and the fields of its type.
The "Event log" table of ``docs/events.md`` documents them for users;
:mod:`ft_core.event_file` writes and reads the files.

This module must not import torch nor the monitor: ranks, the monitor and the
launcher all import it.
"""

from __future__ import annotations

import enum
import time
from typing import Any, Optional, Union

import msgspec

from ft_core.exit_causes import ExitCause
from ft_core.fault_policy import FaultAction, FaultOutcome
from ft_core.straggler_scoring import PhaseMedian, StragglerAction

__all__ = [
    "CheckpointLoaded",
    "CheckpointMarkedBad",
    "CheckpointRejected",
    "CheckpointReported",
    "FaultDecision",
    "FaultFingerprint",
    "RankException",
    "ConnectionRejected",
    "CycleStart",
    "Diagnosis",
    "Event",
    "EventName",
    "HangDetected",
    "HangReason",
    "LauncherExit",
    "LauncherStarted",
    "MonitorConnectionRejected",
    "MonitorDied",
    "MonitorLate",
    "DeadlineExtended",
    "MonitorStarted",
    "PhaseMedians",
    "Progress",
    "RankConnected",
    "RankDisconnected",
    "RankEvidence",
    "RankTerminated",
    "LiveRanks",
    "Restart",
    "RestartKind",
    "ResumeChosen",
    "ResumeSource",
    "SignalReceived",
    "Straggler",
    "TimeoutsUpdated",
    "WorkerExit",
    "WorkersStopped",
    "WorkersSucceeded",
    "WorkloadControlReceived",
]


class EventName(str, enum.Enum):
    """The ``event`` field of every record (str-valued: the JSON is the plain name)."""

    # written by the monitor (the launcher forwards the rank_* and hang_detected ones)
    MONITOR_STARTED = "monitor_started"
    RANK_CONNECTED = "rank_connected"
    RANK_DISCONNECTED = "rank_disconnected"
    HANG_DETECTED = "hang_detected"
    RANK_TERMINATED = "rank_terminated"
    CHECKPOINT_REPORTED = "checkpoint_reported"
    RANK_EXCEPTION = "rank_exception"
    TIMEOUTS_UPDATED = "timeouts_updated"
    CONNECTION_REJECTED = "connection_rejected"
    MONITOR_LATE = "monitor_late"
    DEADLINE_EXTENDED = "deadline_extended"
    LIVE_RANKS = "ranks_snapshot"  # the monitor's live ranks (the tag predates the name)
    PHASE_MEDIANS = "phase_medians"  # read by the launcher only (straggler detection)
    RESUME_CHOSEN = "resume_chosen"  # written by global rank 0 into the monitor's file (ft_core.snapshots)
    CHECKPOINT_LOADED = "checkpoint_loaded"  # written by a rank into the monitor's file (ft_core.rank_records)
    CHECKPOINT_REJECTED = "checkpoint_rejected"  # likewise, one per checkpoint skipped before a resume
    # written by the launcher
    LAUNCHER_STARTED = "launcher_started"
    CYCLE_START = "cycle_start"
    WORKER_EXIT = "worker_exit"
    WORKERS_STOPPED = "workers_stopped"
    WORKERS_SUCCEEDED = "workers_succeeded"
    RESTART = "restart"
    FAULT_FINGERPRINT = "fault_fingerprint"
    CHECKPOINT_MARKED_BAD = "checkpoint_marked_bad"
    FAULT_DECISION = "fault_decision"
    PROGRESS = "progress"
    WORKLOAD_CONTROL = "workload_control"
    MONITOR_DIED = "monitor_died"
    MONITOR_CONNECTION_REJECTED = "monitor_connection_rejected"
    SIGNAL = "signal"
    STRAGGLER = "straggler"
    EXIT = "exit"
    DIAGNOSIS = "diagnosis"


class HangReason(str, enum.Enum):
    """Which deadline a hung rank missed (the ``reason`` of a ``hang_detected`` event)."""

    INITIAL_HEARTBEAT = "initial_heartbeat"
    HEARTBEAT = "heartbeat"
    SECTION = "section"
    OUT_OF_SECTION = "out_of_section"


class RestartKind(str, enum.Enum):
    """Why a launcher cycle ended (the ``kind`` of a ``restart`` event)."""

    CRASH = "crash"
    HANG = "hang"
    MONITOR = "monitor"  # the node's rank monitor died
    UNHEALTHY = "unhealthy"  # a worker is stuck in uninterruptible sleep
    EXCLUDED = "excluded"  # a rank asked for ExcludeThisNode
    NODE_FAULT = "node-fault"  # a rank asked for ExcludeThisNode, but the job cannot go on without the node
    SHUTDOWN = "shutdown"  # a rank asked for ShutdownWorkload
    PEER = "peer"  # another node decided
    MEMBERSHIP = "membership"  # new nodes are waiting to join
    STRAGGLER = "straggler"  # a straggler was found and straggler_action is restart

    @property
    def is_fault(self) -> bool:
        """Faults spend the restart budget and count for the no-progress rule."""
        return self in _FAULTS


#: A straggler restart is not a fault: the job was healthy, only slow. It neither spends the budget nor
#: counts for no-progress; straggler detection restarts at most once per node (see ft_core.launcher.straggler_exchange).
_FAULTS = frozenset({RestartKind.CRASH, RestartKind.HANG, RestartKind.MONITOR, RestartKind.UNHEALTHY,
                     RestartKind.NODE_FAULT})


class Event(msgspec.Struct, kw_only=True, frozen=True, tag_field="event", omit_defaults=True):
    """Fields every record has. Fields with a default are left out of the JSON while unset."""

    time: float = msgspec.field(default_factory=time.time)
    #: ``host:pid`` of the launcher that wrote the record; set by its :class:`EventWriter`.
    node: Optional[str] = None

    @property
    def name(self) -> EventName:
        return EventName(type(self).__struct_config__.tag)


# -- records of the monitor -----------------------------------------------------
class MonitorStarted(Event, frozen=True, tag=EventName.MONITOR_STARTED.value):
    pid: Optional[int]
    socket: str


class RankConnected(Event, frozen=True, tag=EventName.RANK_CONNECTED.value):
    rank: int
    local_rank: int
    pid: int
    restart_count: int


class RankDisconnected(Event, frozen=True, tag=EventName.RANK_DISCONNECTED.value):
    rank: int
    pid: int
    graceful: bool
    #: The rank's goodbye reported that training is complete (``shutdown_workload_monitoring(training_finished=True)``).
    training_finished: bool = False


class HangDetected(Event, frozen=True, tag=EventName.HANG_DETECTED.value):
    """A rank missed a deadline and was (or is being) terminated."""

    rank: int
    pid: int
    reason: HangReason
    section: Optional[str]
    elapsed: float
    timeout: float
    iteration: Optional[int]
    open_sections: list[str]
    #: unix time the deadline passed
    deadline_time: float
    #: unix time the monitor noticed (also the record's ``time``)
    detected_time: float
    #: where the stack is: the rank's dump file (monitor), or the copy next to the event log (launcher)
    stack_dump_file: Optional[str]
    #: the hung rank's Python stacks; only in the monitor's file (the launcher saves it to a file)
    stack: Optional[str] = None
    #: the kernel showed the process stopped (SIGSTOP, a debugger) when the deadline passed
    stopped: bool = False

    def describe(self) -> str:
        """The hang in one sentence: the monitor's log line and the launcher's restart reason."""
        where = f" in section {self.section!r}" if self.section else ""
        return (f"rank {self.rank} (pid {self.pid}) hung: {self.reason.value} timeout{where}, "
                f"{self.elapsed:.1f} s elapsed > {self.timeout:.1f} s allowed, iteration {self.iteration}")


class RankTerminated(Event, frozen=True, tag=EventName.RANK_TERMINATED.value):
    rank: int
    pid: int
    signal: str


class CheckpointReported(Event, frozen=True, tag=EventName.CHECKPOINT_REPORTED.value):
    rank: int
    iteration: int


class RankException(Event, frozen=True, tag=EventName.RANK_EXCEPTION.value):
    """A rank reported the exception it fails with (type, innermost user frames, iteration): a fault's fingerprint."""

    rank: int
    pid: int
    exception_type: str
    frames: list[str]
    iteration: Optional[int] = None
    first_iteration: Optional[int] = None  # the first the rank reported this cycle (the monitor's): where it resumed


class CheckpointLoaded(Event, frozen=True, tag=EventName.CHECKPOINT_LOADED.value):
    """A rank resumed from a verified checkpoint: the fingerprint of a later fault names it (``resumed_from``)."""

    rank: int
    cycle: int  # TORCHELASTIC_RESTART_COUNT of the worker that loaded it
    checkpoint: str  # the path loaded (a file, or a sharded or Megatron ``iter_N`` directory)
    step: Optional[int] = None  # the global step (iteration) it holds, when known


class CheckpointRejected(Event, frozen=True, tag=EventName.CHECKPOINT_REJECTED.value):
    """A rank skipped a checkpoint before a resume (torn, truncated, non-finite, marked bad, ...), and why."""

    rank: int
    cycle: int
    checkpoint: str
    reason: str


class TimeoutsUpdated(Event, frozen=True, tag=EventName.TIMEOUTS_UPDATED.value):
    rank: int
    timeouts: dict[str, Any]  # a ``current_timeouts`` state dict


class ConnectionRejected(Event, frozen=True, tag=EventName.CONNECTION_REJECTED.value):
    pid: int
    reason: str


class RankEvidence(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What one rank was doing when a fault ended its cycle: the input of :func:`ft_core.diagnosis.diagnose`."""

    rank: int
    pid: int
    #: The launcher (``host:pid``) of the rank's node; set by the launcher.
    node: Optional[str] = None
    #: The last iteration the rank reported (None: it never did).
    iteration: Optional[int] = None
    #: The innermost open tracked section (None: out of any section).
    section: Optional[str] = None
    #: Unix time of the rank's last sign of life (None: it never sent one).
    last_activity: Optional[float] = None
    #: Seconds without a sign of life (or in its expired section) when the evidence was taken.
    stalled_for: Optional[float] = None
    #: True when its own deadline passed (a ``hang_detected``); False: it was still within its timeouts.
    hung: bool = False
    #: From its stack dump: blocked inside a torch.distributed collective (None: no stack).
    in_collective: Optional[bool] = None
    #: The kernel showed the process stopped (SIGSTOP, a debugger): it cannot be making progress.
    stopped: bool = False
    stack_dump_file: Optional[str] = None
    #: The timeout of the rank's running deadline (None: nothing timed, or not known).
    timeout: Optional[float] = None
    #: False for a rank of the job no monitor ever saw (``diagnose`` with the world size adds those).
    connected: bool = True


class LiveRanks(Event, frozen=True, tag=EventName.LIVE_RANKS.value):
    """The monitor's view of its live (not hung) ranks, taken when the launcher asks at the end of a cycle."""

    ranks: list[RankEvidence]
class PhaseMedians(Event, frozen=True, tag=EventName.PHASE_MEDIANS.value):
    """The node's per-rank, per-phase window medians at the end of report round ``round``
    (``floor(unix time / straggler_report_interval)``); only windows with new samples."""

    round: int
    medians: list[PhaseMedian]


class ResumeSource(str, enum.Enum):
    """What a restarted job resumed from (the ``source`` of a ``resume_chosen`` event)."""

    SNAPSHOT = "snapshot"  # the newest in-memory snapshot every rank holds (ft_core.snapshots)
    DISK = "disk"  # the disk checkpoint (or nothing, on a first start)


class ResumeChosen(Event, frozen=True, tag=EventName.RESUME_CHOSEN.value):
    """The ranks' choice between the newest snapshot they all hold and the disk checkpoint, and why."""

    cycle: int  # TORCHELASTIC_RESTART_COUNT of the workers that chose
    source: ResumeSource
    step: Optional[int]  # the step resumed from (None: a fresh start)
    reason: str
    world_size: int
    #: The disk checkpoint's step (None: none loaded), and the newest step every rank holds a verified snapshot of.
    disk_step: Optional[int] = None
    snapshot_step: Optional[int] = None
    #: When the chosen snapshot was taken (the report's recomputation starts there), and its name (a fingerprint's).
    snapshot_time: Optional[float] = None
    snapshot: Optional[str] = None


# -- records of the launcher ----------------------------------------------------
class MonitorLate(Event, frozen=True, tag=EventName.MONITOR_LATE.value):
    """The monitor woke ``late`` seconds after it meant to; that time was granted to the ranks as grace."""

    late: float
    grace: float
    ranks: list[int]  # the ranks with a running deadline, which the grace moved


class DeadlineExtended(Event, frozen=True, tag=EventName.DEADLINE_EXTENDED.value):
    """A rank past a deadline whose storage I/O progressed (slow storage): extended, up to ``cap`` x ``timeout``.

    Written once per run of the deadline's timer, at its first extension."""

    rank: int
    pid: int
    reason: HangReason  # which rule's deadline: heartbeat, section, out_of_section, initial_heartbeat
    section: str  # the section of a ``section`` deadline; "" for the others
    timeout: float  # the deadline's timeout (seconds)
    bytes: int  # bytes read or written through the rank's (and its children's) regular files since the last look
    cap: float  # the deadline may run at most cap x timeout from its start (io_progress_cap)


class LauncherStarted(Event, frozen=True, tag=EventName.LAUNCHER_STARTED.value):
    run_id: str
    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    max_restarts: int
    rdzv_backend: str
    monitor_pid: Optional[int]
    config: dict[str, Any]


class CycleStart(Event, frozen=True, tag=EventName.CYCLE_START.value):
    cycle: int
    restarts: int
    group_rank: Optional[int]  # None only before torch's rendezvous assigned it
    group_world_size: Optional[int]
    world_size: int
    workers: dict[str, int]  # global rank -> pid
    monitor_pid: Optional[int]


class WorkerExit(Event, frozen=True, tag=EventName.WORKER_EXIT.value):
    """A worker ended: ``exit_code`` when it exited, ``signal`` when a signal killed it."""

    cycle: int
    local_rank: int
    pid: int
    cause: ExitCause
    rank: Optional[int] = None
    exit_code: Optional[int] = None
    signal: Optional[str] = None


class WorkersStopped(Event, frozen=True, tag=EventName.WORKERS_STOPPED.value):
    cycle: int


class WorkersSucceeded(Event, frozen=True, tag=EventName.WORKERS_SUCCEEDED.value):
    cycle: Optional[int]


class Restart(Event, frozen=True, tag=EventName.RESTART.value):
    cycle: int  # the cycle that ended
    kind: RestartKind
    reason: str  # what this node saw
    restarts: int
    max_restarts: int
    cause: Optional[str] = None  # the job-wide decision's reason: the same on every node


class FaultFingerprint(Event, frozen=True, tag=EventName.FAULT_FINGERPRINT.value):
    """What a cycle-ending fault was, as the restart policy compares faults (:mod:`ft_core.fault_policy`)."""

    cycle: int
    kind: str  # a ``FaultClass`` value
    culprits: list[int]
    #: The culprits' nodes (``host:pid`` of their launchers): the bad-node rule follows them.
    nodes: list[str] = []
    iteration: Optional[int] = None
    exception_type: Optional[str] = None
    frames: list[str] = []
    signal: Optional[str] = None
    #: The checkpoint the cycle resumed from and its step (its ranks' ``checkpoint_loaded``), when known.
    resumed_from: Optional[str] = None
    resumed_step: Optional[int] = None


class FaultDecision(Event, frozen=True, tag=EventName.FAULT_DECISION.value):
    """What the fault policy made of a cycle's fault and what the job did: the budget by cause.

    The same record on every node of the job (the job-wide decision); ``decided_by`` took it.
    """

    cycle: int  # the cycle that ended
    action: FaultAction  # the fault policy's verdict
    outcome: FaultOutcome  # what the job did (``leave``: this node was the excluded suspect)
    reason: str  # the decision's reason (the ``restart`` event's ``cause``, the exit reason of a stop)
    restarts: int
    decided_by: str
    checkpoint: Optional[str] = None  # marked bad
    suspect_node: Optional[str] = None  # excluded (``exclude_node``), else named


class CheckpointMarkedBad(Event, frozen=True, tag=EventName.CHECKPOINT_MARKED_BAD.value):
    """The fault policy found the checkpoint a cycle resumed from bad: marked, so the next resume skips it."""

    cycle: int  # the cycle that ended
    checkpoint: str
    reason: str


class Progress(Event, frozen=True, tag=EventName.PROGRESS.value):
    iteration: int
    source: str
    cycle: int


class WorkloadControlReceived(Event, frozen=True, tag=EventName.WORKLOAD_CONTROL.value):
    action: str  # a WorkloadAction name
    rank: int
    description: str


class MonitorDied(Event, frozen=True, tag=EventName.MONITOR_DIED.value):
    exit_code: Optional[int]


class MonitorConnectionRejected(Event, frozen=True, tag=EventName.MONITOR_CONNECTION_REJECTED.value):
    """The monitor's ``connection_rejected``, in the launcher's log."""

    reason: str
    pid: Optional[int] = None


class SignalReceived(Event, frozen=True, tag=EventName.SIGNAL.value):
    signal: str
    running_workers: int


class Straggler(Event, frozen=True, tag=EventName.STRAGGLER.value):
    """A rank's relative score stayed below ``threshold`` for ``consecutive`` reports: the same record on every
    node (``rank_node`` is the launcher hosting the rank; ``node``, as always, the one that wrote it)."""

    cycle: int
    rank: int
    rank_node: str
    phase: str
    #: Median over all ranks of their medians / this rank's median (1.0 typical, lower is slower).
    relative_score: float
    #: This rank's best median in the cycle / its current median.
    individual_score: float
    median: float  # this rank's current median duration of the phase, seconds
    window: int  # samples the median was taken over
    threshold: float
    consecutive: int
    action: StragglerAction

    def describe(self) -> str:
        """The straggler in one sentence: the log line and, with ``restart``, the restart reason."""
        return (f"rank {self.rank} on {self.rank_node} is a straggler in phase {self.phase!r}: relative score "
                f"{self.relative_score:.2f} < {self.threshold:g} for {self.consecutive} reports (median "
                f"{self.median:.4f} s over {self.window} samples; individual score {self.individual_score:.2f})")


class LauncherExit(Event, frozen=True, tag=EventName.EXIT.value):
    exit_code: int
    reason: str


class Diagnosis(Event, frozen=True, tag=EventName.DIAGNOSIS.value):
    """Who caused a hang and who only waited for it; the same record on every node of the job."""

    cycle: int
    culprits: list[int]
    waiting: list[int]
    #: The rule that decided, in one line.
    evidence: str
    #: The one-line story for humans ("rank 1 (node X, pid P) hung in section step ...").
    headline: str
    #: The nodes (``host:pid`` of their launchers) of the culprits.
    culprit_nodes: list[str]
    #: The launcher that gathered the evidence of every node and decided.
    decided_by: Optional[str] = None


AnyEvent = Union[
    MonitorStarted, RankConnected, RankDisconnected, HangDetected, RankTerminated, CheckpointReported, RankException,
    TimeoutsUpdated, ConnectionRejected, MonitorLate, DeadlineExtended, PhaseMedians, Straggler, LauncherStarted, CycleStart, WorkerExit, WorkersStopped,
    WorkersSucceeded, Restart, FaultFingerprint, Progress, WorkloadControlReceived, MonitorDied, MonitorConnectionRejected,
    SignalReceived, LauncherExit, LiveRanks, Diagnosis, ResumeChosen, CheckpointLoaded, CheckpointRejected, CheckpointMarkedBad, FaultDecision,
]
