"""Culprit diagnosis with real launchers, real gloo all-reduce and real stack dumps.

Rank 1 hangs inside its ``step`` section before the all-reduce; its peer blocks
in that all-reduce and misses its deadline too. Whichever expires first, the
``diagnosis`` event and the headline name rank 1 and call the peer a waiter;
with two launchers every node's summary names the same culprit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from launcher_helpers import Rendezvous

pytestmark = pytest.mark.timeout(300)

#: Steps are tracked sections (timed 3 s); heartbeats are not what expires.
SECTION_FLAGS = ("--ft-rank-section-timeouts=step:3", "--ft-rank-heartbeat-timeout=60",
                 "--ft-num-warmup-iterations=0", "--max-restarts=2")
HANG = {"FT_TEST_SECTIONS": "1", "FT_TEST_FAULT": "hang", "FT_TEST_FAULT_STEP": "3", "FT_TEST_STEPS": "5"}


def test_the_hung_rank_is_named_not_the_rank_waiting_for_it_and_a_slow_rank_is_not_blamed(launchers):
    # Rank 0 is slow but healthy (1 s more per step, within the 3 s step timeout): it must be called a
    # waiter in cycle 0, and must not be killed in cycle 1, where nobody hangs.
    node = launchers.start(*SECTION_FLAGS, nproc=2, FT_TEST_FAULT_RANK="1", FT_TEST_LAGGARD_RANK="0", **HANG)
    assert node.wait(240) == 0, node.output()[-4000:]
    (diagnosis,) = node.events("diagnosis")
    assert (diagnosis["cycle"], diagnosis["culprits"], diagnosis["waiting"]) == (0, [1], [0]), diagnosis
    assert diagnosis["culprit_nodes"] == [node.events("launcher_started")[0]["node"]]
    hung_pid = int(node.events("cycle_start")[0]["workers"]["1"])
    assert diagnosis["headline"].startswith(
        f"rank 1 (node {diagnosis['culprit_nodes'][0]}, pid {hung_pid}) hung in section step at iteration 3 for ")
    assert diagnosis["headline"].endswith("; rank 0 was waiting for it"), diagnosis
    assert "blocked in a collective" in diagnosis["evidence"], diagnosis
    # The fault's fingerprint names the hung rank and where it hung (its stack's innermost user frame).
    (fingerprint,) = node.events("fault_fingerprint")
    assert (fingerprint["kind"], fingerprint["culprits"], fingerprint["iteration"]) == ("hang", [1], 3), fingerprint
    assert fingerprint["frames"][0].startswith("worker.py:") and fingerprint["frames"][0].endswith(" inject")
    output = node.output()
    assert diagnosis["headline"] in output
    assert f"culprit    : cycle 0: {diagnosis['headline']}" in output
    assert "faults     : 1 hang" in output
    # The restart row says what the diagnosis says, whichever rank expired first.
    assert "restart    : cycle 0: hang: rank(s) 1 hung, rank(s) 0 only waited (see culprit)" in output, output[-3000:]
    # No kill beyond the hang: cycle 1 (slow rank 0 included) ran to the end.
    assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
    assert {e["pid"] for e in node.events("hang_detected")} <= set(node.events("cycle_start")[0]["workers"].values())
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(0, 1), (1, 1)}
    # The goodput report names the same culprit and the waiter.
    report = json.loads(subprocess.run([sys.executable, "-m", "ft_core.launcher.observability.report", node.dir, "--json"], check=True,
                                       capture_output=True, text=True, timeout=60).stdout)
    (fault,) = report["faults"]
    assert (fault["culprit_rank"], fault["waiting"], fault["diagnosis"]) == (1, [0], diagnosis["headline"])


def test_every_node_names_the_same_culprit_and_the_healthy_node_says_so(launchers):
    rdzv = Rendezvous("c10d")
    flags = (*rdzv.flags("2", max_restarts=2), *SECTION_FLAGS[:3])
    a = launchers.start(*flags, name="A", nproc=1, FT_TEST_SECTIONS="1", FT_TEST_STEPS="5")
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, FT_TEST_FAULT_RANK="local0", **HANG)
    assert b.wait(240) == 0, b.output()[-4000:]
    assert a.wait(60) == 0, a.output()[-4000:]
    b_node = b.events("launcher_started")[0]["node"]
    (culprit,) = (int(r) for r in b.events("cycle_start")[0]["workers"])
    (waiter,) = (int(r) for r in a.events("cycle_start")[0]["workers"])
    seen = []
    for launcher in (a, b):
        (diagnosis,) = launcher.events("diagnosis")
        seen.append({k: diagnosis[k] for k in ("cycle", "culprits", "waiting", "culprit_nodes", "headline")})
    assert seen[0] == seen[1], seen
    assert (seen[0]["culprits"], seen[0]["waiting"], seen[0]["culprit_nodes"]) == ([culprit], [waiter], [b_node])
    assert seen[0]["headline"].startswith(f"rank {culprit} (node {b_node}, pid ")
    assert f"faults     : none here; culprit on node {b_node}" in a.output(), a.output()[-3000:]
    assert "faults     : 1 hang" in b.output(), b.output()[-3000:]
