"""Several ft_launcher processes on loopback acting as nodes of one job (c10d rendezvous).

One worker per node keeps these tests affordable: every worker imports torch.
"""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest
from helpers import free_port, wait_for
from launcher_helpers import LauncherGroup, exit_event, wait_listening
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

RUN_ID = "ft-test"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def launchers(tmp_path):
    with LauncherGroup(tmp_path) as group:
        yield group


def rendezvous_flags(port: int, nnodes: str) -> list[str]:
    return [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={RUN_ID}", "--local-addr=127.0.0.1", "--max-restarts=3"]


def spares_waiting(port: int) -> int:
    """How many nodes wait in the redundancy list of torch's rendezvous state (read from its store)."""
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    state = C10dRendezvousBackend(store, RUN_ID).get_state()
    return len(pickle.loads(state[0]).redundancy_list) if state is not None else 0


def start_job_with_spare(launchers, tmp_path, **fault_env):
    """Nodes A and B run the job (--nnodes=2:2); C waits as a hot spare in torch's redundancy list.

    The fault (``fault_env``) fires once the trigger file exists, i.e. after C is a spare.
    """
    port = free_port()
    trigger = tmp_path / "fire"
    flags = rendezvous_flags(port, "2:2")
    env = {"FT_TEST_FAULT_AFTER": str(trigger)}
    a = launchers.start(*flags, name="A", nproc=1, **env)
    wait_listening(port)
    b = launchers.start(*flags, name="B", nproc=1, **env, **fault_env)
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    c = launchers.start(*flags, name="C", nproc=1, **env)
    wait_for(lambda: spares_waiting(port) == 1, 120, "C to wait as a hot spare", interval=0.5)
    trigger.touch()
    return a, b, c


def test_hang_on_one_node_restarts_the_workers_of_every_node(launchers):
    port = free_port()
    flags = rendezvous_flags(port, "2")
    # A would only notice the hang after 60 s by itself: its restart must come from B's decision.
    a = launchers.start(*flags, "--ft-rank-heartbeat-timeout=60", name="A", nproc=1)
    wait_listening(port)
    b = launchers.start(*flags, name="B", nproc=1, FT_TEST_FAULT="hang", FT_TEST_FAULT_RANK="local0")
    assert b.wait(240) == 0, b.output()[-3000:]
    assert a.wait(60) == 0, a.output()[-3000:]
    assert b.events("hang_detected") and not a.events("hang_detected")
    for node in (a, b):
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
        assert [e["restarts"] for e in node.events("cycle_start")] == [0, 1]  # one restart, counted once
        assert len(node.events("restart")) == 1
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(0, 1), (1, 1)}


def test_excluded_node_is_replaced_by_the_hot_spare(launchers, tmp_path):
    a, b, c = start_job_with_spare(launchers, tmp_path, FT_TEST_FAULT="exclude", FT_TEST_FAULT_RANK="local0")
    assert b.wait(120) == 0, b.output()[-3000:]
    assert "ExcludeThisNode" in exit_event(b)["reason"]
    assert a.wait(180) == 0, a.output()[-3000:]
    assert c.wait(60) == 0, c.output()[-3000:]
    assert [e["cycle"] for e in a.events("cycle_start")] == [0, 1]
    assert [e["cycle"] for e in c.events("cycle_start")] == [1]  # the spare ran only the second cycle
    assert [e["cycle"] for e in b.events("cycle_start")] == [0]
    assert a.events("cycle_start")[1]["restarts"] == 0  # an exclusion is not a fault
    assert {r["cycle"] for r in launchers.worker_records("finished")} == {1}


def test_shutdown_workload_stops_every_launcher(launchers, tmp_path):
    a, b, c = start_job_with_spare(launchers, tmp_path, FT_TEST_FAULT="shutdown", FT_TEST_FAULT_RANK="local0")
    for node in (b, a, c):
        assert node.wait(120) == 93, node.output()[-3000:]
        assert "ShutdownWorkload" in exit_event(node)["reason"]
    assert not a.events("restart") and not b.events("restart")
    assert not c.events("cycle_start")
