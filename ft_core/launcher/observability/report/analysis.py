"""The goodput report's analysis: where the wall time of a job went, from the typed records of its event logs.

``ft_launcher report LOG_DIR`` (or ``python -m ft_core.launcher.observability.report LOG_DIR``) reads every
``ft_events*.jsonl`` under the given directories (or the given files): one file per
node, one per requeue, or one file shared by several launchers all work, since every
record names its ``node`` (``host:pid`` of its launcher). It prints where the wall
time went: training, time lost to each fault (detection, restart, recomputation of
the work done since the last checkpoint) and the rest (start-up, rendezvous,
shutdown); the goodput (productive training time / wall time); the faults by kind,
culprit rank and node. ``--json`` prints the same as one JSON object with fixed keys;
``--plot FILE.png`` draws a timeline (needs matplotlib: ``pip install 'ft-suite-pytorch[report]'``).

How the time is counted (all per *attempt*: the launchers of one allocation, i.e. one
run of the job between requeues; the queue time between attempts is not wall time):

* a cycle trains from its workers' first connection to the rank monitor (or its
  ``cycle_start`` when no rank connects) to its end or to the onset of its fault;
* a fault's onset is the last sign of life of the hung rank (``hang_detected.time -
  elapsed``) or the time the crash was seen; **detection** runs from the onset to the
  detection, **restart** from the detection to the next cycle's workers being back;
* **recomputation** is the training after the last checkpoint before the onset (the
  last ``progress`` event of the cycle, or the cycle's start when it saved none):
  work that is thrown away. It is known only when the job reports progress
  (``progress`` events); then ``iterations_lost`` is the hung rank's iteration minus
  the last checkpointed one, when both are known;
* goodput = (training - recomputation) / wall time.

The budget by cause: every fault's decision (``fault_decision``, the same record on every
node, counted once) says what the fault policy made of it (:mod:`ft_core.fault_policy`):
the restarts are counted by cause (a transient fault, a bad checkpoint marked and fallen
back from, a suspect node excluded or only named), the stop says why (a deterministic
fault, the budget, no progress), and the checkpoints the ranks rejected before a resume
(``checkpoint_rejected``) are listed with the reason.

The culprit of a fault is the rank that crashed first, or the culprit the launchers'
``diagnosis`` of a hang named (:mod:`ft_core.diagnosis`: stacks, iterations, who
stopped first), with the ranks that only waited in ``waiting``. Without a diagnosis
(older logs) it is the only rank that hung; when several ranks hung the event log
alone cannot tell the culprit from its peers: it is left unknown and ``ranks`` lists
them all.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Optional

from ft_core.event_file import read_records
from ft_core.events import (
    CheckpointRejected,
    CycleStart,
    Diagnosis,
    Event,
    FaultDecision,
    HangDetected,
    LauncherExit,
    LauncherStarted,
    MonitorDied,
    Progress,
    RankConnected,
    Restart,
    RestartKind,
    ResumeChosen,
    ResumeSource,
    SignalReceived,
    WorkerExit,
    WorkersSucceeded,
    WorkloadControlReceived,
)
from ft_core.exit_causes import ExitCause
from ft_core.fault_policy import FaultAction, FaultOutcome
from ft_core.jobdir import LAUNCHER_EVENTS_FILE

__all__ = ["CAUSES", "Fault", "Report", "build_report", "find_event_files", "load_records"]

#: What a restart was spent on, by the fault policy's verdict (the budget by cause).
CAUSES = {
    FaultAction.RESTART: "transient",
    FaultAction.MARK_CHECKPOINT_BAD: "bad checkpoint",
    FaultAction.EXCLUDE_NODE: "suspect node excluded",
    FaultAction.STOP: "deterministic fault",
}
#: A restart the policy let happen while naming a suspect node it could not exclude (no spare).
SUSPECT_NOT_EXCLUDED = "suspect node (no spare)"


@dataclasses.dataclass
class Fault:
    """One fault: the cycle it ended and the time it cost."""

    attempt: int
    cycle: int
    kind: str
    #: Wall-clock time of the onset (unix seconds).
    time: float
    reason: str
    culprit_rank: Optional[int]
    culprit_node: Optional[str]
    #: Every rank seen failing in this cycle, the culprit first.
    ranks: list[int]
    iteration: Optional[int]
    checkpoint_iteration: Optional[int]
    iterations_lost: Optional[int]
    detection_s: float
    #: None when the job did not restart after this fault (budget spent, stop).
    restart_s: Optional[float]
    #: None when the job reports no progress (no ``progress`` events).
    recompute_s: Optional[float]
    #: Times used by the timeline.
    detected: float
    resumed: Optional[float]
    #: Ranks that only waited for the culprit, and the diagnosis' headline (hangs the launchers diagnosed).
    waiting: list[int] = dataclasses.field(default_factory=list)
    diagnosis: Optional[str] = None
    #: What the next cycle resumed from (``resume_chosen``: "snapshot" or "disk"), its step, and the
    #: recomputation had it resumed from the disk checkpoint (``recompute_s`` is the one it had).
    resumed_from: Optional[str] = None
    resume_step: Optional[int] = None
    recompute_without_snapshots_s: Optional[float] = None

    @property
    def lost_s(self) -> float:
        return self.detection_s + (self.restart_s or 0.0) + (self.recompute_s or 0.0)


class _Failure(NamedTuple):
    """One rank's failure as the logs show it."""

    onset: float
    detected: float
    rank: Optional[int]
    host: Optional[str]
    iteration: Optional[int]
    kind: RestartKind


