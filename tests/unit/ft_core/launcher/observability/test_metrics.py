"""LauncherMetrics: the values it exports for a stream of launcher records, the metrics table of docs/events.md
and the example dashboard name the same metrics."""

from __future__ import annotations

import json
import os
import platform
import re

import pytest
from helpers import REPO_ROOT

from ft_core.events import (
    CycleStart,
    Diagnosis,
    HangDetected,
    HangReason,
    MonitorLate,
    Restart,
    RestartKind,
    Straggler,
)
from ft_core.launcher.observability.event_log import EventLog
from ft_core.launcher.observability.metrics import LauncherMetrics
from ft_core.launcher.straggler_exchange import StragglerRound
from ft_core.monitor.status import MonitorStatus, RankStatus, write_status
from ft_core.straggler_scoring import PhaseScore, StragglerAction

prometheus_client = pytest.importorskip("prometheus_client")


def exported(metrics: LauncherMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    text = prometheus_client.generate_latest(registry).decode()
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_records_and_status_become_metrics(tmp_path):
    events = EventLog(str(tmp_path / "ft_events.jsonl"))
    status = str(tmp_path / "monitor_status.json")
    metrics = LauncherMetrics(events, status, run_id="job-7")
    events.observers.append(metrics.observe)
    node = events.node
    host = node.rsplit(":", 1)[0]  # the series' node label: a requeued launcher (new pid) continues them
    events.write(CycleStart(cycle=0, restarts=0, group_rank=0, group_world_size=1, world_size=2,
                            workers={"0": 10, "1": 11}, monitor_pid=9))
    events.write(HangDetected(rank=1, pid=11, reason=HangReason.HEARTBEAT, section=None, elapsed=4.0, timeout=3.0,
                              iteration=5, open_sections=[], deadline_time=1.0, detected_time=2.0,
                              stack_dump_file=None))
    events.write(Restart(cycle=0, kind=RestartKind.HANG, reason="hang", restarts=1, max_restarts=3))
    events.write(Restart(cycle=1, kind=RestartKind.MONITOR, reason="monitor died", restarts=2, max_restarts=3))
    events.write(MonitorLate(late=0.5, grace=0.5, ranks=[0]))
    events.write(CycleStart(cycle=2, restarts=2, group_rank=0, group_world_size=1, world_size=2,
                            workers={"0": 12, "1": 13}, monitor_pid=9))
    events.write(Straggler(cycle=2, rank=1, rank_node=node, phase="forward", relative_score=0.6, individual_score=0.9,
                           median=0.1, window=8, threshold=0.75, consecutive=3, action=StragglerAction.REPORT))
    metrics.observe_round(StragglerRound(cycle=2, round=7, stragglers=[], scores=[
        PhaseScore(1, "forward", 0.1, 8, 0.6, 0.9), PhaseScore(5, "forward", 0.06, 8, 1.0, 1.0)]))
    import time

    write_status(status, MonitorStatus(time=time.time(), ranks=[
        RankStatus(rank=0, pid=12, last_activity=time.time() - 5.0, steps=4, step_seconds=2.0, last_step_seconds=0.4),
        RankStatus(rank=1, pid=13, last_activity=None)]))
    values = exported(metrics)
    events.close()

    def get(name: str, **labels: str) -> float:
        return values[(name, frozenset({"run_id": "job-7", "node": host, **labels}.items()))]

    assert get("ft_restarts_total", kind="hang") == 1 and get("ft_restarts_total", kind="monitor") == 1
    assert get("ft_faults_total", kind="hang", rank="1") == 1 and get("ft_faults_total", kind="monitor", rank="") == 1
    assert get("ft_cycle") == 2 and get("ft_cycle_uptime_seconds") >= 0
    assert get("ft_monitor_late_total") == 1 and get("ft_monitor_late_seconds_total") == 0.5
    assert get("ft_stragglers_total", rank="1", phase="forward") == 1
    assert get("ft_straggler_score", rank="1", phase="forward", kind="relative") == 0.6
    assert not any(n == "ft_straggler_score" and ("rank", "5") in ls for n, ls in values)  # not a local rank
    assert get("ft_rank_heartbeat_age_seconds", rank="0") == pytest.approx(5.0, abs=1.0)
    assert not any(n == "ft_rank_heartbeat_age_seconds" and ("rank", "1") in ls for n, ls in values)
    assert get("ft_rank_step_duration_seconds_count", rank="0") == 4
    assert get("ft_rank_step_duration_seconds_sum", rank="0") == 2.0
    assert get("ft_rank_last_step_duration_seconds", rank="0") == 0.4
    assert 0 <= get("ft_fault_free_time_ratio") <= 1 and get("ft_time_lost_seconds_total") >= 0
    import torch

    import ft_core

    assert get("ft_build_info", version=ft_core.__version__, torch=torch.__version__,
               python=platform.python_version()) == 1

    page = open(os.path.join(REPO_ROOT, "docs", "events.md"), encoding="utf-8").read()
    table = page.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(ft_\w+)` \|", table, flags=re.M))
    names = {n for n, _ in values}
    families = {re.sub(r"_(count|sum)$", "", n) if n.startswith("ft_rank_step_duration") else n for n in names}
    assert documented == families
    with open(os.path.join(REPO_ROOT, "examples", "monitoring", "grafana_dashboard.json"), encoding="utf-8") as f:
        dashboard = json.load(f)
    used = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"\bft_\w+", t["expr"])}
    assert used <= names, used - names


def test_a_hang_fault_counts_its_diagnosed_culprit_not_the_ranks_that_waited(tmp_path):
    events = EventLog(str(tmp_path / "ft_events.jsonl"))
    metrics = LauncherMetrics(events, str(tmp_path / "monitor_status.json"), run_id="job-7")
    events.observers.append(metrics.observe)
    node = events.node
    events.write(CycleStart(cycle=0, restarts=0, group_rank=0, group_world_size=1, world_size=2,
                            workers={"0": 10, "1": 11}, monitor_pid=9))
    for rank in (0, 1):  # rank 0 waited for rank 1 in a collective and expired too
        events.write(HangDetected(rank=rank, pid=10 + rank, reason=HangReason.SECTION, section="step", elapsed=3.0,
                                  timeout=3.0, iteration=25, open_sections=["step"], deadline_time=1.0,
                                  detected_time=2.0, stack_dump_file=None))
    events.write(Diagnosis(cycle=0, culprits=[1], waiting=[0], evidence="ranks 0 blocked in a collective",
                           headline="rank 1 hung", culprit_nodes=[node]))
    events.write(Restart(cycle=0, kind=RestartKind.HANG, reason="hang", restarts=1, max_restarts=3))
    # The next cycle's hang without a diagnosis (no job store): every rank that expired counts.
    events.write(CycleStart(cycle=1, restarts=1, group_rank=0, group_world_size=1, world_size=2,
                            workers={"0": 12, "1": 13}, monitor_pid=9))
    events.write(HangDetected(rank=0, pid=12, reason=HangReason.HEARTBEAT, section=None, elapsed=4.0, timeout=3.0,
                              iteration=5, open_sections=[], deadline_time=1.0, detected_time=2.0,
                              stack_dump_file=None))
    events.write(Restart(cycle=1, kind=RestartKind.HANG, reason="hang", restarts=2, max_restarts=3))
    values = exported(metrics)
    events.close()
    faults = {dict(labels)["rank"]: value for (name, labels), value in values.items()
              if name == "ft_faults_total" and dict(labels)["kind"] == "hang"}
    assert faults == {"1": 1, "0": 1}  # rank 1 in cycle 0 (the culprit), rank 0 in cycle 1 (undiagnosed)


def test_time_lost_and_the_fault_free_ratio_count_the_detection(tmp_path):
    """A rank hung for 5 s, workers back 1 s after the detection: 6 s lost (the report's detection + restart),
    not the 1 s from the detection to the next cycle."""
    import time

    events = EventLog(str(tmp_path / "ft_events.jsonl"))
    metrics = LauncherMetrics(events, str(tmp_path / "monitor_status.json"), run_id="job-7")
    events.observers.append(metrics.observe)
    t0 = events.started = time.time() - 10.0  # the launcher started 10 s ago
    events.write(CycleStart(time=t0, cycle=0, restarts=0, group_rank=0, group_world_size=1, world_size=1,
                            workers={"0": 10}, monitor_pid=9))
    events.write(HangDetected(time=t0 + 6.0, rank=0, pid=10, reason=HangReason.HEARTBEAT, section=None, elapsed=5.0,
                              timeout=5.0, iteration=5, open_sections=[], deadline_time=t0 + 6.0,
                              detected_time=t0 + 6.0, stack_dump_file=None))
    events.write(Restart(time=t0 + 6.0, cycle=0, kind=RestartKind.HANG, reason="hang", restarts=1, max_restarts=3))
    events.write(CycleStart(time=t0 + 7.0, cycle=1, restarts=1, group_rank=0, group_world_size=1, world_size=1,
                            workers={"0": 11}, monitor_pid=9))
    values = exported(metrics)
    events.close()
    labels = frozenset({"run_id": "job-7", "node": events.node.rsplit(":", 1)[0]}.items())
    assert values[("ft_time_lost_seconds_total", labels)] == pytest.approx(6.0)
    run_time = time.time() - events.started
    assert values[("ft_fault_free_time_ratio", labels)] == pytest.approx(1 - 6.0 / run_time, abs=0.01)
