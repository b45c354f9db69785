"""What ends a cycle: a worker's failure or hang, a dead monitor, a rank's request, a straggler (``FtElasticAgent``'s part).

Each ``_*_trigger`` method of :class:`CycleTriggers` looks at one source and
returns the :class:`~.agent_state.Trigger` that ends the current cycle, or
None; the agent's monitoring pass asks them in order and acts on the first.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

from ft_core.data import WorkloadAction
from ft_core.events import MonitorDied, MonitorStarted, RestartKind, WorkerExit, WorkloadControlReceived
from ft_core.launcher.agent_state import AgentState, Trigger
from ft_core.launcher.coordination import spares_waiting
from ft_core.launcher.outcome import exit_status
from ft_core.launcher.straggler_exchange import exclusion_blocker
from ft_core.straggler_scoring import StragglerAction
from ft_core.utils.procutil import listens_on_tcp_port

__all__ = ["CycleTriggers"]

log = logging.getLogger("ft_core.launcher")


class CycleTriggers(AgentState):
    """The agent's look at each source of a cycle's end (see the module docstring)."""

    # -- what ends a cycle --------------------------------------------------
    def _local_trigger(self, result: RunResult) -> Optional[Trigger]:
        now = time.time()
        if not self._svc.monitor.is_alive():
            code = self._svc.monitor.exit_code()
            log.error("the rank monitor died (exit code %s); starting a new one and restarting the cycle", code)
            self._svc.events.write(MonitorDied(exit_code=code))
            self._svc.monitor.respawn()
            self._svc.events.write(MonitorStarted(pid=self._svc.monitor.pid, socket=self._svc.monitor.socket_path))
            return Trigger(RestartKind.MONITOR, f"rank monitor died (exit code {code})", now)
        if result.state == WorkerState.FAILED:
            return self._failure_trigger(result, now)
        if result.state == WorkerState.UNHEALTHY:
            return Trigger(RestartKind.UNHEALTHY, "a worker is stuck in uninterruptible sleep", now)
        if result.state != WorkerState.HEALTHY:
            return Trigger(RestartKind.CRASH, f"worker group in state {result.state.name}", now)
        # A hung rank the monitor could not kill (e.g. a catchable termination signal).
        for hang in self._hangs.values():
            return Trigger(RestartKind.HANG, hang.describe(), hang.detected_time)
        return None

    def _failure_trigger(self, result: RunResult, now: float) -> Trigger:
        workers = self._global_ranks()
        reasons, kind = [], RestartKind.CRASH
        for local_rank, (pid, code) in sorted(self._failed.items()):
            hang = self._hangs.get(pid)
            kind = RestartKind.HANG if hang else kind
            exit_code, sig = exit_status(code)
            self._svc.events.write(WorkerExit(
                time=self._failed_at, cycle=self._cycle_number(), rank=workers.get(local_rank),
                local_rank=local_rank, pid=pid, cause="hang" if hang else "crash", exit_code=exit_code, signal=sig))
            reasons.append(hang.describe() if hang else
                           f"rank {workers.get(local_rank)} (pid {pid}) " +
                           (f"exited with code {code}" if sig is None else f"killed by {sig}"))
        if not reasons:  # failure seen by torch only (e.g. pids mismatch)
            reasons = [f"rank {rank} failed (exit code {f.exitcode})" for rank, f in result.failures.items()]
        return Trigger(kind, "; ".join(reasons), self._failed_at or now)

    def _straggler_trigger(self) -> Optional[Trigger]:
        """Log the stragglers of a new job-wide report; a trigger when straggler_action asks for one."""
        wg = self._worker_group
        if self._stragglers is None or wg.group_rank is None or wg.group_world_size is None:
            return None
        trigger = None
        for straggler in self._stragglers.poll(self._cycle_number(), wg.group_rank, wg.group_world_size):
            self._svc.events.write(straggler)
            if straggler.action is StragglerAction.RESTART:
                trigger = Trigger(RestartKind.STRAGGLER, straggler.describe(), time.time())
            elif straggler.action is StragglerAction.EXCLUDE_NODE and straggler.rank_node == self._svc.events.node:
                blocker = self._exclusion_blocker()
                if blocker is None:
                    trigger = Trigger(RestartKind.EXCLUDED, straggler.describe(), time.time())
                elif blocker not in self._exclusion_warned:
                    self._exclusion_warned.add(blocker)
                    log.warning("straggler_action exclude-node falls back to report for this node: %s", blocker)
        return trigger

    def _exclusion_blocker(self) -> Optional[str]:
        """Why this node cannot leave without ending the job (None: it can); see :func:`.exclusion_blocker`."""
        wg = self._worker_group
        handler = wg.spec.rdzv_handler
        settings = getattr(handler, "settings", None)
        store = self._coord.job_store
        rdzv_store = getattr(handler, "_store", None)
        hosts_store = (store is not None and not store.survives_node_loss
                       and isinstance(getattr(rdzv_store, "port", None), int)
                       and listens_on_tcp_port(rdzv_store.port))  # type: ignore[union-attr]
        return exclusion_blocker(dynamic=settings is not None, hosts_store=hosts_store,
                                 nodes=wg.group_world_size or 1,
                                 min_nodes=getattr(settings, "min_nodes", 1), spares=spares_waiting(handler))

    def _control_trigger(self) -> Optional[Trigger]:
        request = self._svc.control.pop()
        if request is None:
            return None
        self._svc.events.write(WorkloadControlReceived(action=request.action.name, rank=request.rank,
                                                       description=request.description))
        why = f"rank {request.rank} requested {request.action.name}" + (
            f": {request.description}" if request.description else "")
        if request.action == WorkloadAction.ExcludeThisNode:
            blocker = self._exclusion_blocker()
            if blocker is None:
                return Trigger(RestartKind.EXCLUDED, why, request.time)
            # The rank says its node is faulty, but leaving would end the job unfinished: restart every
            # worker as after a fault instead (the budget and the no-progress rule bound a node that
            # stays faulty), never report only (the rank often exits right after asking).
            log.warning("rank %d requested ExcludeThisNode, but the job cannot go on without this node (%s): "
                        "restarting the workers as after a fault", request.rank, blocker)
            return Trigger(RestartKind.NODE_FAULT, f"{why}; not excluded: {blocker}", request.time)
        if request.action == WorkloadAction.ShutdownWorkload:
            return Trigger(RestartKind.SHUTDOWN, why, request.time)
        return None  # Continue: nothing to do
