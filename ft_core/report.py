"""Goodput report of a job from its ``ft_launcher`` event logs.

``ft_launcher report LOG_DIR`` (or ``python -m ft_core.report LOG_DIR``) reads every
``ft_events*.jsonl`` under the given directories (or the given files): one file per
node, one per requeue, or one file shared by several launchers all work, since every
record names its ``node`` (``host:pid`` of its launcher). It prints where the wall
time went: training, time lost to each fault (detection, restart, recomputation of
the work done since the last checkpoint) and the rest (start-up, rendezvous,
shutdown); the goodput (productive training time / wall time); the faults by kind,
culprit rank and node. ``--json`` prints the same as one JSON object with fixed keys;
``--plot FILE.png`` draws a timeline (needs matplotlib: ``pip install ft-suite[report]``).

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

The culprit of a fault is the rank that crashed first, or the culprit the launchers'
``diagnosis`` of a hang named (:mod:`ft_core.diagnosis`: stacks, iterations, who
stopped first), with the ranks that only waited in ``waiting``. Without a diagnosis
(older logs) it is the only rank that hung; when several ranks hung the event log
alone cannot tell the culprit from its peers: it is left unknown and ``ranks`` lists
them all.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Optional

from ft_core.events import EventName, RestartKind, read_events
from ft_core.jobdir import LAUNCHER_EVENTS_FILE

__all__ = ["Fault", "Report", "build_report", "find_event_files", "format_report", "load_records", "main",
           "plot_timeline", "short_summary"]

#: Worker exits that are the launcher's doing, not a fault (stop for a restart, forwarded signal).
_STOP_CAUSES_PREFIX = "launcher"
#: ``restart`` kinds that are faults (the records are read as dicts: their plain values).
_FAULT_KINDS = frozenset(kind.value for kind in RestartKind if kind.is_fault)


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
    kind: str


@dataclasses.dataclass
class _Launcher:
    node: str
    start: float
    end: float
    exit_code: Optional[int]
    reason: Optional[str]
    records: list[dict[str, Any]]

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

    @property
    def productive_time_s(self) -> float:
        return max(0.0, self.training_time_s - (self.recompute_s or 0.0))

    @property
    def goodput_pct(self) -> Optional[float]:
        return 100.0 * self.productive_time_s / self.wall_time_s if self.wall_time_s > 0 else None

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


def load_records(files: Sequence[str]) -> list[dict[str, Any]]:
    """Every valid record of ``files`` (``event``, ``time`` and ``node`` present), in time order."""
    records = []
    for path in files:
        for record in read_events(path)[0]:
            if isinstance(record, dict) and isinstance(record.get("event"), str) and \
                    isinstance(record.get("time"), (int, float)) and isinstance(record.get("node"), str):
                records.append(record)
    records.sort(key=lambda r: r["time"])
    return records


# -- analysis ---------------------------------------------------------------
def build_report(records: Sequence[dict[str, Any]], files: Sequence[str] = ()) -> Report:
    """Account the wall time of the job described by ``records`` (see the module docstring)."""
    launchers = _launchers(records)
    attempts = _attempts(launchers)
    has_progress = any(r["event"] == EventName.PROGRESS for r in records)
    checkpoints = sorted((r["time"], int(r["iteration"]), r["node"]) for r in records
                         if r["event"] == EventName.PROGRESS and isinstance(r.get("iteration"), int))
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
    return Report(
        files=list(files),
        run_ids=sorted({str(r["run_id"]) for r in records
                        if r["event"] == EventName.LAUNCHER_STARTED and r.get("run_id")}),
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
    )


def _launchers(records: Sequence[dict[str, Any]]) -> list[_Launcher]:
    by_node: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_node.setdefault(record["node"], []).append(record)
    launchers = []
    for node, own in by_node.items():
        started = [r["time"] for r in own if r["event"] == EventName.LAUNCHER_STARTED]
        exits = [r for r in own if r["event"] == EventName.EXIT]
        launchers.append(_Launcher(
            node=node, start=started[0] if started else own[0]["time"],
            end=exits[-1]["time"] if exits else own[-1]["time"],
            exit_code=exits[-1].get("exit_code") if exits else None,
            reason=exits[-1].get("reason") if exits else "no exit record (killed?)", records=own))
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
            if r["event"] == EventName.CYCLE_START and isinstance(r.get("cycle"), int):
                starts.setdefault(r["cycle"], []).append((r["time"], launcher.node))
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
                if r["time"] < start:
                    continue
                event = r["event"]
                if event == EventName.RANK_CONNECTED and r.get("restart_count") == number:
                    connected.append(r["time"])
                elif (event in (EventName.RESTART, EventName.WORKERS_SUCCEEDED) and r.get("cycle") == number) or \
                        (event in (EventName.SIGNAL, EventName.EXIT) and
                         (next_start is None or r["time"] < next_start)):
                    ends.append(r["time"])
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
    kinds: list[str] = []
    reasons: list[str] = []
    hung_pids: set[tuple[str, int]] = set()
    restarts: list[dict[str, Any]] = []
    controls: list[dict[str, Any]] = []
    diagnoses: list[tuple[dict[str, Any], _Launcher]] = []
    for launcher in group:
        pids = _cycle_pids(launcher.records, cycle.number)
        for r in launcher.records:
            event = r["event"]
            if event == EventName.HANG_DETECTED and (r.get("pid") in pids):
                elapsed = float(r.get("elapsed") or 0.0)
                failures.append(_Failure(r["time"] - elapsed, r["time"], r.get("rank"), launcher.host,
                                         r.get("iteration"), "hang"))
                hung_pids.add((launcher.node, r.get("pid", -1)))
                kinds.append("hang")
            elif event == EventName.WORKER_EXIT and r.get("cycle") == cycle.number and \
                    not str(r.get("cause", "")).startswith(_STOP_CAUSES_PREFIX) and \
                    (launcher.node, r.get("pid", -1)) not in hung_pids and r.get("cause") != "hang":
                failures.append(_Failure(r["time"], r["time"], r.get("rank"), launcher.host, None, "crash"))
                kinds.append("crash")
            elif event == EventName.MONITOR_DIED and cycle.start <= r["time"] <= cycle.end:
                failures.append(_Failure(r["time"], r["time"], None, launcher.host, None, "monitor"))
                kinds.append("monitor")
            elif event == EventName.RESTART and r.get("cycle") == cycle.number:
                restarts.append(r)
                reasons.append(str(r.get("reason", "")))
                if r.get("kind") in _FAULT_KINDS:
                    kinds.append(str(r["kind"]))
            elif event == EventName.WORKLOAD_CONTROL and cycle.start <= r["time"] <= cycle.end:
                controls.append(r)
            elif event == EventName.DIAGNOSIS and r.get("cycle") == cycle.number:
                diagnoses.append((r, launcher))
    if not kinds and any(r.get("kind") == "peer" for r in restarts) and not controls:
        # Another node ended the cycle for a fault whose records are not in these logs.
        kinds.append("peer")
    if not kinds:
        return None
    kind = "hang" if "hang" in kinds else kinds[0]
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
                   r["event"] == EventName.RESUME_CHOSEN and r.get("cycle") == following.number), None)
    without = recompute
    if resume is not None and resume.get("source") == "snapshot" and recompute is not None and \
            isinstance(resume.get("snapshot_time"), (int, float)):
        # Resumed from a snapshot: only the training after it (in this cycle) is recomputed.
        recompute = min(recompute, max(0.0, onset - max(resume["snapshot_time"], cycle.ready)))
        checkpoint_iteration = resume.get("step")
    culprit = _culprit(failures)
    diagnosis = diagnoses[0][0] if diagnoses else None  # the same record on every node
    if diagnosis is not None and diagnosis.get("culprits"):
        hosts = {launcher.node: launcher.host for launcher in group}
        nodes = diagnosis.get("culprit_nodes") or []
        culprit = (diagnosis["culprits"][0], hosts.get(nodes[0], nodes[0].rsplit(":", 1)[0]) if nodes else None)
        ranks = [*diagnosis["culprits"], *(r for r in ranks if r not in diagnosis["culprits"])]
    return Fault(
        attempt=attempt, cycle=cycle.number, kind=kind, time=onset,
        reason=reasons[0] if reasons else f"{kind} in cycle {cycle.number}",
        culprit_rank=culprit[0], culprit_node=culprit[1], ranks=ranks, iteration=iteration,
        checkpoint_iteration=checkpoint_iteration,
        iterations_lost=iteration - checkpoint_iteration if iteration is not None and checkpoint_iteration is not None
        else None,
        detection_s=max(0.0, detected - onset),
        restart_s=max(0.0, resumed - detected) if resumed is not None else None,
        recompute_s=recompute, detected=detected, resumed=resumed,
        waiting=list(diagnosis.get("waiting") or []) if diagnosis else [],
        diagnosis=diagnosis.get("headline") if diagnosis else None,
        resumed_from=resume.get("source") if resume else None, resume_step=resume.get("step") if resume else None,
        recompute_without_snapshots_s=without if resume else None)


def _culprit(failures: Sequence[_Failure]) -> tuple[Optional[int], Optional[str]]:
    """(rank, host) to blame: the first crash, or the only hung rank; unknown when several ranks hung.

    In a collective hang every rank waits in its step and all of them miss their deadline
    within milliseconds of each other: the event log cannot tell the culprit from its peers.
    """
    crashes = [f for f in failures if f.kind == "crash" and f.rank is not None]
    if crashes:
        return crashes[0].rank, crashes[0].host
    ranks = {(f.rank, f.host) for f in failures}
    return ranks.pop() if len(ranks) == 1 else (None, None)


def _cycle_pids(records: Sequence[dict[str, Any]], cycle: int) -> set[int]:
    pids: set[int] = set()
    for r in records:
        if r["event"] == EventName.CYCLE_START and r.get("cycle") == cycle and isinstance(r.get("workers"), dict):
            pids.update(int(pid) for pid in r["workers"].values())
    return pids


# -- text -------------------------------------------------------------------
def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if value >= 3600:
        return f"{value / 3600:.2f} h"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def short_summary(report: Report) -> list[str]:
    """Two lines for the launcher's exit summary."""
    goodput = f"{report.goodput_pct:.1f} %" if report.goodput_pct is not None else "n/a"
    return [
        f"goodput    : {goodput} (training {_seconds(report.productive_time_s)} of {_seconds(report.wall_time_s)}"
        f" wall time)",
        f"fault cost : detection {_seconds(report.detection_s)}, restart {_seconds(report.restart_s)}, "
        f"recomputation {_seconds(report.recompute_s)}",
    ]


