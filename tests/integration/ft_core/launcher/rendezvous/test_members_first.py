"""A restart keeps its nodes (ft_core.launcher.rendezvous.members_first), with real launchers on loopback.

Nodes A and B run a job at its maximum (``--nnodes=2:2``), C waits as a hot spare. B's rank
crashes in five cycles in a row; every launcher is alive, so each restart is the same two
nodes with the same ranks, and the spare, woken by every new round as they are, lets them
in first. A node that left the job is still replaced by the spare at once: see
``tests/integration/ft_core/launcher/test_multi_node.py`` (exclusion) and ``test_node_loss.py``.
"""

from __future__ import annotations

import pytest
from helpers import wait_for
from launcher_helpers import rendezvous_for

pytestmark = pytest.mark.timeout(300)

#: Torch-free workers (RankMonitorClient only): three nodes and four cycles stay cheap.
ENV = {"FT_TEST_TORCH": "0", "FT_TEST_STEPS": "10"}
FLAGS = ("--monitor-interval=0.1", "--ft-stack-dump-timeout=0.2")


@pytest.mark.parametrize("backend", ["c10d", "etcd-v3"])
def test_restarts_keep_their_nodes_and_ranks_and_the_spare_stays_a_spare(launchers, request, tmp_path, backend):
    rdzv = rendezvous_for(request, backend)
    trigger = tmp_path / "fire"
    flags = [*rdzv.flags("2:2", max_restarts=5), *FLAGS]
    env = {**ENV, "FT_TEST_FAULT_AFTER": str(trigger)}
    a = launchers.start(*flags, name="A", nproc=1, **env)
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, FT_TEST_FAULT="exit3", FT_TEST_FAULT_RANK="local0",
                        FT_TEST_FAULT_CYCLES="<5", **env)
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    c = launchers.start(*flags, name="C", nproc=1, **env)
    wait_for(lambda: rdzv.spares_waiting() == 1, 120, "C to wait as a hot spare", interval=0.5)
    trigger.touch()
    for node in (a, b, c):
        assert node.wait(240) == 0, node.output()[-3000:]
    assert not c.events("cycle_start"), c.output()[-3000:]  # the spare never took a place
    for node in (a, b):
        starts = node.events("cycle_start")
        assert [e["cycle"] for e in starts] == [0, 1, 2, 3, 4, 5], node.output()[-3000:]
        assert len({tuple(sorted(e["workers"])) for e in starts}) == 1, starts  # the same rank(s) every cycle
