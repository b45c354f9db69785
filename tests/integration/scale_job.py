"""A job of many nodes on one machine: N launchers x 1 torch-free rank on loopback, with hangs or crashes.

Shared by ``tests/integration/ft_core/monitor/test_scale.py`` and ``benchmarks/scale.py``. The
workers use only ``RankMonitorClient`` (``FT_TEST_TORCH=0``), so 16 nodes fit
on 2 cores. One rank (never node 0's) stops heartbeating (``fault="hang"``) or
exits with code 3 (``fault="crash"``) in each of the first ``hangs`` cycles (the first once
the job has settled: :func:`settle`); its
node's launcher decides the restart in the job store, every other launcher
reads the decision and the whole job rendezvouses again. The last cycle runs a
few steps and ends.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any

from launcher_helpers import Launcher, LauncherGroup, Rendezvous

from ft_core.launcher.rendezvous.wake import RendezvousCounts, logged_rounds

#: The hung rank stops heartbeating after this many steps (0.05 s each) of a hang cycle.
HANG_STEP = 10
#: Steps of the last cycle, after which every rank exits 0.
FINAL_STEPS = 20
#: The cores' busy share (percent, over one second) under which a job counts as settled (see :func:`settle`).
SETTLED_BUSY = 80.0
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
    #: Per fault: the hung rank's deadline (the monitor's detection) or the crash -> every rank of the next
    #: cycle has heartbeated.
    recovery: list[float]
    #: Per hang: detection -> the last node's restart (the decision has reached every node).
    propagation: list[float]
    #: Per hang: the last node's restart -> the last node's new workers started (rendezvous + cycle setup).
    rendezvous: list[float]
    #: Per hang: (detection, every rank of the next cycle has heartbeated), wall-clock times.
    windows: list[tuple[float, float]]
    #: Floor: per node and cycle, the node's workers started -> its rank's first heartbeat.
    worker_start: list[float]
    #: Per fault: the restart's rendezvous, summed over the nodes (their logged rendezvous lines).
    rendezvous_counts: list[RendezvousCounts]
    #: Launch of the first launcher -> every rank's first heartbeat of cycle 0.
    startup: float
    wall: float


def settle(launchers: LauncherGroup, nodes: int, deadline: float) -> None:
    """Wait until every rank of cycle 0 heartbeats and the machine's cores are no longer saturated (or ``deadline``).

    After a cycle starts, each launcher's next worker factory imports what a restart needs
    (``ft_core.launcher.startup.zygote.RESTART_PREWARMED``: about a CPU-second each); N launchers do so at
    once on this machine's 2 cores, where a node of a real job has its own cores. A fault in training comes
    long after; here the first one would find every factory still importing, and measure that. Settled: the
    cores were less than :data:`SETTLED_BUSY` busy over one second (at 32-64 nodes the job alone keeps them
    busier: then the deadline).
    """
    import psutil

    while time.time() < deadline:
        if len({r["rank"] for r in launchers.worker_records("first_heartbeat") if r["cycle"] == 0}) == nodes:
            break
        time.sleep(0.2)
    while time.time() < deadline and psutil.cpu_percent(interval=1.0) >= SETTLED_BUSY:
        pass


def hung_rank_for(nodes: int) -> int:
    """A rank in the middle of the job: never node 0's, whose launcher serves the cycle's store."""
    return nodes // 2 + 1 if nodes > 2 else nodes - 1


def run_scale_job(launchers: LauncherGroup, rdzv: Rendezvous, nodes: int, hangs: int,
                  heartbeat_timeout: float = 3.0, timeout: float = 240.0, fault: str = "hang") -> ScaleRun:
    """Start ``nodes`` launchers, inject ``hangs`` faults (``hang`` or ``crash``, one per cycle), wait for all to exit.

    ``launchers`` should sample every :data:`SAMPLE_INTERVAL` seconds.
    """
    hung = hung_rank_for(nodes)
    trigger = os.path.join(launchers.tmp_path, "settled")
    env = {"FT_TEST_TORCH": "0", "FT_TEST_FAULT": {"hang": "hang", "crash": "exit3"}[fault], "FT_TEST_FAULT_RANK": str(hung),
           "FT_TEST_FAULT_CYCLES": f"<{hangs}", "FT_TEST_FAULT_STEP": str(HANG_STEP),
           "FT_TEST_STEPS": str(FINAL_STEPS), "FT_TEST_FAULT_AFTER": trigger}
    # torchrun's default monitor interval (the tests' 0.05 s costs CPU that 16 nodes on 2 cores lack).
    flags = [*rdzv.flags(str(nodes), max_restarts=hangs), f"--ft-rank-heartbeat-timeout={heartbeat_timeout}",
             "--ft-stack-dump-timeout=0.2", "--monitor-interval=0.1"]
    started = time.time()
    # All at once, also on c10d: whichever launcher binds the endpoint first hosts the rendezvous store
    # and the others connect to it (torch retries until it serves). Which one hosts does not matter here.
    group = [launchers.start(*flags, name=f"node{i}", nproc=1, **env) for i in range(nodes)]
    settle(launchers, nodes, started + timeout / 4)
    open(trigger, "w").close()  # the first fault: on a job that has settled, as a fault in training finds it
    codes = [node.wait(max(1.0, started + timeout - time.time())) for node in group]
    wall = time.time() - started

    records = launchers.worker_records()
    first_hb = {(r["rank"], r["cycle"]): r["time"] for r in records if r["event"] == "first_heartbeat"}
    if fault == "hang":
        detections = sorted(e["time"] for node in group for e in node.events("hang_detected"))
    else:
        detections = sorted(r["time"] for r in records if r["event"] == "fault")
    logged = [[counts for _, counts in logged_rounds(node.output())] for node in group]
    recovery, propagation, rendezvous, windows, counts = [], [], [], [], []
    for cycle, detected in enumerate(detections):
        restarted = [e["time"] for node in group for e in node.events("restart") if e["cycle"] == cycle]
        begun = [e["time"] for node in group for e in node.events("cycle_start") if e["cycle"] == cycle + 1]
        heartbeats = [first_hb.get((rank, cycle + 1)) for rank in range(nodes)]
        if restarted and begun and None not in heartbeats:
            recovery.append(max(heartbeats) - detected)  # type: ignore[type-var]
            propagation.append(max(restarted) - detected)
            rendezvous.append(max(begun) - max(restarted))
            windows.append((detected, max(heartbeats)))  # type: ignore[type-var]
            counts.append(_total([rounds[cycle + 1] for rounds in logged if len(rounds) > cycle + 1]))
    return ScaleRun(
        nodes=nodes, backend=rdzv.backend, hung_rank=hung, exit_codes=codes,
        causes=[[e["cause"] for e in node.events("restart")] for node in group],
        summaries=[_summary(node) for node in group],
        cycles=[[e["cycle"] for e in node.events("cycle_start")] for node in group],
        finished={(r["rank"], r["cycle"]) for r in records if r["event"] == "finished"},
        recovery=recovery, propagation=propagation, rendezvous=rendezvous, windows=windows,
        worker_start=_worker_start(group, first_hb), rendezvous_counts=counts,
        startup=max(t for (_, cycle), t in first_hb.items() if cycle == 0) - started,
        wall=wall)


def run_node_loss_job(launchers: LauncherGroup, rdzv: Rendezvous, nodes: int, trigger: str,
                      timeout: float = 240.0) -> ScaleRun:
    """``nodes`` launchers and a hot spare; once the spare waits, one node (not node 0, which hosts c10d's store)
    is SIGKILLed with its workers, and the spare takes its place.

    A peer of the lost node learns of it as NCCL's watchdog would (the rank of node 0 exits with code 3
    once ``trigger``, a path, exists: touched after the kill); every node restarts, and the next round
    opens once the lost node is removed (its liveness beat stopped: ``lost_after``; with ``lost_after=0``, its
    keep-alives: ``keep_alive_interval`` x 3 seconds).
    """
    env = {"FT_TEST_TORCH": "0", "FT_TEST_STEPS": str(FINAL_STEPS), "FT_TEST_FAULT_AFTER": trigger}
    flags = [*rdzv.flags(f"{nodes}:{nodes}", max_restarts=1), "--monitor-interval=0.1"]
    started = time.time()
    group = [launchers.start(*flags, name="node0", nproc=1, FT_TEST_FAULT="exit3", FT_TEST_FAULT_RANK="local0",
                             **env)]
    rdzv.wait_ready()
    group += [launchers.start(*flags, name=f"node{i}", nproc=1, **env) for i in range(1, nodes)]
    for node in group:
        node.wait_event("rank_connected", timeout)
    spare = launchers.start(*flags, name="spare", nproc=1, **env)
    deadline = time.time() + timeout
    while rdzv.spares_waiting() != 1:
        if time.time() > deadline:
            raise TimeoutError("the spare did not reach torch's redundancy list")
        time.sleep(0.5)
    lost = group[hung_rank_for(nodes)]
    killed = time.time()
    lost.kill()
    open(trigger, "w").close()
    survivors = [node for node in group if node is not lost] + [spare]
    codes = [node.wait(max(1.0, started + timeout - time.time())) for node in survivors]
    wall = time.time() - started
    first_hb = _first_heartbeats(launchers)
    restarted = [e["time"] for node in survivors for e in node.events("restart") if e["cycle"] == 0]
    begun = [e["time"] for node in survivors for e in node.events("cycle_start") if e["cycle"] == 1]
    heartbeats = [first_hb.get((rank, 1)) for rank in range(nodes)]
    complete = bool(restarted and begun and None not in heartbeats)
    last = max(heartbeats) if complete else killed  # type: ignore[type-var]
    # The survivors' second rendezvous and the spare's only one (which also holds its waits as a spare).
    logged = [logged_rounds(node.output()) for node in survivors]
    restart_rounds = [rounds[-1][1] for rounds in logged if rounds]
    return ScaleRun(
        nodes=nodes, backend=rdzv.backend, hung_rank=-1, exit_codes=codes,
        causes=[[e["cause"] for e in node.events("restart")] for node in survivors],
        summaries=[_summary(node) for node in survivors],
        cycles=[[e["cycle"] for e in node.events("cycle_start")] for node in survivors],
        finished={(r["rank"], r["cycle"]) for r in launchers.worker_records() if r["event"] == "finished"},
        recovery=[last - killed] if complete else [], propagation=[max(restarted) - killed] if complete else [],
        rendezvous=[max(begun) - max(restarted)] if complete else [],
        windows=[(killed, last)] if complete else [],
        worker_start=_worker_start(survivors, first_hb), rendezvous_counts=[_total(restart_rounds)],
        startup=max(t for (_, cycle), t in first_hb.items() if cycle == 0) - started, wall=wall)


def _first_heartbeats(launchers: LauncherGroup) -> dict[tuple[int, int], float]:
    return {(r["rank"], r["cycle"]): r["time"] for r in launchers.worker_records() if r["event"] == "first_heartbeat"}


def _worker_start(group: list[Launcher], first_hb: dict[tuple[int, int], float]) -> list[float]:
    times = []
    for node in group:
        for event in node.events("cycle_start"):
            for rank in event["workers"]:
                heartbeat = first_hb.get((int(rank), event["cycle"]))
                if heartbeat is not None:
                    times.append(heartbeat - event["time"])
    return times


def _total(rounds: list[RendezvousCounts]) -> RendezvousCounts:
    total = RendezvousCounts()
    for counts in rounds:
        for field in dataclasses.fields(total):
            setattr(total, field.name, getattr(total, field.name) + getattr(counts, field.name))
    return total


def _summary(node: Launcher) -> str:
    match = re.search(r"ft_launcher summary\n(?:  .*\n?)*", node.output())
    return match.group(0) if match else ""


def as_json(run: ScaleRun) -> dict[str, Any]:
    return dataclasses.asdict(run)
