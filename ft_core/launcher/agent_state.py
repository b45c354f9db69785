"""What the agent and its parts share: the node's services, why a cycle ends, and the agent's state, declared once.

:class:`~ft_core.launcher.agent.FtElasticAgent` is assembled from parts
(:mod:`.cycle_triggers`, :mod:`.hang_diagnosis`) that read and write the same
per-cycle state; :class:`AgentState` declares that state and the agent's
helpers the parts call, so each part type-checks on its own. The agent sets
it up (``FtElasticAgent.__init__``) and owns it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Optional

from ft_core.events import (
    CheckpointLoaded,
    HangDetected,
    RankEvidence,
    RankException,
    RanksSnapshot,
    RestartKind,
    ResumeChosen,
)
from ft_core.launcher.control import WorkloadControlServer
from ft_core.launcher.coordination import CycleInfo, JobCoordinator
from ft_core.launcher.event_log import EventLog
from ft_core.launcher.node_monitor import NodeMonitor
from ft_core.launcher.options import LauncherOptions
from ft_core.launcher.prewarm import WorkerFactory
from ft_core.launcher.straggler_exchange import StragglerDetector, StragglerRound

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import WorkerGroup

__all__ = ["AgentState", "Services", "Trigger"]


@dataclasses.dataclass
class Services:
    """Per-node helpers the launcher starts before the agent and stops after it."""

    monitor: NodeMonitor
    control: WorkloadControlServer
    events: EventLog
    token: str
    #: Called with every straggler report read (the metrics endpoint's scores); None: nobody listens.
    on_straggler_round: Optional[Callable[[StragglerRound], None]] = None
    #: Forks pre-warmed workers; None when pre-warming is off or cannot apply.
    factory: Optional[WorkerFactory] = None


@dataclasses.dataclass(frozen=True)
class Trigger:
    """Why the current cycle must end."""

    kind: RestartKind  # ``kind.is_fault``: spends the restart budget, counts for the no-progress rule
    reason: str
    time: float


class AgentState:
    """The state ``FtElasticAgent`` keeps and its parts share (annotations only: the agent sets it up)."""

    _svc: Services
    _opts: LauncherOptions
    _coord: JobCoordinator
    _stragglers: Optional[StragglerDetector]
    _cycle: Optional[CycleInfo]
    #: hang_detected records of this cycle's workers, by pid.
    _hangs: dict[int, HangDetected]
    #: The exceptions this cycle's workers reported failing with (a fault's fingerprint), in arrival order.
    _exceptions: list[RankException]
    #: The checkpoint this cycle's workers resumed from (their ``checkpoint_loaded`` record), if they said.
    _loaded: Optional[CheckpointLoaded]
    #: The in-memory snapshot this cycle's ranks resumed from instead of ``_loaded`` (their ``resume_chosen``).
    _resumed_snapshot: Optional[ResumeChosen]
    #: local_rank -> (pid, exit code) of the workers that failed on their own this cycle, and when.
    _failed: dict[int, tuple[int, int]]
    _failed_at: float
    #: Pids of this cycle's workers that connected to the monitor, and when each disconnected (the monitor's
    #: record of the end of its connection: at its exit at the latest).
    _connected: set[int]
    _gone_at: dict[int, float]
    #: The evidence of this node's ranks for the diagnosis of this cycle's hang, once taken.
    _evidence: Optional[list[RankEvidence]]
    _snapshot: Optional[RanksSnapshot]
    #: Why exclude-node fell back to report, each said once.
    _exclusion_warned: set[str]
    # Torch's (set by LocalElasticAgent).
    _worker_group: WorkerGroup
    # The agent's helpers the parts call.
    _read_monitor_events: Callable[[], None]
    _cycle_number: Callable[[], int]
    _global_ranks: Callable[[], dict[int, int]]
