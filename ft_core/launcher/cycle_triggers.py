"""What ends a cycle: a worker's failure or hang, a dead monitor, a rank's request, a straggler.

The decisions are pure: :func:`worker_trigger` reads the cycle's
:class:`~.cycle_observations.CycleObservations` (and the group's state, the rank map),
:func:`control_trigger` a rank's request, :func:`straggler_trigger` a straggler
report, each returning the :class:`Trigger` that ends the cycle, or None; the agent's
monitoring pass asks them in order and acts on the first. The two helpers at the end
act (:func:`monitor_trigger` respawns a dead monitor) or look outside
(:func:`node_exclusion_blocker`), with explicit arguments.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, Optional

from torch.distributed.elastic.agent.server.api import WorkerGroup, WorkerState

from ft_core.data import WorkloadAction
from ft_core.events import MonitorDied, MonitorStarted, RestartKind, Straggler, WorkerExit
from ft_core.exit_causes import ExitCause
from ft_core.launcher.control import ControlRequest
from ft_core.launcher.cycle_observations import CycleObservations
from ft_core.launcher.node_monitor import NodeMonitor
from ft_core.launcher.observability.event_log import EventLog
from ft_core.launcher.outcome import exit_status
from ft_core.launcher.rendezvous.job_store import JobStore
from ft_core.launcher.rendezvous.membership import spares_waiting
from ft_core.launcher.straggler_exchange import exclusion_blocker
from ft_core.straggler_scoring import StragglerAction
from ft_core.utils.procutil import listens_on_tcp_port

__all__ = ["Trigger", "control_trigger", "monitor_trigger", "node_exclusion_blocker", "straggler_trigger",
           "worker_exits", "worker_trigger"]

log = logging.getLogger("ft_core.launcher")


@dataclasses.dataclass(frozen=True)
class Trigger:
    """Why the current cycle must end."""

    kind: RestartKind  # ``kind.is_fault``: spends the restart budget, counts for the no-progress rule
    reason: str
    time: float


def worker_trigger(state: WorkerState, seen: CycleObservations, ranks: Mapping[int, int],
                   failures: Mapping[int, Any], now: float) -> Optional[Trigger]:
    """The end of the cycle the workers' group state (torch's) and ``seen`` call for, or None.

    ``ranks``: local rank -> global rank; ``failures``: torch's failures of a FAILED group (their
    ``exitcode``), used when this launcher saw no worker fail itself.
    """
    if state == WorkerState.FAILED:
        return _failure_trigger(seen, ranks, failures, now)
    if state == WorkerState.UNHEALTHY:
        return Trigger(RestartKind.UNHEALTHY, "a worker is stuck in uninterruptible sleep", now)
    if state != WorkerState.HEALTHY:
        return Trigger(RestartKind.CRASH, f"worker group in state {state.name}", now)
    # A hung rank the monitor could not kill (e.g. a catchable termination signal).
    for hang in seen.hangs.values():
        return Trigger(RestartKind.HANG, hang.describe(), hang.detected_time)
    return None


def _failure_trigger(seen: CycleObservations, ranks: Mapping[int, int], failures: Mapping[int, Any],
                     now: float) -> Trigger:
    reasons, kind = [], RestartKind.CRASH
    for local_rank, (pid, code) in sorted(seen.failed.items()):
        hang = seen.hangs.get(pid)
        kind = RestartKind.HANG if hang else kind
        _exit_code, sig = exit_status(code)
        reasons.append(hang.describe() if hang else
                       f"rank {ranks.get(local_rank)} (pid {pid}) " +
                       (f"exited with code {code}" if sig is None else f"killed by {sig}"))
    if not reasons:  # failure seen by torch only (e.g. pids mismatch)
        reasons = [f"rank {rank} failed (exit code {f.exitcode})" for rank, f in failures.items()]
    return Trigger(kind, "; ".join(reasons), seen.failed_at or now)


def worker_exits(seen: CycleObservations, ranks: Mapping[int, int],
                 cause: Optional[ExitCause] = None) -> list[WorkerExit]:
    """The ``worker_exit`` records of the workers that failed in ``seen``'s cycle, by local rank.

    ``cause``: the same for all (training was finished); None: ``hang`` for a worker whose
    hang was detected, else ``crash``.
    """
    records = []
    for local_rank, (pid, code) in sorted(seen.failed.items()):
        exit_code, sig = exit_status(code)
        why = cause or (ExitCause.HANG if pid in seen.hangs else ExitCause.CRASH)
        records.append(WorkerExit(time=seen.failed_at, cycle=seen.cycle, rank=ranks.get(local_rank),
                                  local_rank=local_rank, pid=pid, cause=why, exit_code=exit_code, signal=sig))
    return records


def control_trigger(request: ControlRequest, blocker: Callable[[], Optional[str]]) -> Optional[Trigger]:
    """The end of the cycle a rank's workload-control request calls for, or None (``Continue``).

    ``blocker``: why this node cannot leave the job (None: it can), asked only for ``ExcludeThisNode``.
    """
    why = f"rank {request.rank} requested {request.action.name}" + (
        f": {request.description}" if request.description else "")
    if request.action is WorkloadAction.ExcludeThisNode:
        reason = blocker()
        if reason is None:
            return Trigger(RestartKind.EXCLUDED, why, request.time)
        # The rank says its node is faulty, but leaving would end the job unfinished: restart every
        # worker as after a fault instead (the budget and the no-progress rule bound a node that
        # stays faulty), never report only (the rank often exits right after asking).
        return Trigger(RestartKind.NODE_FAULT, f"{why}; not excluded: {reason}", request.time)
    if request.action is WorkloadAction.ShutdownWorkload:
        return Trigger(RestartKind.SHUTDOWN, why, request.time)
    return None  # Continue: nothing to do


def straggler_trigger(stragglers: list[Straggler], node: str, blocker: Callable[[], Optional[str]],
                      now: float) -> tuple[Optional[Trigger], list[str]]:
    """The end of the cycle a new straggler report calls for (None: report only), and why exclusions fell back.

    ``node``: this launcher; ``blocker``: as for :func:`control_trigger`. The second value: the reasons an
    ``exclude-node`` straggler of this node could not leave (its action falls back to report).
    """
    trigger, blocked = None, []
    for straggler in stragglers:
        if straggler.action is StragglerAction.RESTART:
            trigger = Trigger(RestartKind.STRAGGLER, straggler.describe(), now)
        elif straggler.action is StragglerAction.EXCLUDE_NODE and straggler.rank_node == node:
            reason = blocker()
            if reason is None:
                trigger = Trigger(RestartKind.EXCLUDED, straggler.describe(), now)
            else:
                blocked.append(reason)
    return trigger, blocked


# -- actions ----------------------------------------------------------------
def monitor_trigger(monitor: NodeMonitor, events: EventLog, now: float) -> Optional[Trigger]:
    """A dead node monitor ends the cycle: recorded, a new one started at once; None while it lives."""
    if monitor.is_alive():
        return None
    code = monitor.exit_code()
    log.error("the rank monitor died (exit code %s); starting a new one and restarting the cycle", code)
    events.write(MonitorDied(exit_code=code))
    monitor.respawn()
    events.write(MonitorStarted(pid=monitor.pid, socket=monitor.socket_path))
    return Trigger(RestartKind.MONITOR, f"rank monitor died (exit code {code})", now)


def node_exclusion_blocker(wg: WorkerGroup, job_store: Optional[JobStore]) -> Optional[str]:
    """Why this node cannot leave without ending the job (None: it can); see :func:`.exclusion_blocker`."""
    handler = wg.spec.rdzv_handler
    settings = getattr(handler, "settings", None)
    rdzv_store = getattr(handler, "_store", None)
    hosts_store = (job_store is not None and not job_store.survives_node_loss
                   and isinstance(getattr(rdzv_store, "port", None), int)
                   and listens_on_tcp_port(rdzv_store.port))  # type: ignore[union-attr]
    return exclusion_blocker(dynamic=settings is not None, hosts_store=hosts_store, nodes=wg.group_world_size or 1,
                             min_nodes=getattr(settings, "min_nodes", 1), spares=spares_waiting(handler))
