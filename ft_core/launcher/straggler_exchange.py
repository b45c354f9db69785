"""Job-wide straggler reports: the launchers gather their monitors' phase medians through the job store.

Each node's monitor closes a report round every ``straggler_report_interval``
seconds, wall-clock aligned (round ``k`` ends at ``k * interval``), and emits
its ranks' window medians (:class:`~ft_core.events.PhaseMedians`). Then:

1. every launcher publishes its node's medians under the job-store key
   ``straggler/<group rank>`` (overwritten each round: the job store does not grow);
2. the launcher of group rank 0 -- the aggregator -- reads every node's entry
   half an interval after the round ended, keeps those of the round, and
   judges them with one :class:`~ft_core.straggler_scoring.StragglerJudge` per cycle;
   the scores and the stragglers go to the key ``straggler/report``;
3. every launcher reads each new report once and acts on it identically: a
   ``straggler`` event and one log line per straggler, and the action.

A node whose medians arrive more than half an interval late is left out of
that round (its ranks neither count for nor break a run). Nothing is read or
written until this node's monitor reported phases in the cycle: a job that
marks no phase costs no job store traffic.

The actions never stop a slow but healthy job:

* ``restart`` restarts for a node at most once per job store: when the same
  node is a straggler again after the restart it caused (the restart brought no
  faster node), the aggregator reports it instead (:func:`straggler_action_for`;
  the nodes restarted for are kept under the key ``straggler/restarted``). A
  straggler restart is not a fault: it spends no restart and does not count
  for the no-progress rule.
* ``exclude-node`` excludes the node only when the job can go on without it
  (:func:`exclusion_blocker`); otherwise the node reports it, with one warning
  naming why.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Optional

import msgspec

from ft_core.events import PhaseMedians, Straggler
from ft_core.launcher.rendezvous.job_store import JobStore
from ft_core.straggler_scoring import (
    DEFAULT_MIN_PHASE_SECONDS,
    PhaseMedian,
    PhaseScore,
    StragglerAction,
    StragglerJudge,
)

__all__ = ["REPORT_KEY", "RESTARTED_KEY", "NodeMedians", "StragglerDetector", "StragglerRound", "exclusion_blocker",
           "straggler_action_for"]

log = logging.getLogger("ft_core.launcher")

REPORT_KEY = "straggler/report"
#: The nodes a straggler restart was made for (a JSON list of ``host:pid``), written by the aggregator.
RESTARTED_KEY = "straggler/restarted"
#: Non-aggregators look for a new report at most this often (seconds; less with a shorter interval).
_POLL_INTERVAL = 1.0


def _medians_key(group_rank: int) -> str:
    return f"straggler/{group_rank}"


def straggler_action_for(action: StragglerAction, node: str, restarted: set[str]) -> StragglerAction:
    """The action taken for a straggler on ``node``: ``restart`` once per node (``restarted``: the nodes
    restarted for already), then ``report``; any other action as configured."""
    if action is StragglerAction.RESTART and node in restarted:
        return StragglerAction.REPORT
    return action


def exclusion_blocker(*, dynamic: bool, hosts_store: bool, nodes: int, min_nodes: int, spares: int) -> Optional[str]:
    """Why excluding a straggler's node would end the job (None: the job goes on without it).

    Args:
        dynamic: the rendezvous can replace a node (c10d, etcd-v2; not static).
        hosts_store: the node serves the c10d rendezvous store, the job's shared state.
        nodes: the nodes of the current round; min_nodes: the job's minimum (``--nnodes``).
        spares: hot spares waiting to join.
    """
    if not dynamic:
        return "the static rendezvous cannot go on without a node"
    if hosts_store:
        return "the node hosts the c10d rendezvous store (--rdzv-endpoint): the job's state would leave with it"
    if nodes - 1 < min_nodes and spares == 0:
        return (f"the job needs {min_nodes} node(s) (--nnodes), has {nodes}, and no hot spare waits to take "
                "the node's place")
    return None


class NodeMedians(msgspec.Struct, frozen=True):
    """One node's entry in the job store: its ranks' medians for one round."""

    cycle: int
    round: int
    node: str
    medians: list[PhaseMedian]


class StragglerRound(msgspec.Struct, frozen=True):
    """The aggregator's report of one round (key ``straggler/report``)."""

    cycle: int
    round: int
    scores: list[PhaseScore]
    stragglers: list[Straggler]


@dataclasses.dataclass
class _CycleState:
    cycle: int
    judge: StragglerJudge
    active: bool = False  # this node's monitor reported phases in this cycle
    judged_round: Optional[int] = None  # aggregator: the last round judged
    seen_round: Optional[int] = None  # the last report acted on
    next_poll: float = 0.0


