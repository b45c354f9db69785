"""What a node saw in one cycle (:class:`ft_core.launcher.cycle_observations.CycleObservations`): only its own
workers' records, and the node's finish said once."""

from __future__ import annotations

from ft_core.events import (
    CheckpointLoaded,
    RankConnected,
    RankDisconnected,
    RankException,
)
from ft_core.launcher.cycle_observations import CycleObservations


def test_a_cycles_observations_keep_only_its_own_workers_records_and_say_once_when_the_node_finished():
    seen = CycleObservations(cycle=3, pids=frozenset({100, 101}))
    old = RankException(rank=0, pid=90, exception_type="ValueError", frames=[], iteration=1)  # an earlier cycle's
    assert not seen.observe(old) and seen.exceptions == []
    assert not seen.observe(CheckpointLoaded(rank=0, cycle=2, checkpoint="/c/old", step=1, time=1.0))
    assert not seen.observe(CheckpointLoaded(rank=0, cycle=3, checkpoint="/c/new", step=5, time=1.0))
    assert seen.loaded is not None and seen.loaded.checkpoint == "/c/new"
    assert not seen.observe(RankConnected(rank=0, local_rank=0, pid=100, restart_count=3, time=1.0))
    goodbye = [RankDisconnected(rank=r, pid=pid, graceful=True, training_finished=True, time=2.0 + r)
               for r, pid in ((0, 100), (1, 101))]
    assert [seen.observe(g) for g in goodbye] == [False, True]  # the last rank's goodbye finishes the node
    assert not seen.observe(goodbye[1])  # once
    assert seen.connected == {100} and seen.gone_at == {100: 2.0, 101: 3.0} and seen.node_finished
