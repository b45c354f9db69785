"""The per-node helpers the launcher starts before the agent and stops after it (:class:`Services`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Optional

from ft_core.launcher.control import WorkloadControlServer
from ft_core.launcher.node_monitor import NodeMonitor
from ft_core.launcher.observability.event_log import EventLog
from ft_core.launcher.startup.prewarm import WorkerFactory
from ft_core.launcher.straggler_exchange import StragglerRound

__all__ = ["Services"]


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
