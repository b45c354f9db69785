"""Job-wide state shared by the launchers of all nodes through the job store.

Torch's elastic agent keeps its restart budget per node and hands workers a
store that outlives a restart (the rendezvous store). This module adds what fault tolerance needs on
top, in the job store (:mod:`ft_core.launcher.rendezvous.job_store`: the c10d rendezvous store, or the
etcd cluster with ``--rdzv-backend=etcd-v3`` or ``etcd-v2``):

* **Cycles.** After each rendezvous the node with group rank 0 takes the next
  job-wide cycle number (``TORCHELASTIC_RESTART_COUNT`` for the workers) and
  starts the *workers' store* of that cycle, a brand-new ``TCPStore`` server, on a
  port the OS picks while the previous cycle's server is still bound. Workers
  therefore never see a previous cycle's keys, nor a port that another process
  may have taken. The address travels in the rendezvous round's own key space.
  The workers' store lives in one launcher for one cycle only: losing its node
  ends the cycle (its ranks are gone anyway), and the next cycle's group rank
  0, on a surviving node, serves a new one.
* **Decisions.** A cycle ends at most once. The job's counters (restarts
  spent, faulty cycles without progress) and the decision that ended the last
  cycle are **one record** (key ``state``), changed only by compare-and-set:
  the first node to report a fault decides (restart, or stop with an exit
  code) and the counters move with the decision in the same atomic write, so
  the budget is spent once per cycle whatever the number of nodes that saw the
  fault, and a launcher that dies right after deciding leaves nothing half
  written. :func:`decide_cycle_end` is the policy.
* **Stop.** The same record carries the job-wide stop (budget spent, no
  progress, shutdown requested): every launcher stops its workers and exits
  with the same code. A launcher learns about both with one read per pass.
* **Progress.** The highest checkpointed iteration any node has seen
  (key ``progress``, an atomic max built on compare-and-set).
* **Finished ranks.** Per cycle, how many nodes saw every one of their ranks
  report training complete in a graceful goodbye (key ``finished/<cycle>``,
  a counter): the job's training is complete when it reaches the number of
  nodes (see ``FtElasticAgent``).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable
from typing import Any, Optional

import msgspec
import torch.distributed as dist

from ft_core.fault_policy import FaultAction, FaultPolicy, Fingerprint, decide_fault
from ft_core.launcher.checkpointed_iteration import made_progress
from ft_core.launcher.decision_notice import DecisionNotice
from ft_core.launcher.rendezvous.job_store import JobStore, job_store_on
from ft_core.utils.deadline import wait_until

__all__ = [
    "CoordinationError",
    "CycleInfo",
    "Decision",
    "DecisionAction",
    "JobCoordinator",
    "JobState",
    "RestartPolicy",
    "decide_cycle_end",
]

log = logging.getLogger("ft_core.launcher")

#: Job store keys.
STATE_KEY = "state"
CYCLES_KEY = "cycles"
PROGRESS_KEY = "progress"
SPARES_RELEASED_KEY = "spares_released"
#: Prefix of the per-cycle count of nodes whose ranks all reported training complete.
FINISHED_NODES_KEY = "finished/"


class CoordinationError(RuntimeError):
    """A job store value that is not what a launcher of this version writes."""


class DecisionAction(str, enum.Enum):
    """How a cycle ends: the workers of every node restart, or the job stops."""

    RESTART = "restart"
    STOP = "stop"


@dataclasses.dataclass(frozen=True)
class CycleInfo:
    """What every node of the job agrees on for one restart cycle."""

    cycle: int
    restarts: int
    #: Where the workers' store of the cycle listens (``MASTER_ADDR``, ``MASTER_PORT`` of its workers).
    worker_store_addr: str
    worker_store_port: int


@dataclasses.dataclass(frozen=True)
class Decision:
    """How a cycle ends (restart) or the job ends (stop), decided once for the whole job."""

    action: DecisionAction
    reason: str
    exit_code: int = 0
    #: Restarts spent by the job once this decision is in force.
    restarts: int = 0
    #: The launcher that decided (``host:pid``).
    node: str = ""
    #: A checkpoint the fault policy found bad (rule 1): every node marks it before the restart, so the
    #: integrations resume from the newest older good one.
    mark_bad: Optional[str] = None
    #: The fault policy's verdict on the fault that ended the cycle (None: not a fault). A restart it
    #: says helps is :attr:`~FaultAction.RESTART`, whatever the budget then decided (``action``).
    fault_action: Optional[FaultAction] = None
    #: The node the fault policy suspects (rule 3): with :attr:`~FaultAction.EXCLUDE_NODE` it leaves the
    #: job (a hot spare takes its place) while the others restart; otherwise the cause names it.
    suspect_node: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class JobState:
    """The job-wide record (key ``state``): counters, the last cycle's end and the stop, changed together."""

    #: Restarts spent (faults that were followed by a restart).
    restarts: int = 0
    #: Consecutive faulty cycles that ended without a newer checkpoint.
    no_progress: int = 0
    #: The job's latest checkpointed iteration when the last decision was taken (-1: none).
    progress_mark: int = -1
    #: The last cycle whose end was decided (-1: none yet), and how it ended.
    cycle: int = -1
    decision: Optional[Decision] = None
    #: The job-wide stop; once set it never changes.
    stop: Optional[Decision] = None
    #: The fingerprints of the job's last faults, oldest first (at most :data:`FINGERPRINTS_KEPT`).
    fingerprints: tuple[Fingerprint, ...] = ()
    #: The checkpoints the fault policy marked bad (each only once).
    marked_bad: tuple[str, ...] = ()

    def encode(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def decode(cls, raw: str) -> JobState:
        return _decode(STATE_KEY, raw, cls)


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """The job's limits: the restart budget and the no-progress rule."""

    max_restarts: int
    #: Stop after this many consecutive faulty cycles without a newer checkpoint (0 disables).
    max_no_progress_cycles: int
    no_restart_exit_code: int
    #: A cycle made progress when the checkpointed iteration grew by at least this much (NVRx's rule).
    min_progress_iterations: int = 1
    #: The rules on fault fingerprints (:mod:`ft_core.fault_policy`): stop a deterministic fault.
    faults: FaultPolicy = FaultPolicy()


#: Fingerprints the job state keeps: enough for every rule of the fault policy.
FINGERPRINTS_KEPT = 8


def decide_cycle_end(state: JobState, cycle: int, reason: str, *, fault: bool, progress_active: bool,
                     best_progress: int, policy: RestartPolicy, node: str,
                     fingerprint: Optional[Fingerprint] = None, spare_waiting: bool = False,
                     only_node: bool = False) -> JobState:
    """The job state after ``cycle`` ended for ``reason`` (a fault, or a membership change).

    A fault spends one restart of the job's budget and, when progress is
    tracked, counts as a cycle without progress unless the checkpointed
    iteration (``best_progress``) grew by ``min_progress_iterations`` since the
    previous decision (:func:`~ft_core.launcher.checkpointed_iteration.made_progress`). A stop spends no
    restart. Progress counts as tracked once any checkpoint was seen job-wide. A fault's
    ``fingerprint`` joins the job's history, and the fault policy's verdict
    (:func:`ft_core.fault_policy.decide_fault`) is carried out: a deterministic fault stops the job
    with the do-not-requeue code, a bad checkpoint is marked, a suspect node leaves the job when
    ``spare_waiting`` (that node can be replaced by a hot spare: only the suspect node itself can
    tell) or is named in the cause (never in a job of ``only_node``). Every fault's decision says
    the verdict (``fault_action``).
    """
    restarts = state.restarts + int(fault)
    progressed = made_progress(best_progress, state.progress_mark, policy.min_progress_iterations)
    no_progress = 0 if progressed else state.no_progress + int(fault)
    progress_active = progress_active or best_progress >= 0
    fingerprints = state.fingerprints
    verdict = None
    if fault and fingerprint is not None:
        fingerprints = (*fingerprints, dataclasses.replace(fingerprint, new_checkpoint=progressed))[-FINGERPRINTS_KEPT:]
        verdict = decide_fault(fingerprints, policy.faults, spare_waiting=spare_waiting,
                               marked_bad=frozenset(state.marked_bad), only_node=only_node)
    marked_bad = state.marked_bad
    if verdict is not None and verdict.action is FaultAction.STOP:
        decision = Decision(DecisionAction.STOP, verdict.reason, exit_code=policy.no_restart_exit_code,
                            restarts=state.restarts, node=node)
    elif (verdict is not None and verdict.action is FaultAction.MARK_CHECKPOINT_BAD and verdict.checkpoint is not None
          and restarts <= policy.max_restarts):
        # A restart from an older checkpoint is a new chance, not a repeat: the no-progress count starts over.
        decision = Decision(DecisionAction.RESTART, f"{reason}; checkpoint marked bad: {verdict.reason}",
                            restarts=restarts, node=node, mark_bad=verdict.checkpoint)
        marked_bad, no_progress = (*marked_bad, verdict.checkpoint), 0
    elif verdict is not None and verdict.action is FaultAction.EXCLUDE_NODE and restarts <= policy.max_restarts:
        # A spare in the suspect's place is a new chance too.
        decision = Decision(DecisionAction.RESTART, f"{reason}; suspect node: {verdict.reason}", restarts=restarts,
                            node=node)
        no_progress = 0
    elif fault and progress_active and 0 < policy.max_no_progress_cycles <= no_progress:
        latest = "none yet" if best_progress < 0 else str(best_progress)
        decision = Decision(DecisionAction.STOP,
                            f"no progress: {no_progress} consecutive faulty cycles without a newer checkpoint "
                            f"(latest checkpointed iteration: {latest}, progress means +{policy.min_progress_iterations})",
                            exit_code=policy.no_restart_exit_code, restarts=state.restarts, node=node)
    elif restarts > policy.max_restarts:
        decision = Decision(DecisionAction.STOP, f"restart budget spent: {policy.max_restarts} restart(s) used",
                            exit_code=1, restarts=state.restarts, node=node)
    else:
        suspect = f"; suspect node: {verdict.reason}" if verdict is not None and verdict.node is not None else ""
        decision = Decision(DecisionAction.RESTART, reason + suspect, restarts=restarts, node=node)
    if fault:
        decision = dataclasses.replace(decision, fault_action=verdict.action if verdict else FaultAction.RESTART,
                                       suspect_node=verdict.node if verdict else None)
    return JobState(restarts=decision.restarts, no_progress=no_progress, progress_mark=best_progress,
                    cycle=cycle, decision=decision, stop=decision if decision.action is DecisionAction.STOP else None,
                    fingerprints=fingerprints, marked_bad=marked_bad)


class JobCoordinator:
    """The launcher's view of the job-wide state; see the module docstring.

    ``job_store`` is the job store when the rendezvous handler has one from the
    start (c10d, etcd-v3, etcd-v2: see :func:`~ft_core.launcher.rendezvous.job_store.open_job_store`);
    otherwise (static) the first rendezvous round provides it.
    """

    def __init__(self, run_id: str, node: str, max_restarts: int, max_no_progress_cycles: int,
                 no_restart_exit_code: int, job_store: Optional[JobStore] = None,
                 min_progress_iterations: int = 1, faults: FaultPolicy = FaultPolicy()) -> None:
        self.run_id = run_id
        self.node = node
        self.policy = RestartPolicy(max_restarts, max_no_progress_cycles, no_restart_exit_code,
                                    min_progress_iterations, faults)
        self._job = job_store
        #: Wakes this launcher when another one decides the end of the current cycle (:mod:`.decision_notice`).
        self._notice = DecisionNotice.on(job_store)
        self._rendezvous_count = 0
        # Held so the server lives exactly as long as the cycle it serves.
        self._worker_store_server: Optional[dist.TCPStore] = None

    @property
    def job_store(self) -> Optional[JobStore]:
        """The job store (None until the first rendezvous of a static job): other job-wide state lives there too."""
        return self._job

    # -- job store plumbing------------------------------------------------
    def _state(self) -> JobState:
        assert self._job is not None
        raw = self._job.get(STATE_KEY)
        return JobState.decode(raw) if raw is not None else JobState()

    def _update(self, change: Callable[[JobState], Optional[JobState]]) -> JobState:
        """Apply ``change`` to the job state atomically; returns the state in force afterwards.

        ``change`` returns None when the state already says what it wanted (e.g.
        another node decided first); it is called again whenever another node
        changed the state in between.
        """
        assert self._job is not None
        raw = self._job.get(STATE_KEY)
        while True:
            state = JobState.decode(raw) if raw is not None else JobState()
            wanted = change(state)
            if wanted is None:
                return state
            encoded = wanted.encode()
            raw = self._job.compare_set(STATE_KEY, raw, encoded)
            if raw == encoded:
                return wanted

    def _get_int(self, key: str, default: int) -> int:
        assert self._job is not None
        raw = self._job.get(key)
        return default if raw is None else _decode(key, raw, int)

    # -- cycles -----------------------------------------------------------
    def begin_cycle(self, rdzv_store: dist.Store, group_rank: int, master_addr: str, static: bool) -> CycleInfo:
        """Agree on the cycle number and the workers' fresh store (call right after each rendezvous).

        ``rdzv_store`` is the store the rendezvous returned: for c10d/etcd it
        is already private to the rendezvous round; the static backend reuses
        one key space, so a per-rendezvous prefix is added (static nodes always
        rendezvous together, so their counts agree).
        """
        if self._job is None:
            base = rdzv_store.underlying_store if isinstance(rdzv_store, dist.PrefixStore) else rdzv_store
            self._job = job_store_on(base, self.run_id)
            self._notice = DecisionNotice.on(self._job)
        namespace = f"ft_launcher/rdzv{self._rendezvous_count}" if static else "ft_launcher"
        self._rendezvous_count += 1
        round_keys = dist.PrefixStore(namespace, rdzv_store)  # where the cycle's info is published
        if group_rank == 0:
            # Bind the new server before releasing the old one: the OS cannot give the same port back.
            server = dist.TCPStore(master_addr, 0, is_master=True, wait_for_workers=False)
            self._worker_store_server = server
            info = CycleInfo(cycle=self._job.add(CYCLES_KEY, 1) - 1, restarts=self._state().restarts,
                             worker_store_addr=master_addr, worker_store_port=server.port)
            round_keys.set("cycle", msgspec.json.encode(info).decode())
        else:
            self._worker_store_server = None
            info = _decode("cycle", round_keys.get("cycle").decode(), CycleInfo)
        if self._notice is not None:
            self._notice.watch(info.cycle)
        return info

    def wake_fds(self) -> tuple[int, ...]:
        """File descriptors that become readable when another launcher decided (see :mod:`.decision_notice`)."""
        return (self._notice.fileno(),) if self._notice is not None else ()

    def close(self) -> None:
        """End this launcher's wait for decisions (it is leaving the job)."""
        if self._notice is not None:
            self._notice.close()
            self._notice = None

    # -- decisions --------------------------------------------------------
    def poll(self, cycle: int) -> Optional[Decision]:
        """The job-wide stop, else the decision that ended ``cycle`` (or a later one), else None.

        One read of the job store: cheap enough for every monitoring pass.
        """
        if self._job is None:
            return None
        if self._notice is not None:
            self._notice.drain()  # before the read: a notice after it wakes the next pass
        state = self._state()
        if state.stop is not None:
            return state.stop
        return state.decision if state.decision is not None and state.cycle >= cycle else None

    def stop_decision(self) -> Optional[Decision]:
        """The job-wide stop, if any."""
        return self._state().stop if self._job is not None else None

    def request_stop(self, reason: str, exit_code: int) -> Decision:
        """Stop the whole job; if another node stopped it first, its decision wins."""
        wanted = Decision(DecisionAction.STOP, reason, exit_code=exit_code, node=self.node)

        def stop(state: JobState) -> Optional[JobState]:
            if state.stop is not None:
                return None
            return dataclasses.replace(state, stop=dataclasses.replace(wanted, restarts=state.restarts))

        stopped = self._update(stop).stop
        assert stopped is not None
        self.announce(stopped)
        return stopped

    def end_cycle(self, cycle: int, reason: str, fault: bool, progress_active: bool,
                  fingerprint: Optional[Fingerprint] = None, spare_waiting: bool = False,
                  only_node: bool = False) -> Decision:
        """Decide how ``cycle`` ends after a fault (``fault=True``) or a membership change.

        Returns the decision in force, which is another node's if it decided
        first (or the job-wide stop, if the job was stopped meanwhile).
        """
        best = self._get_int(PROGRESS_KEY, -1)

        def decide(state: JobState) -> Optional[JobState]:
            if state.stop is not None or state.cycle >= cycle:
                return None
            return decide_cycle_end(state, cycle, reason, fault=fault, progress_active=progress_active,
                                    best_progress=best, policy=self.policy, node=self.node, fingerprint=fingerprint,
                                    spare_waiting=spare_waiting, only_node=only_node)

        state = self._update(decide)
        decision = state.stop or state.decision
        assert decision is not None
        return decision

    def announce(self, decision: Optional[Decision]) -> None:
        """Wake the other launchers of the cycle if this launcher's write made ``decision`` (:mod:`.decision_notice`).

        After :meth:`end_cycle`, the agent calls it once the hang diagnosis asked for the others' evidence
        (:func:`~ft_core.launcher.hang_diagnosis.diagnose`): woken earlier, they would not know to give it.
        """
        if self._notice is not None and decision is not None and decision.node == self.node:
            self._notice.announce()

    # -- hot spares at the end of the job ---------------------------------
    def spare_released(self) -> None:
        """Called by a spare that saw the rendezvous close: the nodes that closed it may exit now."""
        if self._job is not None:
            self._job.add(SPARES_RELEASED_KEY, 1)

    def wait_spares_released(self, count: int, timeout: float) -> bool:
        """Keep the job store up until ``count`` spares have read how the job ended.

        With c10d the first launcher hosts the rendezvous store, and the job store on it: when
        it exits, a spare cannot learn anything. A job store outside the launchers (etcd) needs no wait.
        """
        if self._job is None:
            return False
        if self._job.survives_node_loss:
            return True
        job_store = self._job
        return bool(wait_until(lambda: int(job_store.get(SPARES_RELEASED_KEY) or 0) >= count, timeout))

    # -- training complete ------------------------------------------------
    def node_finished(self, cycle: int) -> None:
        """Every rank of this node reported training complete in ``cycle`` (call once per cycle)."""
        if self._job is not None:
            self._job.add(f"{FINISHED_NODES_KEY}{cycle}", 1)

    def nodes_finished(self, cycle: int) -> int:
        """How many nodes said :meth:`node_finished` for ``cycle`` (0 without a job store)."""
        return self._get_int(f"{FINISHED_NODES_KEY}{cycle}", 0) if self._job is not None else 0

    # -- progress ---------------------------------------------------------
    def publish_progress(self, iteration: int) -> None:
        """Raise the job-wide latest checkpointed iteration to ``iteration`` (atomic max)."""
        if self._job is None:
            return
        current = self._job.get(PROGRESS_KEY)
        while current is None or _decode(PROGRESS_KEY, current, int) < iteration:
            current = self._job.compare_set(PROGRESS_KEY, current, str(iteration))


def _decode(key: str, raw: str, kind: Any) -> Any:
    """``raw`` (JSON) as ``kind``; a clear error naming the key when another writer left something else."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.DecodeError as exc:
        raise CoordinationError(f"job store key {key!r}: invalid value {raw[:200]!r}: {exc}") from None
