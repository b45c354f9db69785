"""FtElasticAgent: torch's ``LocalElasticAgent`` with fault-tolerance policy added at its seams.

What it changes, and where:

* ``_rendezvous``: after torch's rendezvous, agree on the job-wide cycle and
  point the workers at that cycle's fresh store (see :mod:`.coordination`).
* ``_set_local_rank_env``: every worker gets the monitor and control sockets,
  the job token, and ``TORCHELASTIC_RESTART_COUNT`` = the job-wide cycle.
* ``_start_workers``: workers die with the launcher; the cycle is logged.
* ``_stop_workers`` / ``_monitor_workers``: survivors of a failure are stopped
  with ``--workers-stop-timeout`` (torch hard-codes 30 s inside its poll).
* ``_invoke_run``: the monitoring loop, which also reads the node monitor's
  events (hangs, checkpoints), respawns a dead monitor, serves workload-control
  requests, follows decisions taken by other nodes, and forwards SIGTERM/SIGINT;
  on every pass it keeps torch's bookkeeping (the group's state, its metrics).

What a node saw in a cycle is one value, :class:`.CycleObservations`, made anew at
each cycle's start and fed the monitor's records; the decisions are pure functions of
it: :mod:`.cycle_triggers` (what ends a cycle), :mod:`.fault_fingerprint` (the
fault's fingerprint), :mod:`.resumed_checkpoint` (what the cycle resumed from). The
agent acts: it waits, exchanges (:mod:`.hang_diagnosis`: who hung, who waited), writes
records and ends the launcher (:mod:`.outcome`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any, Optional

import msgspec
from torch.distributed.elastic.agent.server.api import DEFAULT_ROLE, RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.metrics import put_metric
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError, RendezvousGracefulExitError
from typing_extensions import override

from ft_core.autoresume import finished_flag_path, training_finished
from ft_core.events import (
    CheckpointLoaded,
    CheckpointRejected,
    CheckpointReported,
    ConnectionRejected,
    CycleStart,
    Diagnosis,
    FaultDecision,
    HangDetected,
    MonitorConnectionRejected,
    MonitorLate,
    PhaseMedians,
    Progress,
    RankConnected,
    RankDisconnected,
    RankEvidence,
    RankException,
    RankTerminated,
    Restart,
    RestartKind,
    ResumeChosen,
    SignalReceived,
    WorkerExit,
    WorkersStopped,
    WorkersSucceeded,
    WorkloadControlReceived,
)
from ft_core.exit_causes import ExitCause
from ft_core.fault_policy import FaultAction, FaultOutcome, FaultPolicy, Fingerprint
from ft_core.jobdir import LAUNCHER_SOCKET_ENV, MONITOR_SOCKET_ENV, TOKEN_ENV
from ft_core.launcher import cycle_triggers as triggers
from ft_core.launcher.checkpointed_iteration import CheckpointedIterationTracker
from ft_core.launcher.coordination import CycleInfo, Decision, DecisionAction, JobCoordinator
from ft_core.launcher.culprit import CulpritExchange
from ft_core.launcher.cycle_observations import CycleObservations
from ft_core.launcher.cycle_triggers import Trigger
from ft_core.launcher.fault_fingerprint import failure_records_in, fingerprint, fingerprint_record
from ft_core.launcher.hang_diagnosis import EXCEPTION_REPORT_WAIT, diagnose, hang_stacks, take_evidence
from ft_core.launcher.options import LauncherOptions
from ft_core.launcher.outcome import Outcome, RendezvousEnd, exit_status, left_job_outcome, signal_outcome
from ft_core.launcher.rendezvous.job_store import open_job_store
from ft_core.launcher.rendezvous.membership import leave_rendezvous, nodes_could_join, spares_waiting
from ft_core.launcher.rendezvous.skew import join_skew_skipped
from ft_core.launcher.rendezvous.waiting import reporting_rendezvous_wait
from ft_core.launcher.rendezvous.wake import woken_on_change
from ft_core.launcher.resumed_checkpoint import mark_checkpoint_bad, megatron_load_at_start
from ft_core.launcher.services import Services
from ft_core.launcher.startup.workers import (
    kill_process_groups,
    signal_process_groups,
    wait_for_an_exit,
    workers_die_with_agent,
)
from ft_core.launcher.straggler_exchange import StragglerDetector
from ft_core.utils.deadline import wait_until
from ft_core.utils.procutil import SIGNALS_TO_HANDLE_ENV, signals_named

__all__ = ["FtElasticAgent"]

log = logging.getLogger("ft_core.launcher")

#: How long a node that ends the job keeps the rendezvous store up for hot spares to see the end.
SPARE_RELEASE_TIMEOUT = 10.0
#: Why training counts as finished when no flag file says so (see ``FtElasticAgent._training_finished``).
RANKS_FINISHED = "every rank reported training complete and shut its client down"


class FtElasticAgent(LocalElasticAgent):
    """See the module docstring. ``agent.outcome`` holds the result after ``run()``."""

    def __init__(self, spec: Any, logs_specs: Any, *, services: Services, options: LauncherOptions,
                 **kwargs: Any) -> None:
        super().__init__(spec, logs_specs, **kwargs)
        self._svc = services
        self._opts = options
        self._coord = JobCoordinator(spec.rdzv_handler.get_run_id(), services.events.node, spec.max_restarts,
                                     options.max_no_progress_cycles, options.no_restart_exit_code,
                                     job_store=open_job_store(spec.rdzv_handler),
                                     min_progress_iterations=options.min_progress_iterations,
                                     faults=FaultPolicy(options.max_identical_faults, options.suspect_checkpoint_steps,
                                                        options.suspect_node_faults))
        self._progress = CheckpointedIterationTracker(options.checkpoint_iteration_file)
        self._stragglers = None if options.straggler_report_interval is None else StragglerDetector(
            options.straggler_report_interval, options.straggler_threshold, options.straggler_consecutive_reports,
            options.straggler_action, services.events.node, lambda: self._coord.job_store,
            services.on_straggler_round, options.straggler_min_phase_seconds)
        self._cycle: Optional[CycleInfo] = None
        #: What this node saw of the current cycle: a new value at each cycle's start (see _start_workers).
        self._seen = CycleObservations()
        #: Why exclude-node fell back to report, each said once (for the job's life).
        self._exclusion_warned: set[str] = set()
        self.outcome = Outcome(1, "the launcher stopped before the job ended")
        #: ``outcome`` is the agent's verdict (a signal arriving after it, in torch's bookkeeping, changes nothing).
        self.decided = False

    # -- seams: rendezvous, environment, start, stop, monitor ---------------
    @override
    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        spec, handler = worker_group.spec, worker_group.spec.rdzv_handler
        # Torch's random skew of a first join spreads the nodes of a starting job; a restart's nodes rejoin
        # together anyway, and one node has nobody to spread out (see .rendezvous.skew).
        skip_skew = self._cycle is not None or getattr(getattr(handler, "settings", None), "max_nodes", None) == 1
        with reporting_rendezvous_wait(handler), join_skew_skipped(skip_skew), woken_on_change(handler):
            super()._rendezvous(worker_group)
        # Torch's WorkerGroup declares these None until its rendezvous has run, as it just did.
        store, group_rank, master_addr = worker_group.store, worker_group.group_rank, worker_group.master_addr
        assert store is not None and group_rank is not None and master_addr is not None
        self._cycle = self._coord.begin_cycle(store, group_rank, master_addr, static=handler.get_backend() == "static")
        # Point the workers at the cycle's own store.
        worker_group.master_addr = self._cycle.worker_store_addr
        worker_group.master_port = self._cycle.worker_store_port
        # Torch derives its logs and TORCHELASTIC_RESTART_COUNT from this; keep it job-wide.
        self._remaining_restarts = spec.max_restarts - self._cycle.restarts

    @override
    def _set_local_rank_env(self, worker_env: dict[str, Any], local_rank: int, spec: Any) -> None:
        super()._set_local_rank_env(worker_env, local_rank, spec)
        assert self._cycle is not None
        worker_env.update({
            "TORCHELASTIC_RESTART_COUNT": str(self._cycle.cycle),
            # The cycle's store is served by an agent: workers must connect, never bind.
            "TORCHELASTIC_USE_AGENT_STORE": str(True),
            MONITOR_SOCKET_ENV: self._svc.monitor.socket_path,
            LAUNCHER_SOCKET_ENV: self._svc.control.socket_path,
            TOKEN_ENV: self._svc.token,
        })

    @override
    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        assert self._cycle is not None
        load_dir, tracker = megatron_load_at_start(worker_group.spec.args)  # before the workers move the tracker
        self._svc.monitor.wait_ready()  # started in parallel with the first rendezvous
        with workers_die_with_agent(self._svc.factory):
            pids = super()._start_workers(worker_group)
        self._seen = CycleObservations(self._cycle.cycle, frozenset(pids.values()), load_dir, tracker)
        started = time.time()
        self._svc.events.cycle_started()
        self._svc.events.write(CycleStart(
            time=started, cycle=self._cycle.cycle, restarts=self._cycle.restarts,
            group_rank=worker_group.group_rank, group_world_size=worker_group.group_world_size,
            world_size=worker_group.workers[0].world_size if worker_group.workers else 0,
            workers={str(w.global_rank): pids[w.local_rank] for w in worker_group.workers},
            monitor_pid=self._svc.monitor.pid))
        log.info("cycle %d: started %d worker(s) (ranks %s), %d restart(s) used so far", self._cycle.cycle,
                 len(pids), [w.global_rank for w in worker_group.workers], self._cycle.restarts)
        return pids

    @override
    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: Optional[float] = None) -> None:
        """Torch's shutdown, extended to each worker's whole process group, its leader alive or not.

        ``timeout`` defaults to ``--workers-stop-timeout`` (torch's own final call passes none: 30 s).

        Torch signals only the groups of workers still running: the groups of workers that
        died (see :func:`.kill_process_groups`) get ``death_sig`` here first; whatever is left
        of any group once ``timeout`` has passed gets SIGKILL.
        """
        timeout = self._opts.workers_stop_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        handlers = list((getattr(self._pcontext, "subprocess_handlers", None) or {}).values())
        signal_process_groups([h.proc.pid for h in handlers if h.proc.poll() is not None], death_sig)
        super()._shutdown(death_sig, timeout)  # type: ignore[arg-type]  # torch's int is only its default's type
        stuck = kill_process_groups([h.proc.pid for h in handlers], deadline)
        if stuck:
            log.error("processes of the workers' groups survived SIGKILL (uninterruptible sleep?): %s", stuck)

    @override
    def _exit_barrier(self) -> None:
        self._coord.close()  # no decision is left to wait for, and the c10d store's host may leave at the barrier
        super()._exit_barrier()

    @override
    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self._shutdown()
        self._svc.events.write(WorkersStopped(cycle=self._cycle_number()))

    @override
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        pcontext = self._pcontext
        handlers = getattr(pcontext, "subprocess_handlers", None) or {}
        failed = {rank: (h.proc.pid, h.proc.returncode) for rank, h in handlers.items()
                  if h.proc.poll() not in (None, 0)}
        seen = self._seen
        if failed and not seen.failed:
            seen.failed, seen.failed_at = failed, time.time()
            self._read_monitor_events()
            if training_finished() or seen.reported_finished:
                # Training is done (or a rank said so): the others may still be saving, saying goodbye
                # or exiting; let them end on their own (a goodbye is recorded before its rank exits).
                wait_until(lambda: all(h.proc.poll() is not None for h in handlers.values()),
                           self._opts.workers_stop_timeout)
                self._read_monitor_events()
            seen.finished_reason = self._training_finished()
            if any(pid in seen.hangs for pid, _code in failed.values()):
                self._take_evidence()  # before the survivors are stopped: what were they doing?
            # Torch's poll would stop the survivors with a fixed 30 s grace period; use ours.
            pcontext.close(signal.SIGTERM, self._opts.workers_stop_timeout)  # type: ignore[union-attr,arg-type]
        return super()._monitor_workers(worker_group)

    # -- the monitoring loop -----------------------------------------------
    @override
    def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        try:
            self._initialize_workers(self._worker_group)
            while True:
                self._wait_for_next_pass()
                result = self._step()
                if result is not None:
                    return result
        except SignalException as exc:
            return self._on_signal(exc.sigval)
        except (RendezvousGracefulExitError, RendezvousClosedError):
            # The rendezvous closed while this node waited to join a round: a hot spare that was never needed,
            # or a node whose place a spare took after a fault. The job ended (or stopped) without it: its nodes
            # record every stop in the job store before they close, and wait for the spares to read it. Torch
            # ends a node in its redundancy list gracefully; one in its wait list (a spare too, at the job's
            # --nnodes maximum: see nodes_could_join) sees the rendezvous closed.
            stop = self._stop_decision()
            self._coord.spare_released()
            if stop is not None:
                return self._finish(Outcome(stop.exit_code, f"spare released: {stop.reason}", RendezvousEnd.KEEP))
            return self._finish(Outcome(0, "spare released: the job finished without it", RendezvousEnd.KEEP))

    def _wait_for_next_pass(self) -> None:
        """Wait ``--monitor-interval``, or less: a running worker's exit or another node's decision starts it."""
        handlers = (getattr(self._pcontext, "subprocess_handlers", None) or {}).values()
        wait_for_an_exit([h.proc.pid for h in handlers if h.proc.poll() is None],
                         self._worker_group.spec.monitor_interval, self._coord.wake_fds())

    def _record_pass(self, result: RunResult) -> None:
        """What torch's own loop does after each look at the workers: the group's state and two metrics."""
        self._worker_group.state = result.state
        role = self._worker_group.spec.role
        put_metric(f"workers.{role}.remaining_restarts", self._remaining_restarts)
        put_metric(f"workers.{role}.{result.state.name.lower()}", 1)

    def _step(self) -> Optional[RunResult]:
        """One monitoring pass; returns a result when this launcher is done."""
        wg = self._worker_group
        result = self._monitor_workers(wg)
        self._record_pass(result)
        self._read_monitor_events()
        self._read_progress_file()
        if result.state == WorkerState.SUCCEEDED:
            self._svc.events.write(WorkersSucceeded(cycle=self._cycle.cycle if self._cycle else None))
            self._exit_barrier()
            return self._finish(Outcome(0, "all workers finished successfully"), result)
        if result.state == WorkerState.FAILED and self._seen.finished_reason is not None:
            return self._finished_anyway(result, self._seen.finished_reason)

        # A rank's request goes first: when the rank exits right after asking (an exception policy
        # does), its exit and its peers' failures are the effect of the request, not a fault to restart.
        trigger = self._control_trigger() or self._local_trigger(result) or self._straggler_trigger()
        decision: Optional[Decision]
        if trigger is not None and trigger.kind is RestartKind.SHUTDOWN:
            decision = self._coord.request_stop(trigger.reason, self._opts.no_restart_exit_code)
        elif trigger is not None:
            fingerprint = self._fingerprint(trigger) if trigger.kind.is_fault else None
            decision = self._coord.end_cycle(self._cycle_number(), trigger.reason, fault=trigger.kind.is_fault,
                                             progress_active=self._progress.active, fingerprint=fingerprint,
                                             spare_waiting=self._replaceable(fingerprint),
                                             only_node=(wg.group_world_size or 1) == 1)
        else:
            decision = self._coord.poll(self._cycle_number())
            if decision is not None:
                self._straggler_trigger(final=True)  # woken by the decision: a report that made it is logged here too
                trigger = Trigger(RestartKind.PEER, f"{decision.node}: {decision.reason}", time.time())
            elif nodes_could_join(wg.spec.rdzv_handler, wg.group_world_size or 1):
                # Torch's scale-up rule: new nodes are waiting; not a fault, not budgeted.
                trigger = Trigger(RestartKind.MEMBERSHIP, "new nodes are waiting to join", time.time())
        if trigger is None:
            return None
        return self._end_cycle(trigger, decision, result)

    def _end_cycle(self, trigger: Trigger, decision: Optional[Decision], result: RunResult) -> Optional[RunResult]:
        cycle = self._cycle_number()
        diagnosis = self._diagnose(trigger.kind, decision)
        if diagnosis is not None:
            self._svc.events.diagnosed(diagnosis)
        elif trigger.kind.is_fault:
            self._svc.events.fault(trigger.kind)
        # The fault policy's suspect node leaves; the others restart and a hot spare takes its place.
        leave = (decision is not None and decision.fault_action is FaultAction.EXCLUDE_NODE
                 and decision.action is DecisionAction.RESTART and decision.suspect_node == self._svc.events.node)
        if decision is not None and decision.fault_action is not None:
            self._svc.events.write(FaultDecision(
                cycle=cycle, action=decision.fault_action,
                outcome=FaultOutcome.LEAVE if leave else FaultOutcome(decision.action.value),
                reason=decision.reason, restarts=decision.restarts, decided_by=decision.node,
                checkpoint=decision.mark_bad, suspect_node=decision.suspect_node))
        if trigger.kind is RestartKind.EXCLUDED or leave:
            if leave:
                log.error("cycle %d: this node leaves the job, a hot spare takes its place: %s", cycle,
                          decision.reason if decision is not None else "")
            self._stop_workers(self._worker_group)
            return self._finish(left_job_outcome(decision.reason if leave and decision else trigger.reason), result)
        if decision is not None and decision.action is DecisionAction.STOP:
            log.error("stopping the job: %s", decision.reason)
            self._stop_workers(self._worker_group)
            return self._finish(Outcome(decision.exit_code, decision.reason), result)
        restarts = decision.restarts if decision is not None else self._cycle.restarts if self._cycle else 0
        cause = decision.reason if decision is not None else trigger.reason  # job-wide: same on every node
        self._svc.events.write(Restart(cycle=cycle, kind=trigger.kind, reason=trigger.reason, cause=cause,
                                       restarts=restarts, max_restarts=self._worker_group.spec.max_restarts))
        self._svc.events.restarted(cycle, cause)
        if decision is not None and decision.mark_bad is not None:
            marked = mark_checkpoint_bad(self._seen, cycle, decision.mark_bad, decision.reason,
                                         self._svc.monitor.socket_path)
            if marked is not None:
                self._svc.events.write(marked)
        # With a diagnosis, name its culprits: the first rank to expire is often a waiter.
        why = (f"{trigger.kind.value}: {trigger.reason}" if diagnosis is None else
               f"{trigger.kind.value}; culprit rank(s) {', '.join(map(str, diagnosis.culprits))}, see above")
        log.warning("cycle %d ended (%s); restarting all workers (%d/%d restarts used)", cycle, why, restarts,
                    self._worker_group.spec.max_restarts)
        self._restart_workers(self._worker_group)
        return None

    # -- the cycle's end: the pure decisions on what this node saw, and the actions around them ------
    def _control_trigger(self) -> Optional[Trigger]:
        request = self._svc.control.pop()
        if request is None:
            return None
        self._svc.events.write(WorkloadControlReceived(action=request.action.name, rank=request.rank,
                                                       description=request.description))
        trigger = triggers.control_trigger(request, self._exclusion_blocker)
        if trigger is not None and trigger.kind is RestartKind.NODE_FAULT:
            log.warning("rank %d requested ExcludeThisNode, but the job cannot go on without this node: "
                        "restarting the workers as after a fault (%s)", request.rank, trigger.reason)
        return trigger

    def _local_trigger(self, result: RunResult) -> Optional[Trigger]:
        trigger = triggers.monitor_trigger(self._svc.monitor, self._svc.events, time.time())
        if trigger is not None:
            return trigger
        if result.state == WorkerState.FAILED:
            for record in triggers.worker_exits(self._seen, self._global_ranks()):
                self._svc.events.write(record)
        return triggers.worker_trigger(result.state, self._seen, self._global_ranks(), result.failures, time.time())

    def _straggler_trigger(self, final: bool = False) -> Optional[Trigger]:
        """Log the stragglers of a new job-wide report (``final``: read it now); a trigger if straggler_action asks."""
        wg = self._worker_group
        if self._stragglers is None or wg.group_rank is None or wg.group_world_size is None:
            return None
        stragglers = self._stragglers.poll(self._cycle_number(), wg.group_rank, wg.group_world_size, force=final)
        for straggler in stragglers:
            self._svc.events.write(straggler)
        trigger, blocked = triggers.straggler_trigger(stragglers, self._svc.events.node, self._exclusion_blocker, time.time())
        for blocker in dict.fromkeys(b for b in blocked if b not in self._exclusion_warned):
            self._exclusion_warned.add(blocker)
            log.warning("straggler_action exclude-node falls back to report for this node: %s", blocker)
        return trigger

    def _exclusion_blocker(self) -> Optional[str]:
        return triggers.node_exclusion_blocker(self._worker_group, self._coord.job_store)

    def _fingerprint(self, trigger: Trigger) -> Optional[Fingerprint]:
        """The fault's fingerprint (:func:`.fingerprint`), on a hang's evidence or a crash's records; recorded."""
        seen = self._seen
        if trigger.kind is RestartKind.HANG:
            self._take_evidence()  # the live ranks' stacks tell a waiter from the rank it waits for
        elif trigger.kind is RestartKind.CRASH and seen.failed:
            def records_in() -> bool:
                self._read_monitor_events()
                return failure_records_in(seen)

            wait_until(records_in, EXCEPTION_REPORT_WAIT, interval=0.02)
        result = fingerprint(seen, trigger.kind, self._svc.events.node, self._global_ranks())
        if result is not None:
            self._svc.events.write(fingerprint_record(result, self._cycle_number()))
        return result

    def _take_evidence(self) -> list[RankEvidence]:
        return take_evidence(self._seen, self._svc.monitor, self._svc.events.node, self._read_monitor_events)

    def _diagnose(self, trigger: RestartKind, decision: Optional[Decision]) -> Optional[Diagnosis]:
        """The job-wide diagnosis of this cycle's hang (see :func:`.diagnose`), written and told; None otherwise."""
        store, wg, cycle = self._coord.job_store, self._worker_group, self._cycle_number()
        if store is None:
            return None
        node = self._svc.events.node
        diagnosis = diagnose(CulpritExchange(store, node, self._svc.monitor.cfg.stack_dump_timeout), cycle, trigger,
                             decision is None or decision.node == node, wg.group_rank or 0, wg.group_world_size or 1,
                             wg.workers[0].world_size if wg.workers else None, self._take_evidence,
                             lambda: self._coord.announce(decision))
        if diagnosis is not None:
            self._svc.events.write(diagnosis)
            # The one line per hang: the culprit, who waited, why, and where the culprit's stack is.
            stacks = hang_stacks(self._seen, diagnosis)
            log.error("cycle %d: %s (evidence: %s)%s", cycle, diagnosis.headline, diagnosis.evidence,
                      f"; stack: {', '.join(stacks)}" if stacks else "")
        return diagnosis

    def _replaceable(self, fingerprint: Optional[Fingerprint]) -> bool:
        """The fault is this node's and a hot spare could take this node's place (the bad-node rule may exclude it).

        Only the suspect node can tell (whether it hosts the job store, the spares it sees), and the node
        whose ranks failed is the one that sees the fault first and decides.
        """
        if fingerprint is None or fingerprint.nodes != (self._svc.events.node,) or \
                self._coord.policy.faults.suspect_node_faults <= 0:
            return False
        try:
            return triggers.node_exclusion_blocker(self._worker_group, self._coord.job_store) is None
        except Exception as exc:  # noqa: BLE001 - the rendezvous store may be gone: then the node stays
            log.warning("cannot tell whether this node could leave the job: %s", exc)
            return False

    def _training_finished(self) -> Optional[str]:
        """Why training is finished, or None: the finished flag exists, or every rank of the job reported it.

        A rank reports it in its goodbye (``shutdown_workload_monitoring(training_finished=True)``).
        This launcher sees its own ranks' goodbyes; the other nodes' come through the job store
        (each node counts itself in once all its ranks reported), waited for up to
        ``--workers-stop-timeout``. A rank that never reported keeps the job unfinished: without the
        job store, with several nodes, nothing but the flag can say so.
        """
        if training_finished():
            return f"{finished_flag_path()} exists"
        if not self._seen.node_finished:
            return None
        nodes = self._worker_group.group_world_size or 1
        if nodes > 1:
            cycle = self._cycle_number()
            try:
                if not wait_until(lambda: self._coord.nodes_finished(cycle) >= nodes, self._opts.workers_stop_timeout):
                    return None
            except Exception as exc:  # noqa: BLE001 - the store host may be gone: then nothing says it is finished
                log.warning("cannot read which nodes finished training: %s", exc)
                return None
        return RANKS_FINISHED

    def _finished_anyway(self, result: RunResult, why: str) -> RunResult:
        """Workers failed after training finished (``why``: see :meth:`_training_finished`): warn, never restart, exit 0.

        A worker may die at interpreter exit after its last step and its final save (a C++
        destructor's ``terminate called without an active exception``: SIGABRT); restarting
        a finished job would redo it, or fail it once the budget is spent.
        """
        for record in triggers.worker_exits(self._seen, self._global_ranks(), ExitCause.FINISHED):
            self._svc.events.write(record)
            ended = f"exited with code {record.exit_code}" if record.signal is None else f"was killed by {record.signal}"
            log.warning("rank %s (pid %d) %s after training finished (%s): not restarted", record.rank, record.pid, ended, why)
        self._exit_barrier()
        return self._finish(Outcome(0, f"training is finished ({why}); {len(self._seen.failed)} worker(s) failed at "
                                       "exit"), result)

    def _read_monitor_events(self) -> None:
        """Take in the monitor's records (:meth:`.CycleObservations.observe` remembers) and act on them (forward)."""
        for ev in self._svc.monitor.poll_events():
            if self._seen.observe(ev):
                self._on_node_finished()
            match ev:
                case (RankConnected() | RankTerminated() | RankDisconnected() | CheckpointLoaded() | ResumeChosen()
                      | CheckpointRejected() | RankException()):
                    self._svc.events.write(ev)
                case HangDetected():
                    # The monitor kept the stack in its own file (named by cycle); the log keeps where.
                    self._svc.events.write(msgspec.structs.replace(ev, stack=None))
                case CheckpointReported():
                    self._on_progress(ev.iteration, f"rank {ev.rank}")
                case ConnectionRejected():
                    self._svc.events.write(MonitorConnectionRejected(time=ev.time, pid=ev.pid, reason=ev.reason))
                case MonitorLate():
                    self._svc.events.monitor_late(ev.late)
                    self._svc.events.write(ev)
                case PhaseMedians():
                    wg = self._worker_group
                    if self._stragglers is not None and wg.group_rank is not None:
                        self._stragglers.publish(ev, self._cycle_number(), wg.group_rank)

    def _on_node_finished(self) -> None:
        """Every worker of this cycle reported training complete: the job store counts this node."""
        log.info("cycle %d: every rank of this node reported training complete", self._cycle_number())
        try:
            self._coord.node_finished(self._cycle_number())
        except Exception as exc:  # noqa: BLE001 - the store host may be gone: the other nodes then see no finish
            log.warning("cannot tell the job store that this node finished training: %s", exc)

    def _read_progress_file(self) -> None:
        iteration = self._progress.poll_file()
        if iteration is not None:
            self._announce_progress(iteration, "checkpoint iteration file")

    def _on_progress(self, iteration: int, source: str) -> None:
        if self._progress.observe(iteration):
            self._announce_progress(iteration, source)

    def _announce_progress(self, iteration: int, source: str) -> None:
        self._svc.events.write(Progress(iteration=iteration, source=source, cycle=self._cycle_number()))
        self._coord.publish_progress(iteration)

    # -- endings ----------------------------------------------------------
    def _on_signal(self, sig: signal.Signals) -> RunResult:
        """Forward SIGTERM/SIGINT to the workers, SIGKILL them after ``--term-timeout``."""
        # A second signal must not cut the workers' grace period short.
        for sig_to_ignore in signals_named(os.environ.get(SIGNALS_TO_HANDLE_ENV, "SIGTERM,SIGINT")):
            signal.signal(sig_to_ignore, signal.SIG_IGN)
        handlers = list((getattr(self._pcontext, "subprocess_handlers", None) or {}).values())
        running = [h for h in handlers if h.proc.poll() is None]
        finished_before = bool(handlers) and not running and all(h.proc.returncode == 0 for h in handlers)
        self._svc.events.write(SignalReceived(signal=sig.name, running_workers=len(running)))
        log.warning("received %s: forwarding it to %d worker(s), SIGKILL after %.1f s", sig.name, len(running),
                    self._opts.term_timeout)
        self._shutdown(sig, timeout=self._opts.term_timeout)
        codes = [h.proc.returncode for h in handlers]
        for handler in running:
            exit_code, killed_by = exit_status(handler.proc.returncode)
            self._svc.events.write(WorkerExit(
                cycle=self._cycle_number(), local_rank=handler.local_rank_id, pid=handler.proc.pid,
                cause=ExitCause.stopped_by(sig), exit_code=exit_code, signal=killed_by))
        return self._finish(signal_outcome(sig, f"workers exit codes {codes}", finished_before))

    def release_rendezvous(self, outcome: Outcome) -> None:
        """After ``run()``: "close" the rendezvous for every node, "leave" it, or "keep" it (see Outcome).

        A node waiting to join when the rendezvous closes (a hot spare) reads the job's end from
        the job store: a failure this node closes it on (a launcher error) is recorded there as
        the job's stop first, so that the spare does not take the close for a finished job.
        """
        handler = self._worker_group.spec.rdzv_handler
        if outcome.rendezvous is RendezvousEnd.LEAVE:
            leave_rendezvous(handler)
        elif outcome.rendezvous is RendezvousEnd.CLOSE:
            if outcome.exit_code != 0 and self._coord.job_store is not None:
                self._coord.request_stop(outcome.reason, outcome.exit_code)
            spares = spares_waiting(handler)
            handler.shutdown()
            if spares:
                log.info("rendezvous closed; waiting for %d hot spare(s) to see the end of the job", spares)
            if spares and not self._coord.wait_spares_released(spares, SPARE_RELEASE_TIMEOUT):
                log.warning("%d hot spare(s) did not confirm the end of the job", spares)
        self._coord.close()

    def _finish(self, outcome: Outcome, result: Optional[RunResult] = None) -> RunResult:
        self.outcome = outcome
        self.decided = True
        if result is not None and result.state == WorkerState.SUCCEEDED:
            return result
        self._worker_group.state = WorkerState.FAILED  # as torch's loop leaves a group it gives up on
        # Torch's run() accounts every worker of a non-successful result as failed or terminated.
        return RunResult(state=WorkerState.FAILED, failures=result.failures if result is not None else {})

    def _stop_decision(self) -> Optional[Decision]:
        """The job-wide stop, also for a spare that never joined a round."""
        try:
            return self._coord.stop_decision()
        except Exception:  # noqa: BLE001 - the store host may be gone already; then nobody left a decision
            return None

    def _global_ranks(self) -> dict[int, int]:
        """Local rank -> global rank of this cycle's workers."""
        return {w.local_rank: w.global_rank for w in self._worker_group.workers}

    def _cycle_number(self) -> int:
        return self._cycle.cycle if self._cycle is not None else -1

