"""Restarts that cannot help stop: the same exception at the same place and iteration, twice (real launcher).

Two ranks under ft_launcher (``launcher_workers/worker.py``, gloo). Rank 1 raises in step 3 of
every cycle: the client reports the exception (type, innermost user frames, iteration) to its
monitor before the rank dies, the launcher records a ``fault_fingerprint`` for each cycle, and
the second identical one stops the job with the do-not-requeue code (93) instead of spending
the other 8 restarts of the budget. Beside it, the same rank failing at a *different* step
each cycle is not the same fault: it restarts as always.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from helpers import wait_for
from launcher_helpers import WORKER, LauncherGroup, Rendezvous, exit_event

from ft_core.launcher.outcome import LEFT_UNFINISHED_EXIT_CODE

pytestmark = pytest.mark.timeout(240)

COMMON = dict(FT_TEST_FAULT="exception", FT_TEST_FAULT_CYCLES="all", FT_TEST_FAULT_RANK="1", FT_TEST_SECTIONS="1")


def test_the_same_exception_twice_stops_the_job_with_93_and_a_headline(tmp_path):
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start("--max-restarts=9", FT_TEST_FAULT_STEP="3", **COMMON)
        assert node.wait(180) == 93, node.output()[-4000:]
        assert len(node.events("cycle_start")) == 2  # not 10
        prints = node.events("fault_fingerprint")
        assert [(p["kind"], p["culprits"], p["iteration"], p["exception_type"]) for p in prints] == \
            [("exception", [1], 3, "RuntimeError")] * 2
        assert prints[0]["frames"][0].startswith("worker.py:") and prints[0]["frames"][0].endswith(" inject")
        reason = exit_event(node)["reason"]
        assert reason.startswith("RuntimeError at worker.py:") and "on rank 1 at iteration 3, 2 times in a row" in reason
        assert "restarting cannot help" in node.output()
        # The exit summary's budget by cause: one restart for the first (transient-looking) fault, then the stop.
        assert "  restarts   : 1 by cause: 1 transient\n" in node.output()
        assert "  stopped by : deterministic fault: RuntimeError at worker.py:" in node.output()
        assert [(d["action"], d["outcome"]) for d in node.events("fault_decision")] == [("restart", "restart"),
                                                                                       ("stop", "stop")]
        assert launchers.alive_now() == []


def test_the_same_rank_failing_at_another_step_each_cycle_restarts_as_always(tmp_path):
    with LauncherGroup(tmp_path) as launchers:
        # Step 1 in cycle 0, step 2 in cycle 1 (FT_TEST_FAULT_STEP is per job: vary it through the cycle list).
        node = launchers.start("--max-restarts=2", "--ft-max-identical-faults=2", FT_TEST_FAULT="exception,exception",
                               FT_TEST_FAULT_RANK="1", FT_TEST_SECTIONS="1", FT_TEST_FAULT_STEP_BY_CYCLE="1,2")
        assert node.wait(180) == 0, node.output()[-4000:]
        assert [p["iteration"] for p in node.events("fault_fingerprint")] == [1, 2]
        assert len(node.events("cycle_start")) == 3


BAD_CHECKPOINT = os.path.join(os.path.dirname(WORKER), "bad_checkpoint.py")


def test_a_nan_loss_right_after_a_resume_marks_the_checkpoint_bad_and_the_job_finishes_from_an_older_one(tmp_path):
    # Cycle 0 saves step 4 and a poisoned step 8 (NaN momentum, finite weights), then rank 1 crashes.
    # Cycle 1 resumes from step 8, the loss turns NaN: NonFiniteLossError, fingerprinted nonfinite_loss,
    # step 8 marked bad. Cycle 2 skips it (checkpoint_rejected) and finishes from step 4: one extra restart.
    out = tmp_path / "ckpt"
    out.mkdir()
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start("--max-restarts=5", script=(BAD_CHECKPOINT, f"--out={out}"))
        assert node.wait(180) == 0, node.output()[-4000:]
        poisoned = str(out / "ckpt_step8.pt")
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1, 2]
        first, second = node.events("fault_fingerprint")
        assert first.get("resumed_from") is None  # cycle 0 started fresh
        assert (second["kind"], second["resumed_from"], second["resumed_step"]) == ("nonfinite_loss", poisoned, 8)
        (marked,) = node.events("checkpoint_marked_bad")
        assert marked["checkpoint"] == poisoned and "non-finite loss" in marked["reason"]
        rejected = node.events("checkpoint_rejected")
        assert {(r["rank"], r["cycle"], r["checkpoint"]) for r in rejected} == {(0, 2, poisoned), (1, 2, poisoned)}
        assert all(r["reason"].startswith("marked bad: ") for r in rejected)
        loaded = {(e["cycle"], e["rank"]): (e["checkpoint"], e["step"]) for e in node.events("checkpoint_loaded")}
        assert loaded == {(1, 0): (poisoned, 8), (1, 1): (poisoned, 8),
                          (2, 0): (str(out / "ckpt_step4.pt"), 4), (2, 1): (str(out / "ckpt_step4.pt"), 4)}
        for rank in (0, 1):
            assert json.loads((out / f"r{rank}_c2.json").read_text()) == {"start_step": 4, "end_step": 12}
        assert "  restarts   : 2 by cause: 1 transient, 1 bad checkpoint\n" in node.output()
        assert f"  rejected   : 1 checkpoint(s): {poisoned} (marked bad: " in node.output()
        assert launchers.alive_now() == []


def test_random_kills_restart_as_always_and_a_peers_reaction_is_never_blamed(tmp_path):
    # Transient faults (issue 25): a random rank killed (exit 3 or SIGKILL, no report) at a random step, the
    # same step in every cycle (the worst case for a false "deterministic" verdict), 3 cycles in one job.
    # Its peer's all-reduce then fails: it raises a gloo error the client reports, often before the launcher
    # ends the cycle. That exception is a reaction to the kill, never the fault: the culprit is the killed rank,
    # and a crash never stops the job as "deterministic".
    rng = random.Random()
    rank, step = rng.choice((0, 1)), rng.randint(1, 3)
    kinds = [rng.choice(("exit3", "sigkill")) for _ in range(3)]
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start("--max-restarts=3", FT_TEST_FAULT=",".join(kinds), FT_TEST_FAULT_RANK=str(rank),
                               FT_TEST_FAULT_STEP=str(step), FT_TEST_SECTIONS="1")
        assert node.wait(180) == 0, (kinds, rank, step, node.output()[-4000:])
        assert len(node.events("cycle_start")) == 4
        prints = node.events("fault_fingerprint")
        expected = [("crash" if kind == "exit3" else "signal", [rank]) for kind in kinds]
        assert [(p["kind"], p["culprits"]) for p in prints] == expected, (kinds, rank, step, prints,
                                                                         node.events("rank_exception"))
        assert all(p["nodes"] == [exit_event(node)["node"]] for p in prints)
        assert "  restarts   : 3 by cause: 3 transient\n" in node.output()
        assert launchers.alive_now() == []


def test_an_exception_raised_first_is_blamed_though_its_peer_then_dies_without_a_report(tmp_path):
    # The other order: rank 1 raises (reported), rank 0's all-reduce loses its peer and rank 0 exits 3 at once,
    # without a report. The exception came first: it is the fault.
    with LauncherGroup(tmp_path) as launchers:
        node = launchers.start("--max-restarts=0", FT_TEST_FAULT="exception", FT_TEST_FAULT_RANK="1",
                               FT_TEST_FAULT_STEP="2", FT_TEST_SECTIONS="1", FT_TEST_PEER_LOSS="exit3")
        assert node.wait(180) == 1, node.output()[-4000:]  # no restart left
        (fingerprint,) = node.events("fault_fingerprint")
        assert (fingerprint["kind"], fingerprint["culprits"], fingerprint["iteration"]) == ("exception", [1], 2)
        assert launchers.alive_now() == []


def start_with_spare(launchers: LauncherGroup, rdzv: Rendezvous, flags: list[str], env: dict[str, str],
                     spare_in_cycle: int):
    """Nodes A and B run the job (one rank each; B's is the one ``env``'s fault targets); C starts once B
    began cycle ``spare_in_cycle`` and is returned when it waits as a hot spare."""
    a = launchers.start(*flags, name="A", nproc=1, FT_TEST_FAULT_RANK="99", **env)
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, FT_TEST_FAULT_RANK="local0", **env)
    b.wait_event("cycle_start", 120, cycle=spare_in_cycle)
    c = launchers.start(*flags, name="C", nproc=1, FT_TEST_FAULT_RANK="99", **env)
    wait_for(lambda: rdzv.spares_waiting() == 1, 120, "C to wait as a hot spare", interval=0.2)
    return a, b, c


def test_faults_that_follow_one_node_exclude_it_and_the_hot_spare_takes_its_place(tmp_path):
    # A hosts the rendezvous store, B runs the other rank. B's rank fails in cycles 0-2, differently each
    # time (an exception, exit 3, SIGKILL): three different faults on one node (--ft-suspect-node-faults, 3).
    # C joins as a hot spare during cycle 2, whose fault waits for it. B leaves, C takes its place, and the
    # job finishes in cycle 3. No process group (FT_TEST_TORCH=0): the healthy ranks step until they are
    # stopped, and no rank imports torch.
    rdzv = Rendezvous("c10d")
    trigger = tmp_path / "fire"
    flags = rdzv.flags("2:2", max_restarts=5)
    env = dict(FT_TEST_TORCH="0", FT_TEST_FAULT="exception,exit3,sigkill", FT_TEST_FAULT_AFTER=str(trigger),
               FT_TEST_FAULT_AFTER_CYCLE="2")
    with LauncherGroup(tmp_path) as launchers:
        a, b, c = start_with_spare(launchers, rdzv, flags, env, spare_in_cycle=2)
        trigger.touch()
        assert b.wait(120) == LEFT_UNFINISHED_EXIT_CODE, b.output()[-4000:]
        assert a.wait(120) == 0, a.output()[-4000:]
        assert c.wait(60) == 0, c.output()[-4000:]
        b_node = exit_event(b)["node"]
        prints = b.events("fault_fingerprint")
        assert [p["kind"] for p in prints] == ["exception", "crash", "signal"]
        assert all(p["nodes"] == [b_node] for p in prints)
        decisions = [(d["cycle"], d["action"], d["outcome"], d.get("suspect_node")) for d in a.events("fault_decision")]
        assert decisions == [(0, "restart", "restart", None), (1, "restart", "restart", None),
                             (2, "exclude_node", "restart", b_node)]
        assert b.events("fault_decision")[-1]["outcome"] == "leave"
        assert f"3 different faults in a row on node {b_node}" in exit_event(b)["reason"]
        assert [e["cycle"] for e in c.events("cycle_start")] == [3]  # the spare ran the last cycle
        assert [e["cycle"] for e in a.events("cycle_start")] == [0, 1, 2, 3]
        assert launchers.alive_now() == []


def test_a_hot_spare_waiting_through_fault_restarts_never_makes_them_endless(tmp_path):
    # A job at its --nnodes maximum (2:2) with a hot spare C waiting; B's rank fails in cycle 0, once C
    # waits. A spare that syncs in the instant a restarting node has left the round
    # lands in torch's wait list; torch's scale-up rule ("new nodes are waiting") then restarted the job
    # again and again, each new round leaving a node waiting: the job never finished (cycle 98 after 2
    # minutes). Now a waiting node where no room is left is a spare: one fault restart, no membership
    # restart, every launcher exits 0 (the one left waiting is released as a spare).
    rdzv = Rendezvous("c10d")
    trigger = tmp_path / "fire"
    flags = rdzv.flags("2:2", max_restarts=4)
    # Cycle 0: the healthy rank steps until it is stopped (no process group: it cannot see its peer die), and B's
    # rank fails once C waits (the trigger file: on a loaded machine C's start can outlast any number of steps);
    # cycle 1, whoever its nodes are, runs its 20 steps and finishes.
    env = dict(FT_TEST_TORCH="0", FT_TEST_FAULT="exit3", FT_TEST_STEPS="20", FT_TEST_FAULT_STEP="1",
               FT_TEST_FAULT_AFTER=str(trigger))
    with LauncherGroup(tmp_path) as launchers:
        a, b, c = start_with_spare(launchers, rdzv, flags, env, spare_in_cycle=0)
        assert not a.events("restart"), "the first fault came before the spare waited: the test proves nothing"
        trigger.touch()
        for node in (a, b, c):
            assert node.wait(120) == 0, node.output()[-4000:]
        restarts = [e["kind"] for node in (a, b, c) for e in node.events("restart")]
        assert "membership" not in restarts, restarts
        assert [e["cycle"] for e in a.events("cycle_start")] == [0, 1]
        # Cycle 1 ran on two of the three nodes; the third ended as a released spare.
        assert sorted(any(e["cycle"] == 1 for e in node.events("cycle_start")) for node in (b, c)) == [False, True]
        assert launchers.alive_now() == []