def format_report(report: Report) -> str:
    """The human report (see the module docstring)."""
    lines = [f"goodput report: {len(report.files)} event log(s), {report.attempts} attempt(s), "
             f"{len(report.nodes)} node(s), {report.cycles} cycle(s)"
             + (f", run {', '.join(report.run_ids)}" if report.run_ids else "")]
    goodput = f"{report.goodput_pct:.1f} %" if report.goodput_pct is not None else "n/a"
    lost = report.detection_s + report.restart_s + (report.recompute_s or 0.0)
    lines += [
        f"  wall time      : {_seconds(report.wall_time_s)}",
        f"  training       : {_seconds(report.training_time_s)} (productive {_seconds(report.productive_time_s)})",
        f"  goodput        : {goodput}",
        f"  lost to faults : {_seconds(lost)} (detection {_seconds(report.detection_s)}, restart "
        f"{_seconds(report.restart_s)}, recomputation {_seconds(report.recompute_s)})",
        f"  other          : {_seconds(report.other_s)} (start-up, rendezvous, shutdown)",
    ]
    by_kind = ", ".join(f"{n} {k}" for k, n in report.faults_by("kind").items()) or "none"
    lines.append(f"  faults         : {len(report.faults)} ({by_kind})")
    if report.faults:
        lines.append("  by rank        : " + ", ".join(f"rank {k}: {n}" for k, n in report.faults_by("culprit_rank").items()))
        lines.append("  by node        : " + ", ".join(f"{k}: {n}" for k, n in report.faults_by("culprit_node").items()))
        t0 = report.attempt_spans[0][0] if report.attempt_spans else 0.0
        lines.append("  #  attempt cycle kind     at        culprit             iteration ckpt  "
                     "detection restart   recompute")
        for i, f in enumerate(report.faults, 1):
            culprit = f"rank {f.culprit_rank}" if f.culprit_rank is not None else \
                f"ranks {','.join(map(str, f.ranks))}?"
            culprit += f" @ {f.culprit_node}" if f.culprit_node else ""
            lines.append(
                f"  {i:<2} {f.attempt:<7} {f.cycle:<5} {f.kind:<8} {'+' + _seconds(f.time - t0):<9} {culprit:<19} "
                f"{_opt(f.iteration):<9} {_opt(f.checkpoint_iteration):<5} {_seconds(f.detection_s):<9} "
                f"{_seconds(f.restart_s):<9} {_seconds(f.recompute_s)}")
            if f.diagnosis:
                lines.append(f"     diagnosis: {f.diagnosis}")
            if f.resumed_from == "snapshot":
                lines.append(f"     resumed from the snapshot of step {f.resume_step}: recomputation "
                             f"{_seconds(f.recompute_s)} ({_seconds(f.recompute_without_snapshots_s)} from disk)")
    codes = sorted({str(code) for code in report.exit_codes})
    lines.append(f"  exit code(s)   : {', '.join(codes) or 'n/a'}"
                 + (f" ({report.exit_reasons[-1]})" if report.exit_reasons else ""))
    return "\n".join(lines)