@dataclasses.dataclass
class _Launcher:
    node: str
    start: float
    end: float
    exit_code: Optional[int]
    reason: Optional[str]
    records: list[Event]

    @property
    def host(self) -> str:
        return self.node.rsplit(":", 1)[0]


@dataclasses.dataclass
class _Cycle:
    attempt: int
    number: int
    start: float
    ready: float
    end: float
    nodes: list[str]


@dataclasses.dataclass
class Report:
    """Everything the report prints; :meth:`to_json` has fixed keys."""

    files: list[str]
    run_ids: list[str]
    attempts: int
    nodes: list[str]
    cycles: int
    wall_time_s: float
    training_time_s: float
    detection_s: float
    restart_s: float
    recompute_s: Optional[float]
    faults: list[Fault]
    exit_codes: list[Optional[int]]
    exit_reasons: list[Optional[str]]
    #: Timeline material: per launcher (node, start, end), cycles, checkpoints (time, iteration), attempt spans.
    launchers: list[tuple[str, float, float]]
    cycle_spans: list[_Cycle]
    checkpoints: list[tuple[float, int, str]]
    attempt_spans: list[tuple[float, float]]
    #: Restarts per cause (:data:`CAUSES`), why the job stopped (None: it did not, or the logs do not say),
    #: and the checkpoints rejected before a resume (path -> reason).
    restarts_by_cause: dict[str, int] = dataclasses.field(default_factory=dict)
    stopped_by: Optional[str] = None
    rejected_checkpoints: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def productive_time_s(self) -> float:
        return max(0.0, self.training_time_s - (self.recompute_s or 0.0))

    @property
    def goodput_pct(self) -> Optional[float]:
        return 100.0 * self.productive_time_s / self.wall_time_s if self.wall_time_s > 0 else None

    @property
    def lost_s(self) -> float:
        """Time lost to faults: detection + restart + recomputation (the exit summary and the metrics say the same)."""
        return self.detection_s + self.restart_s + (self.recompute_s or 0.0)

    @property
    def other_s(self) -> float:
        return max(0.0, self.wall_time_s - self.training_time_s - self.detection_s - self.restart_s)

    def faults_by(self, key: str) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for fault in self.faults:
            value = getattr(fault, key)
            counts[str(value) if value is not None else "unknown"] += 1
        return dict(sorted(counts.items()))

    def to_json(self) -> dict[str, Any]:
        """The report for machines: every key is always present (None when unknown)."""
        return {
            "files": self.files,
            "run_ids": self.run_ids,
            "attempts": self.attempts,
            "nodes": self.nodes,
            "cycles": self.cycles,
            "wall_time_s": _round(self.wall_time_s),
            "training_time_s": _round(self.training_time_s),
            "productive_time_s": _round(self.productive_time_s),
            "goodput_pct": _round(self.goodput_pct),
            "lost_time_s": {"detection": _round(self.detection_s), "restart": _round(self.restart_s),
                            "recompute": _round(self.recompute_s)},
            "other_time_s": _round(self.other_s),
            "faults_total": len(self.faults),
            "faults_by_kind": self.faults_by("kind"),
            "faults_by_rank": self.faults_by("culprit_rank"),
            "faults_by_node": self.faults_by("culprit_node"),
            "faults": [{
                "attempt": f.attempt, "cycle": f.cycle, "kind": f.kind, "time": _round(f.time),
                "culprit_rank": f.culprit_rank, "culprit_node": f.culprit_node, "ranks": f.ranks,
                "iteration": f.iteration, "checkpoint_iteration": f.checkpoint_iteration,
                "iterations_lost": f.iterations_lost, "detection_s": _round(f.detection_s),
                "restart_s": _round(f.restart_s), "recompute_s": _round(f.recompute_s),
                "lost_s": _round(f.lost_s), "reason": f.reason, "waiting": f.waiting, "diagnosis": f.diagnosis,
                "resumed_from": f.resumed_from, "resume_step": f.resume_step,
                "recompute_without_snapshots_s": _round(f.recompute_without_snapshots_s),
            } for f in self.faults],
            "exit_codes": self.exit_codes,
            "exit_reasons": self.exit_reasons,
            "restarts_by_cause": self.restarts_by_cause,
            "stopped_by": self.stopped_by,
            "rejected_checkpoints": self.rejected_checkpoints,
        }


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)


