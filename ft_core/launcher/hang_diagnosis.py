"""Who hung, who waited: this node's evidence and the job-wide diagnosis of a hang (the agent's actions).

At the end of a faulty cycle :func:`take_evidence` gathers the node's evidence (its
hang records and the monitor's record of its live ranks, stacks included) before
the survivors are stopped; :func:`diagnose` agrees on one diagnosis with the other
nodes through the job store (:mod:`.culprit`). Both act (they signal the monitor,
wait for its record, exchange through the store) on explicit arguments; what they
read and keep is the cycle's :class:`~.cycle_observations.CycleObservations`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Optional

import msgspec

from ft_core.diagnosis import evidence_of_hang
from ft_core.events import Diagnosis, LiveRanks, RankEvidence, RestartKind
from ft_core.launcher.culprit import CulpritExchange
from ft_core.launcher.cycle_observations import CycleObservations
from ft_core.launcher.node_monitor import NodeMonitor
from ft_core.utils.deadline import wait_until

__all__ = ["EXCEPTION_REPORT_WAIT", "LIVE_RANKS_MARGIN", "LIVE_RANKS_POLL", "diagnose", "hang_stacks",
           "take_evidence"]

log = logging.getLogger("ft_core.launcher")

#: How long the launcher waits for the monitor's live-ranks record beyond the monitor's own stack-dump wait.
LIVE_RANKS_MARGIN = 2.0
#: How often the launcher reads the monitor's records while it waits for its live ranks: the monitor writes
#: them as soon as the dumps settled (two of its 5 ms polls), and the survivors are stopped only after it.
LIVE_RANKS_POLL = 0.005
#: How long the records of a worker that died (its exception report, the end of its connection) may take to
#: reach us (the monitor records them within milliseconds): a crash's fingerprint waits for them, at most this.
EXCEPTION_REPORT_WAIT = 0.5


def take_evidence(seen: CycleObservations, monitor: NodeMonitor, node: str,
                  read_records: Callable[[], None]) -> list[RankEvidence]:
    """This node's evidence (its hang records, its live ranks with their stacks), taken once per cycle.

    ``read_records``: the agent's reading of the monitor's records into ``seen`` (and its forwarding).
    """
    if seen.evidence is not None:
        return seen.evidence
    seen.live_ranks = None
    if monitor.request_live_ranks():
        def live_ranks_in() -> Optional[LiveRanks]:
            read_records()
            return seen.live_ranks

        # The monitor waits at most stack_dump_timeout for the dumps; then it writes the record.
        if wait_until(live_ranks_in, monitor.cfg.stack_dump_timeout + LIVE_RANKS_MARGIN,
                      interval=LIVE_RANKS_POLL) is None:
            log.warning("the rank monitor sent no record of its live ranks; diagnosing without it")
    evidence = [evidence_of_hang(h, node) for h in seen.hangs.values()]
    if seen.live_ranks is not None:
        evidence += [msgspec.structs.replace(e, node=node) for e in seen.live_ranks.ranks]
    seen.evidence = evidence
    return evidence


def diagnose(exchange: CulpritExchange, cycle: int, trigger: RestartKind, decided_here: bool, group_rank: int,
             nodes: int, world_size: Optional[int], evidence: Callable[[], list[RankEvidence]],
             announce: Callable[[], None] = lambda: None) -> Optional[Diagnosis]:
    """The job-wide diagnosis of ``cycle``'s hang (see :mod:`.culprit`); None when there is none to make.

    ``decided_here``: this node decided how the cycle ends (it asks the others for their
    evidence); ``evidence``: takes this node's (:func:`take_evidence`), only when needed;
    ``announce``: wakes the other nodes for the decision, called by the node that decided once
    they can tell whether their evidence is wanted.
    """
    if decided_here:
        if trigger is not RestartKind.HANG:
            exchange.publish(cycle, None)  # the others need not take their ranks' evidence
            announce()
            return None
        exchange.request(cycle)
        announce()
        mine = evidence()
        exchange.share(cycle, group_rank, mine)
        return exchange.decide(cycle, nodes, mine, world_size)
    if trigger not in (RestartKind.HANG, RestartKind.PEER):
        return None
    wanted = exchange.requested(cycle)
    if not wanted and trigger is not RestartKind.HANG:
        return None  # another node's crash or stop: nothing to diagnose, no stack dumps
    mine = evidence()
    if wanted:
        exchange.share(cycle, group_rank, mine)
    return exchange.wait(cycle, mine)


def hang_stacks(seen: CycleObservations, diagnosis: Diagnosis) -> list[str]:
    """The stack-dump files of the diagnosis's culprits on this node (for the one log line per hang)."""
    return [h.stack_dump_file for h in seen.hangs.values() if h.rank in diagnosis.culprits and h.stack_dump_file]
