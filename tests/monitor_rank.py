"""A :class:`~ft_core.monitor.watched_rank.WatchedRank` built for the monitor's pure-policy unit tests (no process, no clock)."""

from __future__ import annotations

from typing import Optional

from ft_core.config import FaultToleranceConfig
from ft_core.monitor.watched_rank import WatchedRank
from ft_core.timeouts import HeartbeatTimeouts, SectionTimeouts

T0 = 1000.0  # monotonic time of the connection


def watched(initial: Optional[float] = None, subsequent: Optional[float] = None,
            sections: Optional[dict[str, Optional[float]]] = None, out_of_section: Optional[float] = None,
            warmup: int = 0) -> WatchedRank:
    # The monitor's config holds the same timeouts (a warm-up step falls back on the configured ones).
    cfg = FaultToleranceConfig(num_warmup_iterations=warmup, initial_rank_heartbeat_timeout=initial,
                               rank_heartbeat_timeout=subsequent, rank_section_timeouts=dict(sections or {}),
                               rank_out_of_section_timeout=out_of_section)
    return WatchedRank(
        rank=1, local_rank=1, pid=4321, cfg=cfg, restart_count=0,
        connected_at=T0, hb=HeartbeatTimeouts(initial, subsequent),
        sections=SectionTimeouts(dict(sections or {}), out_of_section), dump_path=None, out_of_section_since=T0)
