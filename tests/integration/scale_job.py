"""A job of many nodes on one machine: N launchers x 1 torch-free rank on loopback, with hangs.

Shared by ``tests/integration/ft_core/monitor/test_scale.py`` and ``benchmarks/scale.py``. The
workers use only ``RankMonitorClient`` (``FT_TEST_TORCH=0``), so 16 nodes fit
on 2 cores. One rank (never node 0's) stops heartbeating in each of the first
``hangs`` cycles; its node's monitor detects it, that launcher decides the
restart in the job store, every other launcher reads the decision and the
whole job rendezvouses again. The last cycle runs a few steps and ends.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from launcher_helpers import Launcher, LauncherGroup, Rendezvous

#: The hung rank stops heartbeating after this many steps (0.05 s each) of a hang cycle.
HANG_STEP = 10
#: Steps of the last cycle, after which every rank exits 0.
FINAL_STEPS = 20
#: Process-tree sampling period of the LauncherGroup (workers are also known from their records).
SAMPLE_INTERVAL = 0.5


@dataclasses.dataclass
class ScaleRun:
    """What one job of ``nodes`` launchers did; times in seconds."""

    nodes: int
    backend: str
    hung_rank: int
    exit_codes: list[int]
    #: Per node: the job-wide cause of each of its restarts.
    causes: list[list[str]]
    #: Per node: its exit summary (stderr).
    summaries: list[str]
    #: Per node: the cycles it started.
    cycles: list[list[int]]
    #: (rank, cycle) of every worker that finished.
    finished: set[tuple[int, int]]
    #: Per hang: the monitor's detection -> every rank of the next cycle has heartbeated.
    recovery: list[float]
    #: Per hang: detection -> the last node's restart (the decision has reached every node).
    propagation: list[float]
    #: Per hang: the last node's restart -> the last node's new workers started (rendezvous + cycle setup).
    rendezvous: list[float]
    #: Per hang: (detection, every rank of the next cycle has heartbeated), wall-clock times.
    windows: list[tuple[float, float]]
    #: Floor: per node and cycle, the node's workers started -> its rank's first heartbeat.
    worker_start: list[float]
    #: Launch of the first launcher -> every rank's first heartbeat of cycle 0.
    startup: float
    wall: float


def hung_rank_for(nodes: int) -> int:
    """A rank in the middle of the job: never node 0's, whose launcher serves the cycle's store."""
    return nodes // 2 + 1 if nodes > 2 else nodes - 1


def run_scale_job(launchers: LauncherGroup, rdzv: Rendezvous, nodes: int, hangs: int,
                  heartbeat_timeout: float = 3.0, timeout: float = 240.0) -> ScaleRun:
    """Start ``nodes`` launchers, inject ``hangs`` hangs (one per cycle), wait for all to exit.

    ``launchers`` should sample every :data:`SAMPLE_INTERVAL` seconds.
    """
    hung = hung_rank_for(nodes)
    env = {"FT_TEST_TORCH": "0", "FT_TEST_FAULT": "hang", "FT_TEST_FAULT_RANK": str(hung),
           "FT_TEST_FAULT_CYCLES": f"<{hangs}", "FT_TEST_FAULT_STEP": str(HANG_STEP),
           "FT_TEST_STEPS": str(FINAL_STEPS)}
    # torchrun's default monitor interval (the tests' 0.05 s costs CPU that 16 nodes on 2 cores lack).
    flags = [*rdzv.flags(str(nodes), max_restarts=hangs), f"--ft-rank-heartbeat-timeout={heartbeat_timeout}",
             "--ft-stack-dump-timeout=0.2", "--monitor-interval=0.1"]
    started = time.time()
    # All at once, also on c10d: whichever launcher binds the endpoint first hosts the rendezvous store
    # and the others connect to it (torch retries until it serves). Which one hosts does not matter here.
    group = [launchers.start(*flags, name=f"node{i}", nproc=1, **env) for i in range(nodes)]
    codes = [node.wait(max(1.0, started + timeout - time.time())) for node in group]
    wall = time.time() - started

    records = launchers.worker_records()
    first_hb = {(r["rank"], r["cycle"]): r["time"] for r in records if r["event"] == "first_heartbeat"}
    detections = sorted(e["time"] for node in group for e in node.events("hang_detected"))
    recovery, propagation, rendezvous, windows = [], [], [], []
    for cycle, detected in enumerate(detections):
        restarted = [e["time"] for node in group for e in node.events("restart") if e["cycle"] == cycle]
        begun = [e["time"] for node in group for e in node.events("cycle_start") if e["cycle"] == cycle + 1]
        heartbeats = [first_hb.get((rank, cycle + 1)) for rank in range(nodes)]
        if restarted and begun and None not in heartbeats:
            recovery.append(max(heartbeats) - detected)  # type: ignore[type-var]
            propagation.append(max(restarted) - detected)
            rendezvous.append(max(begun) - max(restarted))
            windows.append((detected, max(heartbeats)))  # type: ignore[type-var]
    return ScaleRun(
        nodes=nodes, backend=rdzv.backend, hung_rank=hung, exit_codes=codes,
        causes=[[e["cause"] for e in node.events("restart")] for node in group],
        summaries=[_summary(node) for node in group],
        cycles=[[e["cycle"] for e in node.events("cycle_start")] for node in group],
        finished={(r["rank"], r["cycle"]) for r in records if r["event"] == "finished"},
        recovery=recovery, propagation=propagation, rendezvous=rendezvous, windows=windows,
        worker_start=_worker_start(group, first_hb),
        startup=max(t for (_, cycle), t in first_hb.items() if cycle == 0) - started,
        wall=wall)


def _worker_start(group: list[Launcher], first_hb: dict[tuple[int, int], float]) -> list[float]:
    times = []
    for node in group:
        for event in node.events("cycle_start"):
            for rank in event["workers"]:
                heartbeat = first_hb.get((int(rank), event["cycle"]))
                if heartbeat is not None:
                    times.append(heartbeat - event["time"])
    return times


def _summary(node: Launcher) -> str:
    match = re.search(r"ft_launcher summary\n(?:  .*\n?)*", node.output())
    return match.group(0) if match else ""


def as_json(run: ScaleRun) -> dict[str, Any]:
    return dataclasses.asdict(run)