# -- reading ----------------------------------------------------------------
def find_event_files(paths: Iterable[str]) -> list[str]:
    """The event logs named by ``paths``: files as given, directories searched for ``ft_events*.jsonl``."""
    stem, ext = os.path.splitext(LAUNCHER_EVENTS_FILE)
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found.extend(sorted(glob.glob(os.path.join(path, "**", f"{stem}*{ext}"), recursive=True)))
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    return sorted(set(found), key=found.index)


def load_records(files: Sequence[str]) -> list[Event]:
    """Every launcher record of ``files`` (``node`` set), decoded into its event type, in time order.

    A line that is not a valid record of a known type (torn, corrupt, or from
    a newer version) is skipped with a warning; fields the schema does not
    know (from an older or newer version) are ignored.
    """
    records: list[Event] = []
    for path in files:
        records.extend(record for record in read_records(path)[0] if record.node is not None)
    records.sort(key=lambda r: r.time)
    return records


# -- analysis ---------------------------------------------------------------
def build_report(records: Sequence[Event], files: Sequence[str] = ()) -> Report:
    """Account the wall time of the job described by ``records`` (see the module docstring)."""
    launchers = _launchers(records)
    attempts = _attempts(launchers)
    has_progress = any(isinstance(r, Progress) for r in records)
    checkpoints = sorted((r.time, r.iteration, lc.node) for lc in launchers for r in lc.records
                         if isinstance(r, Progress))
    cycles: list[_Cycle] = []
    faults: list[Fault] = []
    wall = training = detection = restart = recompute = 0.0
    for index, group in enumerate(attempts):
        start, end = min(lc.start for lc in group), max(lc.end for lc in group)
        wall += end - start
        attempt_cycles = _cycles(index, group)
        cycles.extend(attempt_cycles)
        for position, cycle in enumerate(attempt_cycles):
            following = attempt_cycles[position + 1] if position + 1 < len(attempt_cycles) else None
            fault = _fault(index, cycle, group, following, checkpoints, has_progress)
            run_end = min(cycle.end, fault.time) if fault is not None else cycle.end
            training += max(0.0, run_end - cycle.ready)
            if fault is not None:
                faults.append(fault)
                detection += fault.detection_s
                restart += fault.restart_s or 0.0
                recompute += fault.recompute_s or 0.0
    by_cause, stopped_by = _budget(records)
    return Report(
        files=list(files),
        run_ids=sorted({r.run_id for r in records if isinstance(r, LauncherStarted) and r.run_id}),
        attempts=len(attempts),
        nodes=sorted({lc.host for lc in launchers}),
        cycles=len(cycles),
        wall_time_s=wall,
        training_time_s=training,
        detection_s=detection,
        restart_s=restart,
        recompute_s=recompute if has_progress else None,
        faults=faults,
        exit_codes=[lc.exit_code for lc in launchers],
        exit_reasons=[lc.reason for lc in launchers],
        launchers=[(lc.node, lc.start, lc.end) for lc in launchers],
        cycle_spans=cycles,
        checkpoints=checkpoints,
        attempt_spans=[(min(lc.start for lc in g), max(lc.end for lc in g)) for g in attempts],
        restarts_by_cause=by_cause,
        stopped_by=stopped_by,
        rejected_checkpoints=_rejected(records),
    )


