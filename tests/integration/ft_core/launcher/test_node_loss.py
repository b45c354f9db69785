"""Losses the etcd backends survive and c10d does not: a whole node (even the first) or an etcd member.

(etcd-v3 on a 3-member cluster, its leader and a majority lost: tests/integration/ft_core/launcher/rendezvous/test_etcd_v3.py.)

With c10d the first launcher hosts the rendezvous store and the job-wide state;
its loss ends the job. With etcd both live in the etcd cluster, so the other
launchers (plus a hot spare) rendezvous again and resume from the checkpoint,
and a 3-member etcd cluster keeps serving when one member dies.
"""

from __future__ import annotations

import pytest
from helpers import wait_for
from launcher_helpers import Rendezvous, exit_event

pytestmark = pytest.mark.timeout(300)


def resume_step(path) -> int:
    try:
        with open(path) as handle:
            return int(handle.read())
    except (FileNotFoundError, ValueError):
        return 0


def test_c10d_loses_the_job_with_the_node_that_hosts_its_store(launchers, tmp_path):
    """The limit etcd removes: the other launcher fails promptly (exit 1) instead of waiting forever."""
    rdzv = Rendezvous("c10d")
    env = {"FT_TEST_FAULT_AFTER": str(tmp_path / "never")}  # workers step until stopped
    host = launchers.start(*rdzv.flags("2"), name="A", nproc=1, **env)
    rdzv.wait_ready()
    other = launchers.start(*rdzv.flags("2"), name="B", nproc=1, **env)
    for node in (host, other):
        node.wait_event("rank_connected", 180)
    host.kill()
    assert other.wait(120) == 1, other.output()[-3000:]
    assert exit_event(other)["reason"].startswith("launcher error"), exit_event(other)


@pytest.mark.parametrize("backend", ["etcd-v2", "etcd-v3"])
def test_sigkill_of_the_first_node_is_survived_by_the_others_and_the_spare(launchers, tmp_path, etcd_server, backend):
    if backend == "etcd-v3":
        pytest.importorskip("etcd3gw", reason="etcd-v3 needs etcd3gw (pip install -e '.[etcd]')")
    # keep_alive_interval=2: torch drops a silent node from the rendezvous after 3 missed keep-alives (6 s).
    rdzv = Rendezvous(backend, etcd_server, keep_alive=2)
    checkpoint, trigger = tmp_path / "checkpoint", tmp_path / "fire"
    # Workers that start before the trigger exists step until stopped; later ones run 5 steps more.
    env = {"FT_TEST_FAULT_AFTER": str(trigger), "FT_TEST_RESUME_FILE": str(checkpoint)}
    a = launchers.start(*rdzv.flags("2:2"), name="A", nproc=1, **env)
    b = launchers.start(*rdzv.flags("2:2"), name="B", nproc=1, **env)
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    c = launchers.start(*rdzv.flags("2:2"), name="C", nproc=1, **env)
    wait_for(lambda: rdzv.spares_waiting() == 1, 120, "C to wait as a hot spare", interval=0.5)
    wait_for(lambda: resume_step(checkpoint) >= 3, 60, "a checkpoint of at least 3 steps")
    (first,) = [node for node in (a, b) if node.events("cycle_start")[0]["group_rank"] == 0]
    (other,) = {a, b} - {first}
    trigger.touch()
    first.kill()  # SIGKILL: the launcher that serves the workers' store of cycle 0, and its monitor
    saved = resume_step(checkpoint)

    for node in (other, c):
        assert node.wait(180) == 0, node.output()[-3000:]
    assert first.proc.returncode == -9
    assert [e["cycle"] for e in other.events("cycle_start")] == [0, 1]
    assert [e["cycle"] for e in c.events("cycle_start")] == [1]  # the spare took the lost node's place
    assert other.events("cycle_start")[1]["restarts"] == 1  # the job-wide budget, read from etcd
    (restart,) = other.events("restart")
    assert restart["kind"] == "crash"  # its worker lost its peer
    # The new cycle resumed from the checkpoint the lost node's rank 0 had written.
    resumed = {r["rank"]: r["step"] for r in launchers.worker_records("resumed") if r["cycle"] == 1}
    assert resumed[0] == saved >= 3 and resumed[1] >= saved, (resumed, saved)
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(0, 1), (1, 1)}
    # No stale participant: the lost launcher is nowhere in the rendezvous state it left behind.
    state = rdzv.state()
    listed = [*state.participants, *state.wait_list, *state.redundancy_list, *state.last_heartbeats]
    assert first.proc.pid not in {node.pid for node in listed} and len(state.participants) == 2, state
    assert {other.proc.pid, c.proc.pid} == {node.pid for node in state.participants}


def test_an_etcd_member_lost_does_not_disturb_the_job(launchers, tmp_path, etcd_cluster3):
    rdzv = Rendezvous("etcd-v2", etcd_cluster3)  # the launchers know member 0: the one that dies
    trigger = tmp_path / "fire"
    env = {"FT_TEST_FAULT_AFTER": str(trigger), "FT_TEST_FAULT": "exit3", "FT_TEST_FAULT_RANK": "1"}
    a = launchers.start(*rdzv.flags("2"), name="A", nproc=1, **env)
    b = launchers.start(*rdzv.flags("2"), name="B", nproc=1, **env)
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    lost, *rest = etcd_cluster3.members
    lost.kill()
    wait_for(lambda: all(m.healthy() for m in rest), 60, "the remaining etcd members to elect a leader")
    trigger.touch()  # a crash now: the restart's decision and rendezvous go through the 2 members left

    for node in (a, b):
        assert node.wait(180) == 0, node.output()[-3000:]
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
        assert [e["restarts"] for e in node.events("cycle_start")] == [0, 1]
        (restart,) = node.events("restart")
        assert "exited with code 3" in restart["cause"]
        assert "JobStoreUnavailable" not in node.output()
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(0, 1), (1, 1)}
