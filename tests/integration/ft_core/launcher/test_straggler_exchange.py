"""Straggler detection end to end: 2 launchers x 2 ranks on loopback (c10d), real gloo all-reduce every step.

Each rank marks a ``forward`` phase with ``client.timed`` (a sleep: its length
does not depend on how busy the machine is). One rank's forward lasts 60 %
longer (relative score 1/1.6 = 0.625 < 0.75). Reports every 2 s, K = 3.
"""

from __future__ import annotations

import msgspec
import pytest
from helpers import wait_for
from launcher_helpers import Rendezvous, exit_event

from ft_core.events import PhaseMedians
from ft_core.launcher.outcome import LEFT_UNFINISHED_EXIT_CODE
from ft_core.launcher.straggler_exchange import (
    StragglerDetector,
    StragglerRound,
)
from ft_core.straggler_scoring import (
    PhaseMedian,
    StragglerAction,
)

pytestmark = pytest.mark.timeout(400)

INTERVAL = 2.0
K = 3
SLOW_RANK = 3  # local rank 1 of the second launcher
#: ~0.1 s per step: 140 steps are about 14 s of training, seven report intervals (a straggler is
#: named within K + 1 = 4 of them).
RUN = {"FT_TEST_STEPS": "140", "FT_TEST_STEP_TIME": "0.02", "FT_TEST_FORWARD_TIME": "0.06"}
FLAGS = (f"--ft-straggler-report-interval={INTERVAL}", f"--ft-straggler-consecutive-reports={K}")


def start_job(launchers, *flags, **env):
    rdzv = Rendezvous("c10d")
    a = launchers.start(*rdzv.flags("2"), *FLAGS, *flags, name="A", nproc=2, **RUN, **env)
    rdzv.wait_ready()
    b = launchers.start(*rdzv.flags("2"), *FLAGS, *flags, name="B", nproc=2, **RUN, **env)
    return a, b


def test_the_slow_rank_and_only_it_is_reported_within_k_plus_one_intervals(launchers):
    a, b = start_job(launchers, FT_TEST_SLOW_RANK=str(SLOW_RANK))
    assert a.wait(300) == 0, a.output()[-3000:]
    assert b.wait(60) == 0, b.output()[-3000:]
    reports = {node: node.events("straggler") for node in (a, b)}
    for node, events in reports.items():
        assert [e["rank"] for e in events] == [SLOW_RANK], (events, node.output()[-3000:])
        (event,) = events
        assert event["phase"] == "forward" and event["action"] == "report"
        assert event["relative_score"] < 0.75 and event["threshold"] == 0.75 and event["consecutive"] == K
        assert event["window"] > 0 and event["median"] > 0.06
        assert event["rank_node"] == b.events("launcher_started")[0]["node"]
    # The same report on both nodes (one job-wide judgement), and one log line each.
    fields = ("rank", "rank_node", "phase", "relative_score", "individual_score", "time")
    assert [{k: e[k] for k in fields} for e in reports[a]] == [{k: e[k] for k in fields} for e in reports[b]]
    for node in (a, b):
        assert node.output().count(f"rank {SLOW_RANK} on ") == 1, node.output()[-3000:]
    first_phase = min(r["time"] for r in launchers.worker_records("first_phase") if r["rank"] == SLOW_RANK)
    assert reports[a][0]["time"] - first_phase <= (K + 1) * INTERVAL, (reports[a][0]["time"], first_phase)


def test_an_evenly_loaded_run_reports_no_straggler(launchers):
    a, b = start_job(launchers)
    assert a.wait(300) == 0, a.output()[-3000:]
    assert b.wait(60) == 0, b.output()[-3000:]
    assert a.events("straggler") == [] and b.events("straggler") == []
    # Detection was running: the monitors reported medians for every rank (the launchers judged them).
    assert len(launchers.worker_records("first_phase")) == 4


