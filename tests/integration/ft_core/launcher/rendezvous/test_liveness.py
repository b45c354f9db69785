"""A lost node leaves the rendezvous in seconds (ft_core.launcher.rendezvous.liveness), with real launchers on loopback.

* A node SIGKILLed (its launcher, monitor and workers): the other node's rank fails at its
  all-reduce, its launcher leaves the round; the lost node's liveness beat stops, so the
  node and the hot spare remove it after ``lost_after`` (3 s by default) instead of torch's
  keep-alive expiry (10 to 15 s with its defaults, which these launchers keep), and the
  spare takes its place at once (the node that removed it marked it lost: the spare does
  not wait for it to rejoin first).
* A node slow to leave (its rank's preemption save takes 8 s on SIGTERM) beats all along:
  it is waited for, nobody removes it, and the spare stays a spare.
"""

from __future__ import annotations

import re

import pytest
from helpers import wait_for
from launcher_helpers import rendezvous_for

pytestmark = pytest.mark.timeout(300)

#: The line of :data:`ft_core.launcher.rendezvous.liveness.LOST_LINE` naming a node by its launcher's pid.
LOST = r"node 127\.0\.0\.1_{pid}_0 lost: its liveness beat did not change for (\d+\.\d) s; removed from the round"


@pytest.mark.parametrize("backend", ["c10d", "etcd-v3"])
def test_a_node_killed_is_removed_on_its_stopped_beat_and_the_spare_takes_its_place(launchers, request, tmp_path,
                                                                                     backend):
    rdzv = rendezvous_for(request, backend)
    trigger = tmp_path / "fire"
    # Workers that start before the trigger exists step until stopped; later ones run 5 steps more.
    env = {"FT_TEST_FAULT_AFTER": str(trigger)}
    a = launchers.start(*rdzv.flags("2:2"), name="A", nproc=1, **env)  # with c10d: the store's host, never lost
    rdzv.wait_ready()
    b = launchers.start(*rdzv.flags("2:2"), name="B", nproc=1, **env)
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    c = launchers.start(*rdzv.flags("2:2"), name="C", nproc=1, **env)
    wait_for(lambda: rdzv.spares_waiting() == 1, 120, "C to wait as a hot spare", interval=0.5)
    trigger.touch()
    b.kill()  # SIGKILL of its launcher, monitor and workers: no goodbye

    for node in (a, c):
        assert node.wait(180) == 0, node.output()[-3000:]
    assert [e["cycle"] for e in a.events("cycle_start")] == [0, 1]
    assert [e["cycle"] for e in c.events("cycle_start")] == [1]  # the spare took the lost node's place
    # Removed by the beat rule (torch's keep-alive drop logs no such line), after lost_after and before
    # torch's expiry: at least 3 s unchanged, read at most one second (a wait of the rendezvous) later.
    spans = [float(found) for node in (a, c) for found in re.findall(LOST.format(pid=b.proc.pid), node.output())]
    assert spans and all(3.0 <= span < 5.0 for span in spans), (a.output()[-3000:], c.output()[-3000:])
    named = set(re.findall(r"node (\S+) lost: its liveness beat", a.output() + c.output()))
    assert named == {f"127.0.0.1_{b.proc.pid}_0"}, named  # nobody else
    # The remover marked B lost: the spare took the free place at once, without letting B "rejoin first".
    assert "rejoin first" not in c.output(), c.output()[-3000:]


@pytest.mark.parametrize("backend", ["c10d", "etcd-v3"])
def test_a_node_slow_to_leave_keeps_beating_is_waited_for_and_the_spare_stays_a_spare(launchers, request, tmp_path,
                                                                                     backend):
    rdzv = rendezvous_for(request, backend)
    trigger = tmp_path / "fire"
    flags = [*rdzv.flags("2:2"), "--workers-stop-timeout=30"]
    env = {"FT_TEST_TORCH": "0", "FT_TEST_FAULT_AFTER": str(trigger)}
    # A's rank saves for 8 s when told to stop (SIGTERM): A leaves the round 8 s after B, beating all along.
    a = launchers.start(*flags, name="A", nproc=1, FT_TEST_ON_SIGTERM="save", FT_TEST_SAVE_TIME="8",
                        FT_TEST_SAVE_FILE=str(tmp_path / "save"), **env)
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, FT_TEST_FAULT="exit3", FT_TEST_FAULT_RANK="1", **env)
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    c = launchers.start(*flags, name="C", nproc=1, **env)
    wait_for(lambda: rdzv.spares_waiting() == 1, 120, "C to wait as a hot spare", interval=0.5)
    trigger.touch()  # B's rank exits with code 3: a restart of both nodes

    for node in (a, b, c):
        assert node.wait(180) == 0, node.output()[-3000:]
    assert (tmp_path / "save.rank0").exists()  # A's rank did save (it was slow for the reason given)
    for node in (a, b):
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1], node.output()[-3000:]
    assert not c.events("cycle_start"), c.output()[-3000:]  # the spare never took a place
    for node in (a, b, c):
        assert " lost: its liveness beat" not in node.output(), node.output()[-3000:]