def _budget(records: Sequence[Event]) -> tuple[dict[str, int], Optional[str]]:
    """Restarts per cause and why the job stopped, from the job-wide decisions (each counted once)."""
    decisions: dict[tuple[str, int], FaultDecision] = {}
    for r in records:
        if isinstance(r, FaultDecision):
            decisions.setdefault((r.decided_by, r.cycle), r)
    by_cause: Counter[str] = Counter()
    stopped_by = None
    for decision in sorted(decisions.values(), key=lambda d: d.time):
        action = decision.action  # (a record of a newer version's verdict is skipped when read)
        if decision.outcome is FaultOutcome.STOP:
            stopped_by = f"{CAUSES[action]}: {decision.reason}" if action is FaultAction.STOP else decision.reason
        elif action is FaultAction.RESTART and decision.suspect_node is not None:
            by_cause[SUSPECT_NOT_EXCLUDED] += 1
        else:
            by_cause[CAUSES[action]] += 1
    return dict(by_cause.most_common()), stopped_by


def _rejected(records: Sequence[Event]) -> dict[str, str]:
    """The checkpoints ranks skipped before a resume, and why (the first reason given)."""
    rejected: dict[str, str] = {}
    for r in records:
        if isinstance(r, CheckpointRejected):
            rejected.setdefault(r.checkpoint, r.reason)
    return rejected


def _launchers(records: Sequence[Event]) -> list[_Launcher]:
    by_node: dict[str, list[Event]] = {}
    for record in records:
        if record.node is not None:  # a monitor's own record (not forwarded by a launcher) has no node
            by_node.setdefault(record.node, []).append(record)
    launchers = []
    for node, own in by_node.items():
        started = [r.time for r in own if isinstance(r, LauncherStarted)]
        exits = [r for r in own if isinstance(r, LauncherExit)]
        launchers.append(_Launcher(
            node=node, start=started[0] if started else own[0].time,
            end=exits[-1].time if exits else own[-1].time,
            exit_code=exits[-1].exit_code if exits else None,
            reason=exits[-1].reason if exits else "no exit record (killed?)", records=own))
    return sorted(launchers, key=lambda lc: lc.start)


def _attempts(launchers: Sequence[_Launcher]) -> list[list[_Launcher]]:
    """Launchers whose lifetimes overlap form one attempt (one allocation of the job)."""
    attempts: list[list[_Launcher]] = []
    end = float("-inf")
    for launcher in launchers:
        if not attempts or launcher.start > end:
            attempts.append([])
            end = launcher.end
        attempts[-1].append(launcher)
        end = max(end, launcher.end)
    return attempts


