"""Several ft_launcher processes on loopback acting as nodes of one job, on each rendezvous backend.

Every test runs on c10d (the first launcher hosts the rendezvous store), on
etcd-v2 and on etcd-v3 (a real etcd server, the session's ``etcd_server``
fixture; skipped with the reason when etcd is not installed). One worker per node keeps these
tests affordable: every worker imports torch.
"""

from __future__ import annotations

import uuid

import pytest
from helpers import wait_for
from launcher_helpers import Rendezvous, exit_event

from ft_core.launcher.outcome import LEFT_UNFINISHED_EXIT_CODE

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=["c10d", "etcd-v2", "etcd-v3"])
def rdzv(request) -> Rendezvous:
    if request.param == "c10d":
        return Rendezvous("c10d")
    return Rendezvous(request.param, request.getfixturevalue("etcd_server"))


def start_job_with_spare(launchers, tmp_path, rdzv, **fault_env):
    """Nodes A and B run the job (--nnodes=2:2); C waits as a hot spare in torch's redundancy list.

    The fault (``fault_env``) fires once the trigger file exists, i.e. after C is a spare.
    """
    trigger = tmp_path / "fire"
    flags = rdzv.flags("2:2")
    env = {"FT_TEST_FAULT_AFTER": str(trigger)}
    a = launchers.start(*flags, name="A", nproc=1, **env)
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, **env, **fault_env)
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    c = launchers.start(*flags, name="C", nproc=1, **env)
    wait_for(lambda: rdzv.spares_waiting() == 1, 120, "C to wait as a hot spare", interval=0.5)
    trigger.touch()
    return a, b, c


def test_crash_then_hang_on_one_node_restart_the_workers_of_every_node(launchers, rdzv):
    flags = rdzv.flags("2")
    # A would only notice the hang after 60 s by itself: its restart must come from B's decision.
    a = launchers.start(*flags, "--ft-rank-heartbeat-timeout=60", name="A", nproc=1)
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, FT_TEST_FAULT="exit3,hang", FT_TEST_FAULT_RANK="local0")
    assert b.wait(240) == 0, b.output()[-3000:]
    assert a.wait(60) == 0, a.output()[-3000:]
    assert b.events("hang_detected") and not a.events("hang_detected")
    for node in (a, b):
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1, 2]
        assert [e["restarts"] for e in node.events("cycle_start")] == [0, 1, 2]  # each fault counted once
        # Every node names the same cause: B's worker, which crashed in cycle 0 and hung in cycle 1.
        crashed, hung = (next(iter(e["workers"])) for e in b.events("cycle_start")[:2])
        causes = [e["cause"] for e in node.events("restart")]
        assert len(causes) == 2, causes
        assert causes[0].startswith(f"rank {crashed} (pid") and "exited with code 3" in causes[0], causes
        assert causes[1].startswith(f"rank {hung} (pid") and "hung" in causes[1], causes
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(0, 2), (1, 2)}


def test_excluded_node_is_replaced_by_the_hot_spare(launchers, tmp_path, rdzv):
    a, b, c = start_job_with_spare(launchers, tmp_path, rdzv, FT_TEST_FAULT="exclude", FT_TEST_FAULT_RANK="local0")
    assert b.wait(120) == LEFT_UNFINISHED_EXIT_CODE, b.output()[-3000:]  # it left an unfinished job: requeue
    assert "ExcludeThisNode" in exit_event(b)["reason"]
    assert a.wait(180) == 0, a.output()[-3000:]
    assert c.wait(60) == 0, c.output()[-3000:]
    assert [e["cycle"] for e in a.events("cycle_start")] == [0, 1]
    assert [e["cycle"] for e in c.events("cycle_start")] == [1]  # the spare ran only the second cycle
    assert [e["cycle"] for e in b.events("cycle_start")] == [0]
    assert a.events("cycle_start")[1]["restarts"] == 0  # an exclusion is not a fault
    assert {r["cycle"] for r in launchers.worker_records("finished")} == {1}
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"


@pytest.mark.parametrize("rdzv", ["c10d"], indirect=True)  # the job store rule is the same on every backend
@pytest.mark.parametrize("reported", ["all", "0"], ids=["every_rank_reported_0", "rank_1_never_reported_1"])
def test_a_finished_job_is_known_from_every_nodes_ranks(launchers, rdzv, reported):
    # Both ranks finish; B's rank aborts at exit. When every rank of the job reported training complete
    # (no flag file), both launchers exit 0 after one cycle, no restart. When one rank never reported it,
    # the abort is a fault: with no restart left, every launcher exits 1.
    flags = rdzv.flags("2", max_restarts=0)
    env = {"FT_TEST_REPORT_FINISHED": reported, "FT_TEST_STEPS": "3"}
    a = launchers.start(*flags, name="A", nproc=1, **env)
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, FT_TEST_FAULT="abort_at_exit", FT_TEST_FAULT_RANK="local0", **env)
    for node in (b, a):
        assert node.wait(120) == (0 if reported == "all" else 1), node.output()[-3000:]
        assert [e["cycle"] for e in node.events("cycle_start")] == [0] and node.events("restart") == []
    (abort,) = [e for e in b.events("worker_exit") if e.get("signal") == "SIGABRT"]
    if reported == "all":
        assert abort["cause"] == "exit after training finished"
        assert "every rank reported training complete" in exit_event(b)["reason"]
    else:
        assert abort["cause"] == "crash"
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"


def test_shutdown_workload_stops_every_launcher(launchers, tmp_path, rdzv):
    a, b, c = start_job_with_spare(launchers, tmp_path, rdzv, FT_TEST_FAULT="shutdown", FT_TEST_FAULT_RANK="local0")
    for node in (b, a, c):
        assert node.wait(120) == 93, node.output()[-3000:]
        assert "ShutdownWorkload" in exit_event(node)["reason"]
    assert not a.events("restart") and not b.events("restart")
    assert not c.events("cycle_start")


def test_a_requeued_job_on_etcd_starts_with_fresh_state(launchers, tmp_path, etcd_server):
    # Under SLURM the run id was $SLURM_JOB_ID, so on etcd (which outlives the launchers) a requeued job
    # inherited the previous run's stop for good. Run 0 stops the job (ShutdownWorkload: 93); run 1,
    # the same job requeued, starts from a clean slate and finishes.
    port = etcd_server.members[0].client_port
    flags = ("--nnodes=1", "--rdzv-backend=etcd-v2", f"--rdzv-endpoint=127.0.0.1:{port}", "--local-addr=127.0.0.1",
             "--max-restarts=1")
    job = {"SLURM_JOB_ID": f"t{uuid.uuid4().hex[:10]}", "SLURM_JOB_NODELIST": "localhost"}
    first = launchers.start(*flags, name="run0", nproc=1, FT_TEST_FAULT="shutdown", SLURM_RESTART_COUNT="0", **job)
    assert first.wait(120) == 93, first.output()[-3000:]
    second = launchers.start(*flags, name="run1", nproc=1, SLURM_RESTART_COUNT="1", **job)
    assert second.wait(120) == 0, second.output()[-3000:]
    ids = [node.events("launcher_started")[0]["run_id"] for node in (first, second)]
    assert ids == [f"{job['SLURM_JOB_ID']}.0", f"{job['SLURM_JOB_ID']}.1"]
    assert second.events("cycle_start")[0]["restarts"] == 0
    assert launchers.alive_now() == []