class StragglerDetector:
    """One launcher's part of straggler detection; see the module docstring.

    Args:
        interval, threshold, consecutive, action: the ``straggler_*`` config keys.
        node: this launcher (``host:pid``), named as ``rank_node`` in the events of its ranks.
        job_store: returns the job store (None until the first rendezvous of a static job).
        on_round: called with every report read (all scores of the round), e.g. by the metrics endpoint.
    """

    def __init__(self, interval: float, threshold: float, consecutive: int, action: StragglerAction, node: str,
                 job_store: Callable[[], Optional[JobStore]],
                 on_round: Optional[Callable[[StragglerRound], None]] = None,
                 min_phase_seconds: float = DEFAULT_MIN_PHASE_SECONDS) -> None:
        self.interval = interval
        self.threshold = threshold
        self.consecutive = consecutive
        self.min_phase_seconds = min_phase_seconds
        self.action = action
        self.node = node
        self._job_store = job_store
        self._on_round = on_round
        self._state = _CycleState(-1, StragglerJudge(threshold, consecutive, min_phase_seconds))

    def _for_cycle(self, cycle: int) -> _CycleState:
        if self._state.cycle != cycle:
            self._state = _CycleState(cycle, StragglerJudge(self.threshold, self.consecutive, self.min_phase_seconds))
        return self._state

    def publish(self, record: PhaseMedians, cycle: int, group_rank: int) -> None:
        """Put this node's medians of one round (from its monitor) in the job store."""
        job_store = self._job_store()
        if job_store is None or group_rank < 0:
            return
        self._for_cycle(cycle).active = True
        entry = NodeMedians(cycle=cycle, round=record.round, node=self.node, medians=record.medians)
        job_store.set(_medians_key(group_rank), msgspec.json.encode(entry).decode())

    def poll(self, cycle: int, group_rank: int, group_world_size: int, wall: Optional[float] = None,
             force: bool = False) -> list[Straggler]:
        """Judge a round if this node aggregates and one is due; return the stragglers of a new report.

        A non-aggregator reads the report at most every :data:`_POLL_INTERVAL`, unless ``force`` (its cycle is
        ending on another node's decision, which the report may have made: it is read now and logged here too).
        """
        state = self._for_cycle(cycle)
        job_store = self._job_store()
        if not state.active or job_store is None:
            return []
        wall = time.time() if wall is None else wall
        if group_rank == 0:
            due = math.floor((wall - self.interval / 2) / self.interval)
            if state.judged_round is None or due > state.judged_round:
                state.judged_round = due
                self._judge(job_store, state, due, group_world_size)
        if wall < state.next_poll and not force:
            return []
        state.next_poll = wall + min(_POLL_INTERVAL, self.interval / 4)
        raw = job_store.get(REPORT_KEY)
        if raw is None:
            return []
        try:
            report = msgspec.json.decode(raw, type=StragglerRound)
        except msgspec.DecodeError as exc:
            log.warning("ignoring an unreadable straggler report in the job store: %s", exc)
            return []
        if report.cycle != cycle or (state.seen_round is not None and report.round <= state.seen_round):
            return []
        state.seen_round = report.round
        if self._on_round is not None:
            self._on_round(report)
        for straggler in report.stragglers:
            log.warning("%s; action: %s", straggler.describe(), straggler.action.value)
        return list(report.stragglers)

    def _judge(self, job_store: JobStore, state: _CycleState, round_: int, group_world_size: int) -> None:
        medians: list[PhaseMedian] = []
        nodes: dict[int, str] = {}
        for group_rank in range(group_world_size):
            raw = job_store.get(_medians_key(group_rank))
            if raw is None:
                continue
            try:
                entry = msgspec.json.decode(raw, type=NodeMedians)
            except msgspec.DecodeError as exc:
                log.warning("ignoring unreadable phase medians of group rank %d: %s", group_rank, exc)
                continue
            if entry.cycle == state.cycle and entry.round == round_:
                medians.extend(entry.medians)
                nodes.update((m.rank, entry.node) for m in entry.medians)
        if not medians:
            return
        result = state.judge.judge(medians)
        restarted = (self._restarted(job_store) if result.stragglers and self.action is StragglerAction.RESTART
                     else set())
        stragglers = []
        for s in result.stragglers:
            node = nodes[s.rank]
            action = straggler_action_for(self.action, node, restarted)
            if action is not self.action:
                log.warning("rank %d on %s is a straggler again after the restart made for it (no faster node "
                            "came): straggler_action falls back to report for that node", s.rank, node)
            elif action is StragglerAction.RESTART:
                restarted.add(node)
                job_store.set(RESTARTED_KEY, msgspec.json.encode(sorted(restarted)).decode())
            stragglers.append(Straggler(
                cycle=state.cycle, rank=s.rank, rank_node=node, phase=s.phase, relative_score=round(s.relative, 4),
                individual_score=round(s.individual, 4), median=s.median, window=s.samples,
                threshold=self.threshold, consecutive=self.consecutive, action=action))
        report = StragglerRound(cycle=state.cycle, round=round_, scores=result.scores, stragglers=stragglers)
        job_store.set(REPORT_KEY, msgspec.json.encode(report).decode())


    @staticmethod
    def _restarted(job_store: JobStore) -> set[str]:
        raw = job_store.get(RESTARTED_KEY)
        if raw is None:
            return set()
        try:
            return set(msgspec.json.decode(raw, type=list[str]))
        except msgspec.DecodeError as exc:
            log.warning("ignoring an unreadable %s in the job store: %s", RESTARTED_KEY, exc)
            return set()