def _cycles(attempt: int, group: Sequence[_Launcher]) -> list[_Cycle]:
    """The job-wide cycles of one attempt, merged over its nodes."""
    starts: dict[int, list[tuple[float, str]]] = {}
    for launcher in group:
        for r in launcher.records:
            if isinstance(r, CycleStart):
                starts.setdefault(r.cycle, []).append((r.time, launcher.node))
    numbers = sorted(starts)
    cycles = []
    for position, number in enumerate(numbers):
        start = min(t for t, _ in starts[number])
        nodes = sorted({node for _, node in starts[number]})
        next_start = min(t for t, _ in starts[numbers[position + 1]]) if position + 1 < len(numbers) else None
        ends = []
        connected = []
        for launcher in group:
            if launcher.node not in nodes:
                continue
            for r in launcher.records:
                if r.time < start:
                    continue
                if isinstance(r, RankConnected) and r.restart_count == number:
                    connected.append(r.time)
                elif (isinstance(r, (Restart, WorkersSucceeded)) and r.cycle == number) or \
                        (isinstance(r, (SignalReceived, LauncherExit)) and
                         (next_start is None or r.time < next_start)):
                    ends.append(r.time)
            if next_start is None:
                ends.append(launcher.end)
        end = min(ends) if ends else (next_start if next_start is not None else start)
        if next_start is not None:
            end = min(end, next_start)
        ready = min(connected) if connected else start
        cycles.append(_Cycle(attempt, number, start, min(ready, end), end, nodes))
    return cycles