def test_restart_action_restarts_the_cycle_once_and_says_why(launchers):
    # The rank is slow in cycle 0 only (FT_TEST_FAULT_CYCLES defaults to "0").
    a, b = start_job(launchers, "--ft-straggler-action=restart", FT_TEST_SLOW_RANK=str(SLOW_RANK))
    assert a.wait(300) == 0, a.output()[-3000:]
    assert b.wait(60) == 0, b.output()[-3000:]
    for node in (a, b):
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
        (restart,) = node.events("restart")
        assert restart["cycle"] == 0
        assert restart["cause"].startswith(f"rank {SLOW_RANK} on ") and "straggler in phase 'forward'" in \
            restart["cause"], restart
        (straggler,) = node.events("straggler")
        assert straggler["action"] == "restart" and straggler["cycle"] == 0
    kinds = {e["kind"] for node in (a, b) for e in node.events("restart")}
    assert "straggler" in kinds and kinds <= {"straggler", "peer"}
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(r, 1) for r in range(4)}


def test_exclude_node_action_hands_the_slow_node_over_to_the_hot_spare(launchers):
    # A and B run the job (one rank each), C waits as a hot spare. B's rank is slow in cycle 0:
    # B leaves (an exclusion, not a fault: no restart is spent) and C takes its place. With two
    # ranks the job-wide median is their mean, so B's rank is 3x slower: score (1 + 3) / 2 / 3 = 0.67.
    rdzv = Rendezvous("c10d")
    flags = (*rdzv.flags("2:2"), *FLAGS, "--ft-straggler-action=exclude-node")
    a = launchers.start(*flags, name="A", nproc=1, **RUN)
    rdzv.wait_ready()
    b = launchers.start(*flags, name="B", nproc=1, FT_TEST_SLOW_RANK="1", FT_TEST_SLOW_FACTOR="3",
                        **RUN)
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    c = launchers.start(*flags, name="C", nproc=1, **RUN)
    wait_for(lambda: rdzv.spares_waiting() == 1 or b.proc.poll() is not None, 120, "C to wait as a hot spare",
             interval=0.5)
    # B left a job that is not finished: never 0 (SLURM would read a finished job), a code to requeue on.
    assert b.wait(120) == LEFT_UNFINISHED_EXIT_CODE, b.output()[-3000:]
    (straggler,) = b.events("straggler")
    assert (straggler["rank"], straggler["action"]) == (1, "exclude-node")
    assert straggler["rank_node"] == b.events("launcher_started")[0]["node"]
    assert "straggler in phase 'forward'" in exit_event(b)["reason"], exit_event(b)
    assert "left an unfinished job" in exit_event(b)["reason"]
    assert a.wait(300) == 0, a.output()[-3000:]
    assert c.wait(60) == 0, c.output()[-3000:]
    assert [e["cycle"] for e in a.events("cycle_start")] == [0, 1]
    assert a.events("cycle_start")[1]["restarts"] == 0  # an exclusion is not a fault
    assert [e["cycle"] for e in b.events("cycle_start")] == [0]
    assert [e["cycle"] for e in c.events("cycle_start")] == [1]
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(0, 1), (1, 1)}
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"


#: Two ranks, one 3x slower in its forward phase (score (1 + 3) / 2 / 3 = 0.67): 80 steps of ~0.2 s, twice
#: the time a straggler takes to be named (K + 1 intervals).
SLOW_PAIR = {**RUN, "FT_TEST_STEPS": "80", "FT_TEST_SLOW_RANK": "1", "FT_TEST_SLOW_FACTOR": "3"}


def test_exclude_node_on_a_one_node_job_falls_back_to_report_and_finishes(launchers):
    # No node can leave a one-node job without ending it: the slow rank is reported, with one warning
    # naming why, and the job runs to its end (it used to exit 0 a few seconds in).
    node = launchers.start(*FLAGS, "--ft-straggler-action=exclude-node", nproc=2, **SLOW_PAIR)
    assert node.wait(300) == 0, node.output()[-3000:]
    (straggler,) = node.events("straggler")
    assert (straggler["rank"], straggler["action"]) == (1, "exclude-node")
    assert node.output().count("straggler_action exclude-node falls back to report") == 1, node.output()[-3000:]
    assert [e["cycle"] for e in node.events("cycle_start")] == [0] and node.events("restart") == []
    assert "all workers finished" in exit_event(node)["reason"]
    assert {r["rank"] for r in launchers.worker_records("finished")} == {0, 1}
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"