def _opt(value: Optional[int]) -> str:
    return "-" if value is None else str(value)


# -- timeline ---------------------------------------------------------------
def plot_timeline(report: Report, path: str) -> str:
    """Draw the job's timeline to ``path`` (PNG); one row per node. Needs matplotlib."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'ft-suite[report]'") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = _rows(report.launchers)
    axis = _TimeAxis(report.attempt_spans)
    colors = {"training": "#2e86c1", "startup": "#aed6f1", "recompute": "#f5b041", "detection": "#e74c3c",
              "restart": "#8e44ad", "alive": "#d5d8dc", "checkpoint": "#1e8449", "fault": "#922b21"}
    fig, ax = plt.subplots(figsize=(13, 1.9 + 0.75 * len(rows)), dpi=130)
    row_of = {node: i for i, (_, nodes) in enumerate(rows) for node in nodes}

    def bar(y: int, t0: float, t1: float, color: str, **style: Any) -> None:
        if t1 > t0:
            ax.barh(y, axis(t1) - axis(t0), left=axis(t0), height=style.pop("height", 0.46), color=color,
                    **style)

    def rows_of(attempt: int, number: int) -> set[int]:
        return {row_of[n] for c in report.cycle_spans if (c.attempt, c.number) == (attempt, number)
                for n in c.nodes if n in row_of}

    for node, start, end in report.launchers:
        bar(row_of[node], start, end, colors["alive"], height=0.12, zorder=1)
    for cycle in report.cycle_spans:
        for y in rows_of(cycle.attempt, cycle.number):
            bar(y, cycle.start, cycle.ready, colors["startup"], zorder=2)
            bar(y, cycle.ready, cycle.end, colors["training"], zorder=2)
            if axis(cycle.end) - axis(cycle.ready) > axis.total * 0.05:
                ax.text(axis(cycle.ready) + axis.total * 0.004, y, f"cycle {cycle.number}", ha="left",
                        va="center", fontsize=8, color="white", fontweight="bold", zorder=5,
                        bbox={"boxstyle": "round,pad=0.2", "fc": colors["training"], "ec": "none"})
    for fault in report.faults:
        hit = rows_of(fault.attempt, fault.cycle)
        for y in hit:
            if fault.recompute_s:
                bar(y, fault.time - fault.recompute_s, fault.time, colors["recompute"], hatch="////",
                    edgecolor="#b9770e", linewidth=0, zorder=3)
            bar(y, fault.time, fault.detected, colors["detection"], zorder=3)
            if fault.resumed is not None:
                bar(y, fault.detected, fault.resumed, colors["restart"], zorder=3)
        y_top = min(hit) if hit else 0
        ax.plot([axis(fault.detected)], [y_top - 0.33], marker="v", color=colors["fault"], markersize=8, zorder=6)
        label = fault.kind + (f" · rank {fault.culprit_rank}" if fault.culprit_rank is not None else "")
        label += f" · iter {fault.iteration}" if fault.iteration is not None else ""
        ax.annotate(label, (axis(fault.detected), y_top - 0.42), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8, color=colors["fault"], fontweight="bold", zorder=6)
    for time, _iteration, node in report.checkpoints:
        if node in row_of:
            ax.plot([axis(time)], [row_of[node] + 0.3], marker="^", color=colors["checkpoint"], markersize=4,
                    zorder=4)
    for boundary, queued in axis.breaks():
        ax.axvline(boundary, color="#7f8c8d", linestyle=":", zorder=0)
        ax.text(boundary, -0.95, f" requeue (+{_seconds(queued)} queued)", fontsize=7, color="#566573",
                ha="left", va="top")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows])
    ax.set_ylim(len(rows) - 0.4, -1.0)
    ax.set_xlim(0, axis.total * 1.01 + 1e-9)
    ax.set_xlabel(f"time since the job started ({axis.unit}; queue time between requeues cut out)"
                  if axis.breaks() else f"time since the job started ({axis.unit})")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / axis.scale:g}"))
    ax.grid(axis="x", color="#eaecee", zorder=0)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    goodput = f"{report.goodput_pct:.1f} %" if report.goodput_pct is not None else "n/a"
    lost = report.detection_s + report.restart_s + (report.recompute_s or 0.0)
    title = (f"goodput {goodput}   ·   {len(report.faults)} fault(s), {_seconds(lost)} lost   ·   "
             f"wall time {_seconds(report.wall_time_s)}")
    ax.set_title(title, loc="left", fontsize=11, fontweight="bold")
    if report.run_ids:
        ax.set_title(f"run {', '.join(report.run_ids)}", loc="right", fontsize=8, color="#566573")
    handles = [Patch(color=colors["training"], label="training"),
               Patch(color=colors["startup"], label="worker start-up"),
               Patch(facecolor=colors["recompute"], edgecolor="#b9770e", hatch="////",
                     label="work lost (after last checkpoint)"),
               Patch(color=colors["detection"], label="fault → detection"),
               Patch(color=colors["restart"], label="restart"),
               Patch(color=colors["alive"], label="launcher"),
               Line2D([], [], color=colors["checkpoint"], marker="^", linestyle="", markersize=5, label="checkpoint")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.3 / (1.9 + 0.75 * len(rows)), 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def _rows(launchers: Sequence[tuple[str, float, float]]) -> list[tuple[str, list[str]]]:
    """One row per host; launchers of one host that overlap in time (several on one machine) get their own."""
    rows: list[tuple[str, list[str], float]] = []
    for node, start, end in sorted(launchers, key=lambda lc: lc[1]):
        host = node.rsplit(":", 1)[0]
        for i, (label, nodes, row_end) in enumerate(rows):
            if label.split(" #")[0] == host and start >= row_end:
                rows[i] = (label, [*nodes, node], end)
                break
        else:
            same = sum(1 for label, _, _ in rows if label.split(" #")[0] == host)
            rows.append((host if same == 0 else f"{host} #{same + 1}", [node], end))
    return [(label, nodes) for label, nodes, _ in rows]


class _TimeAxis:
    """Seconds since the start, with the queue time between attempts cut out (shown as a gap)."""

    def __init__(self, spans: Sequence[tuple[float, float]]) -> None:
        self.spans = list(spans) or [(0.0, 0.0)]
        active = sum(end - start for start, end in self.spans)
        self.gap = max(active * 0.03, 1e-3) if len(self.spans) > 1 else 0.0
        self.total = active + self.gap * (len(self.spans) - 1)
        self.scale, self.unit = (3600.0, "h") if self.total >= 3 * 3600 else (60.0, "min") if self.total >= 300 \
            else (1.0, "s")

    def __call__(self, t: float) -> float:
        offset = 0.0
        for i, (start, end) in enumerate(self.spans):
            following = self.spans[i + 1][0] if i + 1 < len(self.spans) else float("inf")
            if t < following:
                return offset + max(0.0, t - start)
            offset += end - start + self.gap
        return offset

    def breaks(self) -> list[tuple[float, float]]:
        """(x, queued seconds) of each requeue boundary."""
        out, offset = [], 0.0
        for (start, end), (next_start, _) in zip(self.spans, self.spans[1:]):
            offset += end - start
            out.append((offset + self.gap / 2, next_start - end))
            offset += self.gap
        return out


# -- command line -----------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``ft_launcher report`` / ``python -m ft_core.report``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="ft_launcher report", description="Goodput report of a job from its ft_launcher event logs.")
    parser.add_argument("paths", nargs="+", metavar="LOG_DIR",
                        help=f"log directories (searched for {LAUNCHER_EVENTS_FILE.replace('.', '*.', 1)}) or event files")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object (fixed keys)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the timeline to this file (needs matplotlib)")
    args = parser.parse_args(argv)
    try:
        files = find_event_files(args.paths)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    if not files:
        parser.error(f"no {LAUNCHER_EVENTS_FILE} in {', '.join(args.paths)}")
    report = build_report(load_records(files), files)
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    if args.plot:
        try:
            path = plot_timeline(report, args.plot)
        except RuntimeError as exc:
            print(f"ft_launcher report: {exc}", file=sys.stderr)
            return 1
        if not args.json:
            print(f"  timeline       : {os.path.abspath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