def _fault(attempt: int, cycle: _Cycle, group: Sequence[_Launcher], following: Optional[_Cycle],
           checkpoints: Sequence[tuple[float, int, str]], has_progress: bool) -> Optional[Fault]:
    """The fault that ended ``cycle``, if any."""
    failures: list[_Failure] = []
    kinds: list[RestartKind] = []
    reasons: list[str] = []
    hung_pids: set[tuple[str, int]] = set()
    restarts: list[Restart] = []
    controls: list[WorkloadControlReceived] = []
    diagnoses: list[tuple[Diagnosis, _Launcher]] = []
    for launcher in group:
        pids = _cycle_pids(launcher.records, cycle.number)
        for r in launcher.records:
            if isinstance(r, HangDetected) and r.pid in pids:
                failures.append(_Failure(r.time - r.elapsed, r.time, r.rank, launcher.host, r.iteration, RestartKind.HANG))
                hung_pids.add((launcher.node, r.pid))
                kinds.append(RestartKind.HANG)
            elif isinstance(r, WorkerExit) and r.cycle == cycle.number and \
                    not r.cause.launcher_stop and \
                    (launcher.node, r.pid) not in hung_pids and r.cause is not ExitCause.HANG:
                failures.append(_Failure(r.time, r.time, r.rank, launcher.host, None, RestartKind.CRASH))
                kinds.append(RestartKind.CRASH)
            elif isinstance(r, MonitorDied) and cycle.start <= r.time <= cycle.end:
                failures.append(_Failure(r.time, r.time, None, launcher.host, None, RestartKind.MONITOR))
                kinds.append(RestartKind.MONITOR)
            elif isinstance(r, Restart) and r.cycle == cycle.number:
                restarts.append(r)
                reasons.append(r.reason)
                if r.kind.is_fault:
                    kinds.append(r.kind)
            elif isinstance(r, WorkloadControlReceived) and cycle.start <= r.time <= cycle.end:
                controls.append(r)
            elif isinstance(r, Diagnosis) and r.cycle == cycle.number:
                diagnoses.append((r, launcher))
    if not kinds and any(r.kind is RestartKind.PEER for r in restarts) and not controls:
        # Another node ended the cycle for a fault whose records are not in these logs.
        kinds.append(RestartKind.PEER)
    if not kinds:
        return None
    kind = RestartKind.HANG if RestartKind.HANG in kinds else kinds[0]
    if not failures:  # a fault only a restart record tells of (an unhealthy worker, a peer's fault)
        failures.append(_Failure(cycle.end, cycle.end, None, None, None, kind))
    failures.sort(key=lambda f: (f.onset, f.detected, f.rank if f.rank is not None else 1 << 30))
    onset = min(f.onset for f in failures)
    detected = min(f.detected for f in failures)
    onset = max(min(onset, detected), cycle.ready if cycle.ready <= detected else cycle.start)
    ranks: list[int] = []
    for f in failures:
        if f.rank is not None and f.rank not in ranks:
            ranks.append(f.rank)
    iterations = [f.iteration for f in failures if f.iteration is not None]
    iteration = max(iterations) if iterations else None
    before = [c for c in checkpoints if c[0] <= onset]
    checkpoint_iteration = max((c[1] for c in before), default=None)
    in_cycle = [c[0] for c in before if c[0] >= cycle.ready]
    recompute = max(0.0, onset - (max(in_cycle) if in_cycle else cycle.ready)) if has_progress else None
    resumed = following.ready if following is not None else None
    resume = next((r for lc in group for r in lc.records if following is not None and
                   isinstance(r, ResumeChosen) and r.cycle == following.number), None)
    without = recompute
    if resume is not None and resume.source is ResumeSource.SNAPSHOT and recompute is not None and \
            resume.snapshot_time is not None:
        # Resumed from a snapshot: only the training after it (in this cycle) is recomputed.
        recompute = min(recompute, max(0.0, onset - max(resume.snapshot_time, cycle.ready)))
        checkpoint_iteration = resume.step
    culprit = _culprit(failures)
    diagnosis = diagnoses[0][0] if diagnoses else None  # the same record on every node
    if diagnosis is not None and diagnosis.culprits:
        hosts = {launcher.node: launcher.host for launcher in group}
        nodes = diagnosis.culprit_nodes
        culprit = (diagnosis.culprits[0], hosts.get(nodes[0], nodes[0].rsplit(":", 1)[0]) if nodes else None)
        ranks = [*diagnosis.culprits, *(r for r in ranks if r not in diagnosis.culprits)]
    return Fault(
        attempt=attempt, cycle=cycle.number, kind=kind.value, time=onset,
        reason=reasons[0] if reasons else f"{kind.value} in cycle {cycle.number}",
        culprit_rank=culprit[0], culprit_node=culprit[1], ranks=ranks, iteration=iteration,
        checkpoint_iteration=checkpoint_iteration,
        iterations_lost=iteration - checkpoint_iteration if iteration is not None and checkpoint_iteration is not None
        else None,
        detection_s=max(0.0, detected - onset),
        restart_s=max(0.0, resumed - detected) if resumed is not None else None,
        recompute_s=recompute, detected=detected, resumed=resumed,
        waiting=list(diagnosis.waiting) if diagnosis else [],
        diagnosis=diagnosis.headline if diagnosis else None,
        resumed_from=resume.source.value if resume else None, resume_step=resume.step if resume else None,
        recompute_without_snapshots_s=without if resume else None)


def _culprit(failures: Sequence[_Failure]) -> tuple[Optional[int], Optional[str]]:
    """(rank, host) to blame: the first crash, or the only hung rank; unknown when several ranks hung.

    In a collective hang every rank waits in its step and all of them miss their deadline
    within milliseconds of each other: the event log cannot tell the culprit from its peers.
    """
    crashes = [f for f in failures if f.kind is RestartKind.CRASH and f.rank is not None]
    if crashes:
        return crashes[0].rank, crashes[0].host
    ranks = {(f.rank, f.host) for f in failures}
    return ranks.pop() if len(ranks) == 1 else (None, None)


def _cycle_pids(records: Sequence[Event], cycle: int) -> set[int]:
    pids: set[int] = set()
    for r in records:
        if isinstance(r, CycleStart) and r.cycle == cycle:
            pids.update(r.workers.values())
    return pids