def test_a_vain_straggler_restart_is_not_a_fault_and_falls_back_to_report(launchers):
    # A rank slow in every cycle, no restart budget, no progress (every cycle reports iteration 10):
    # the straggler restart spends nothing and is not "no progress"; the rank is slow again after it,
    # so the action falls back to report and the slow but healthy job finishes.
    node = launchers.start(*FLAGS, "--ft-straggler-action=restart", "--max-restarts=0",
                           "--ft-max-no-progress-cycles=1", nproc=2, FT_TEST_FAULT_CYCLES="all",
                           FT_TEST_CHECKPOINT="10", **SLOW_PAIR)
    assert node.wait(300) == 0, node.output()[-3000:]
    assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
    assert [e["restarts"] for e in node.events("cycle_start")] == [0, 0]
    (restart,) = node.events("restart")
    assert restart["kind"] == "straggler" and restart["restarts"] == 0
    assert [(e["cycle"], e["action"]) for e in node.events("straggler")] == [(0, "restart"), (1, "report")]
    assert "falls back to report for that node" in node.output()
    assert "faults     : none" in node.output(), node.output()[-2000:]
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(0, 1), (1, 1)}
    assert launchers.alive_now() == [], "a process of the job outlived its launcher"


def test_launchers_share_one_judgement_through_the_job_store(new_job_store):
    store = new_job_store()
    rounds: list[StragglerRound] = []
    nodes = [StragglerDetector(1.0, 0.75, 2, StragglerAction.RESTART, f"host:{i}", lambda: store,
                               on_round=rounds.append if i == 1 else None) for i in range(2)]
    node_medians = {0: [PhaseMedian(0, "fwd", 0.1, 9), PhaseMedian(1, "fwd", 0.1, 9)],
                    1: [PhaseMedian(2, "fwd", 0.1, 9), PhaseMedian(3, "fwd", 0.16, 9)]}
    seen: dict[int, list] = {0: [], 1: []}
    for round_ in (100, 101, 102):
        for group_rank, detector in enumerate(nodes):
            detector.publish(PhaseMedians(round=round_, medians=node_medians[group_rank]), cycle=0,
                             group_rank=group_rank)
        wall = round_ + 0.5  # half an interval after the round ended: the aggregator judges it
        for group_rank, detector in enumerate(nodes):
            seen[group_rank] += detector.poll(0, group_rank, 2, wall=wall)
    assert [(s.rank, s.rank_node, s.phase) for s in seen[0]] == [(3, "host:1", "fwd")]
    assert seen[0] == seen[1]  # the same record on every node
    assert [r.round for r in rounds] == [100, 101, 102] and len(rounds[-1].scores) == 4


def test_a_node_slow_in_every_cycle_causes_one_restart_over_ten_cycles(new_job_store):
    job_store = new_job_store()
    # Over a job's life (ten cycles, one aggregator per cycle as after restarts): the node's rank is a
    # straggler in each, the restart is asked for in the first only; the other node's first straggler
    # still gets its restart (the rule is per node).
    actions = []
    for cycle in range(10):
        detector = StragglerDetector(1.0, 0.75, 1, StragglerAction.RESTART, "host:0", lambda: job_store)
        slow = 3 if cycle < 9 else 1
        medians = [PhaseMedian(0, "fwd", 0.1, 9), PhaseMedian(1, "fwd", 0.16 if slow == 1 else 0.1, 9)]
        detector.publish(PhaseMedians(round=100 + cycle, medians=medians), cycle=cycle, group_rank=0)
        other = [PhaseMedian(2, "fwd", 0.1, 9), PhaseMedian(3, "fwd", 0.16 if slow == 3 else 0.1, 9)]
        job_store.set("straggler/1", msgspec.json.encode(
            {"cycle": cycle, "round": 100 + cycle, "node": "host:1", "medians": other}).decode())
        (straggler,) = detector.poll(cycle, 0, 2, wall=100 + cycle + 0.5)
        actions.append((straggler.rank_node, straggler.action.value))
    assert actions == [("host:1", "restart")] + [("host:1", "report")] * 8 + [("host:0", "restart")]
