"""Torch's rendezvous woken by its next phase instead of polled (ft_core.launcher.rendezvous.wake), with real launchers.

Three launchers x 1 torch-free rank on loopback, on c10d (the first launcher hosts
the store) and etcd-v3 (the session's etcd server). Every launcher logs one line
per rendezvous with what its waits did; the tests read those lines:

* a restart whose nodes all come back (a rank crashed, a rank hung) completes on
  wake-ups: no wait of any node timed out on a change that had happened, and the
  nodes wrote torch's state in turn (about 3 writes each, next to no refused one);
* a node that declines the wake-up (``--rdzv-conf wake_on_change=0``, as a node
  without it would) polls as torch does and never passes a turn on: every node
  still joins the restart, the node after it waiting at most torch's second;
* a membership change (the hot spare replacing an excluded node) is torch's round:
  the spare waits in torch's redundancy list and takes the free place.
"""

from __future__ import annotations

import pytest
from helpers import wait_for
from launcher_helpers import Launcher, rendezvous_for

from ft_core.launcher.outcome import LEFT_UNFINISHED_EXIT_CODE
from ft_core.launcher.rendezvous.wake import RendezvousCounts, logged_rounds

pytestmark = pytest.mark.timeout(300)

NODES = 3
#: Torch-free workers (RankMonitorClient only), the scale tests' monitor interval: three nodes stay cheap.
ENV = {"FT_TEST_TORCH": "0", "FT_TEST_STEPS": "10"}
FLAGS = ("--monitor-interval=0.1", "--ft-rank-heartbeat-timeout=1.5", "--ft-stack-dump-timeout=0.2")


def rounds(node: Launcher) -> list[RendezvousCounts]:
    logged = logged_rounds(node.output())
    return [counts for _, counts in logged]


@pytest.mark.parametrize("backend", ["c10d", "etcd-v3"])
@pytest.mark.parametrize("fault", ["exit3", "hang"], ids=["crash", "hang"])
def test_a_restart_with_every_node_back_completes_on_wake_ups_not_polls(launchers, request, backend, fault):
    rdzv = rendezvous_for(request, backend)
    flags = [*rdzv.flags(str(NODES), max_restarts=1), *FLAGS]
    fault_env = {"FT_TEST_FAULT": fault, "FT_TEST_FAULT_RANK": "1", "FT_TEST_FAULT_STEP": "3"}
    first = launchers.start(*flags, name="node0", nproc=1, **ENV, **fault_env)
    rdzv.wait_ready()
    nodes = [first] + [launchers.start(*flags, name=f"node{i}", nproc=1, **ENV, **fault_env) for i in range(1, NODES)]
    for node in nodes:
        assert node.wait(180) == 0, node.output()[-3000:]
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
    assert all(len(rounds(node)) == 2 for node in nodes), [node.output()[-2000:] for node in nodes]
    restart = [rounds(node)[1] for node in nodes]  # each node's second rendezvous: the restart's round
    # No node learnt of the next round, or of its completion, by polling: every change woke its waiters.
    assert [counts.missed for counts in restart] == [0] * NODES, restart
    # All but the node completing the round waited for it (and for the round to open) and were woken.
    assert sum(counts.woken >= 1 for counts in restart) >= NODES - 1, restart
    assert all(counts.wake_ops >= 1 for counts in restart), restart  # told or woken: every node
    # In turn (.turns): each node leaves, waits and joins (about 3N writes; a keep-alive of torch's may add one
    # per node), and the compare-and-set refuses next to none (up to N^2/2 for N nodes writing at once).
    assert sum(counts.writes - counts.refused_writes for counts in restart) <= 4 * NODES, restart
    assert sum(counts.refused_writes for counts in restart) < NODES, restart


@pytest.mark.parametrize("backend", ["c10d", "etcd-v3"])
def test_a_node_that_polls_still_joins_the_restart_of_nodes_woken_on_change(launchers, request, backend):
    rdzv = rendezvous_for(request, backend)
    polling = rendezvous_for(request, backend, conf=("wake_on_change=0",))
    polling.run_id, polling.port = rdzv.run_id, rdzv.port  # the same job; only its --rdzv-conf differs
    fault_env = {"FT_TEST_FAULT": "exit3", "FT_TEST_FAULT_RANK": "1", "FT_TEST_FAULT_STEP": "3"}
    first = launchers.start(*rdzv.flags(str(NODES), max_restarts=1), *FLAGS, name="node0", nproc=1, **ENV,
                            **fault_env)
    rdzv.wait_ready()
    nodes = [first, launchers.start(*rdzv.flags(str(NODES), max_restarts=1), *FLAGS, name="node1", nproc=1, **ENV,
                                    **fault_env),
             launchers.start(*polling.flags(str(NODES), max_restarts=1), *FLAGS, name="poller", nproc=1, **ENV,
                             **fault_env)]
    for node in nodes:
        assert node.wait(180) == 0, node.output()[-3000:]
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
    assert rounds(nodes[2]) == []  # torch's own poll: no wake-up, nothing logged
    assert [len(rounds(node)) for node in nodes[:2]] == [2, 2]


@pytest.mark.parametrize("backend", ["c10d", "etcd-v3"])
def test_a_spare_replacing_an_excluded_node_goes_through_torchs_round(launchers, tmp_path, request, backend):
    rdzv = rendezvous_for(request, backend)
    trigger = tmp_path / "fire"
    flags = [*rdzv.flags("2:2"), *FLAGS]
    env = {**ENV, "FT_TEST_FAULT_AFTER": str(trigger)}
    a = launchers.start(*flags, name="A", nproc=1, **env)
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, **env, FT_TEST_FAULT="exclude", FT_TEST_FAULT_RANK="local0")
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    c = launchers.start(*flags, name="C", nproc=1, **env)
    wait_for(lambda: rdzv.spares_waiting() == 1, 120, "C to wait as a hot spare", interval=0.5)
    trigger.touch()
    assert b.wait(120) == LEFT_UNFINISHED_EXIT_CODE, b.output()[-3000:]
    assert a.wait(180) == 0, a.output()[-3000:]
    assert c.wait(60) == 0, c.output()[-3000:]
    assert [e["cycle"] for e in a.events("cycle_start")] == [0, 1]
    assert [e["cycle"] for e in c.events("cycle_start")] == [1]  # the spare took the excluded node's place
    assert len(rounds(c)) == 1  # the spare's one rendezvous: from torch's redundancy list into the free place
    assert {a.events("cycle_start")[1]["group_rank"], c.events("cycle_start")[0]["group_rank"]} == {0, 1}
