"""ft_core.launcher.observability.report on hand-written event logs: time accounting, faults, files, JSON keys, timeline, CLI."""

from __future__ import annotations

import ast
import inspect
import json
import os

import msgspec
import pytest

from ft_core.events import AnyEvent, Event, HangDetected, HangReason, Restart, RestartKind
from ft_core.launcher.observability.report import (
    analysis,
    build_report,
    find_event_files,
    format_report,
    load_records,
    main,
    short_summary,
)

A0, B0, A1, B1 = "hostA:100", "hostB:200", "hostA:300", "hostB:400"

#: Fields the event schema requires that the report does not read: what a launcher of 2 nodes x 2 ranks writes.
UNREAD = {
    "launcher_started": {"run_id": "", "min_nodes": 2, "max_nodes": 2, "nproc_per_node": 2, "max_restarts": 3,
                         "rdzv_backend": "c10d", "monitor_pid": 99, "config": {}},
    "cycle_start": {"restarts": 0, "group_rank": 0, "group_world_size": 2, "world_size": 4, "monitor_pid": 99},
    "rank_connected": {"local_rank": 0},
    "progress": {"source": "rank 0", "cycle": 0},
    "restart": {"restarts": 1, "max_restarts": 3},
    "hang_detected": {"open_sections": ["step"], "deadline_time": 0.0, "detected_time": 0.0,
                      "stack_dump_file": None},
    "workload_control": {"description": ""},
}


def ev(event: str, time: float, node: str, **fields) -> dict:
    """A record as the launcher writes it (checked against the schema): ``fields``, the rest as in ``UNREAD``."""
    record = {"event": event, "time": time, "node": node, **UNREAD.get(event, {}), **fields}
    msgspec.convert(record, AnyEvent)  # a record the schema rejects would be skipped by the report
    return record


def attempt0() -> dict[str, list[dict]]:
    """Two nodes; rank 3 on B hangs at iteration 15 (checkpoint 10); restart; SIGTERM (preemption)."""
    common = {
        A0: [ev("launcher_started", 0.0, A0, run_id="42"),
             ev("cycle_start", 1.0, A0, cycle=0, workers={"0": 1000, "1": 1001}),
             ev("rank_connected", 3.0, A0, rank=0, pid=1000, restart_count=0),
             ev("progress", 10.0, A0, iteration=10, cycle=0),
             ev("restart", 20.6, A0, cycle=0, kind="peer", reason="hostB: rank 3 hung"),
             ev("cycle_start", 21.0, A0, cycle=1, workers={"0": 1100, "1": 1101}),
             ev("rank_connected", 23.0, A0, rank=0, pid=1100, restart_count=1),
             ev("progress", 30.0, A0, iteration=20, cycle=1),
             ev("signal", 40.0, A0, signal="SIGTERM", running_workers=2),
             ev("worker_exit", 40.5, A0, cycle=1, local_rank=0, pid=1100, cause="launcher SIGTERM", exit_code=0),
             ev("exit", 41.0, A0, exit_code=143, reason="SIGTERM received; training not finished")],
        B0: [ev("launcher_started", 0.2, B0, run_id="42"),
             ev("cycle_start", 1.1, B0, cycle=0, workers={"2": 2002, "3": 2003}),
             ev("rank_connected", 3.1, B0, rank=3, pid=2003, restart_count=0),
             ev("hang_detected", 20.0, B0, rank=3, pid=2003, reason="section", section="step", elapsed=2.0,
                timeout=2.0, iteration=15),
             ev("worker_exit", 20.5, B0, cycle=0, rank=3, local_rank=1, pid=2003, cause="hang", signal="SIGKILL"),
             ev("restart", 20.5, B0, cycle=0, kind="hang", reason="rank 3 (pid 2003) hung"),
             ev("cycle_start", 21.1, B0, cycle=1, workers={"2": 2102, "3": 2103}),
             ev("rank_connected", 23.2, B0, rank=3, pid=2103, restart_count=1),
             ev("signal", 40.0, B0, signal="SIGTERM", running_workers=2),
             ev("exit", 40.8, B0, exit_code=143, reason="SIGTERM received; training not finished")],
    }
    return common


def attempt1() -> dict[str, list[dict]]:
    """The requeued job (same run id): rank 0 crashes once, then the job finishes."""
    t = 1000.0
    return {
        A1: [ev("launcher_started", t, A1, run_id="42"),
             ev("cycle_start", t + 1, A1, cycle=0, workers={"0": 3000, "1": 3001}),
             ev("rank_connected", t + 3, A1, rank=0, pid=3000, restart_count=0),
             ev("worker_exit", t + 10, A1, cycle=0, rank=0, local_rank=0, pid=3000, cause="crash", exit_code=1),
             ev("restart", t + 10.2, A1, cycle=0, kind="crash", reason="rank 0 (pid 3000) exited with code 1"),
             ev("cycle_start", t + 11, A1, cycle=1, workers={"0": 3100, "1": 3101}),
             ev("rank_connected", t + 13, A1, rank=0, pid=3100, restart_count=1),
             ev("workers_succeeded", t + 50, A1, cycle=1),
             ev("exit", t + 51, A1, exit_code=0, reason="all workers finished successfully")],
        B1: [ev("launcher_started", t + 0.1, B1, run_id="42"),
             ev("cycle_start", t + 1.2, B1, cycle=0, workers={"2": 4002, "3": 4003}),
             ev("restart", t + 10.3, B1, cycle=0, kind="peer", reason="hostA: crash"),
             ev("cycle_start", t + 11.1, B1, cycle=1, workers={"2": 4102, "3": 4103}),
             ev("workers_succeeded", t + 50, B1, cycle=1),
             ev("exit", t + 50.5, B1, exit_code=0, reason="all workers finished successfully")],
    }


def write(path, records) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return str(path)


@pytest.fixture
def job_dir(tmp_path):
    """The layout of the SLURM example: one file per node and requeue, under the job's log directory."""
    for index, nodes in enumerate((attempt0(), attempt1())):
        for node, records in nodes.items():
            write(tmp_path / "logs" / f"requeue{index}" / f"ft_events.{node.split(':')[0]}.jsonl", records)
    return tmp_path / "logs"


def test_time_accounting_across_nodes_and_requeues(job_dir):
    files = find_event_files([str(job_dir)])
    assert len(files) == 4
    report = build_report(load_records(files), files)
    assert report.attempts == 2 and report.cycles == 4 and report.nodes == ["hostA", "hostB"]
    assert report.run_ids == ["42"]
    # Queue time between the attempts is not wall time: 41 s + 51 s.
    assert report.wall_time_s == pytest.approx(92.0)
    # Training from the workers' first connection to the fault onset or the end of each cycle.
    assert report.training_time_s == pytest.approx((18 - 3) + (40 - 23) + (1010 - 1003) + (1050 - 1013))
    hang, crash = report.faults
    assert (hang.attempt, hang.cycle, hang.kind) == (0, 0, "hang")
    assert hang.culprit_rank == 3 and hang.culprit_node == "hostB" and hang.ranks == [3]
    assert hang.time == pytest.approx(18.0)  # the last sign of life: detection time - elapsed
    assert hang.detection_s == pytest.approx(2.0)
    assert hang.restart_s == pytest.approx(23.0 - 20.0)  # to the new workers' first connection
    assert hang.recompute_s == pytest.approx(18.0 - 10.0)  # since the checkpoint of iteration 10
    assert (hang.iteration, hang.checkpoint_iteration, hang.iterations_lost) == (15, 10, 5)
    assert (crash.attempt, crash.cycle, crash.kind, crash.culprit_rank, crash.culprit_node) == (1, 0, "crash", 0, "hostA")
    assert crash.detection_s == 0.0 and crash.restart_s == pytest.approx(3.0)
    # No checkpoint in the crashed cycle: all of its training is lost; it resumed from iteration 20.
    assert crash.recompute_s == pytest.approx(7.0) and crash.checkpoint_iteration == 20
    assert report.productive_time_s == pytest.approx(76.0 - 15.0)
    assert report.goodput_pct == pytest.approx(100 * 61 / 92)
    assert report.other_s == pytest.approx(92 - 76 - 2 - 6)
    assert report.faults_by("kind") == {"crash": 1, "hang": 1}
    assert report.faults_by("culprit_rank") == {"0": 1, "3": 1}
    assert report.faults_by("culprit_node") == {"hostA": 1, "hostB": 1}

    text = format_report(report)
    assert "goodput        : 66.3 %" in text
    assert "2 (1 crash, 1 hang)" in text and "rank 3 @ hostB" in text


def test_a_resume_from_a_snapshot_recomputes_only_what_followed_it(tmp_path):
    # The hang of attempt 0 (onset 18.0, disk checkpoint of iteration 10 at 10.0); the next cycle resumed from
    # the snapshot of step 14, taken at 16.5.
    records = [*attempt0()[A0], *attempt0()[B0],
               ev("resume_chosen", 23.5, A0, cycle=1, source="snapshot", step=14, reason="...", world_size=4,
                  disk_step=10, snapshot_step=14, snapshot_time=16.5)]
    path = write(tmp_path / "ft_events.jsonl", records)
    report = build_report(load_records([path]), [path])
    hang = report.faults[0]
    assert (hang.resumed_from, hang.resume_step) == ("snapshot", 14)
    assert hang.recompute_s == pytest.approx(18.0 - 16.5)
    assert hang.recompute_without_snapshots_s == pytest.approx(18.0 - 10.0)
    assert (hang.checkpoint_iteration, hang.iterations_lost) == (14, 1)
    assert "resumed from the snapshot of step 14: recomputation 1.5 s (8.0 s from disk)" in format_report(report)


def test_one_shared_file_gives_the_same_report(job_dir, tmp_path):
    records = [r for nodes in (attempt0(), attempt1()) for recs in nodes.values() for r in recs]
    shared = write(tmp_path / "shared" / "ft_events.jsonl", sorted(records, key=lambda r: -r["time"]))
    with open(shared, "a") as handle:
        handle.write('{"event": "cycle_start", "time": 5\n')  # torn line: skipped
        handle.write(json.dumps({"event": "progress", "iteration": 99}) + "\n")  # no time/node: skipped
    one = build_report(load_records([shared])).to_json()
    many = build_report(load_records(find_event_files([str(job_dir)]))).to_json()
    one.pop("files"), many.pop("files")
    assert one == many


def test_json_keys_are_fixed_and_unknowns_are_null(tmp_path):
    # No progress events: the recomputation is unknown, not zero.
    records = [r for r in attempt0()[B0] if r["event"] != "progress"]
    path = write(tmp_path / "ft_events.jsonl", records)
    data = build_report(load_records([path]), [path]).to_json()
    assert list(data) == ["files", "run_ids", "attempts", "nodes", "cycles", "wall_time_s", "training_time_s",
                          "productive_time_s", "goodput_pct", "lost_time_s", "other_time_s", "faults_total",
                          "faults_by_kind", "faults_by_rank", "faults_by_node", "faults", "exit_codes",
                          "exit_reasons", "restarts_by_cause", "stopped_by", "rejected_checkpoints"]
    assert data["lost_time_s"]["recompute"] is None
    assert (data["restarts_by_cause"], data["stopped_by"], data["rejected_checkpoints"]) == ({}, None, {})
    (fault,) = data["faults"]
    assert list(fault) == ["attempt", "cycle", "kind", "time", "culprit_rank", "culprit_node", "ranks", "iteration",
                           "checkpoint_iteration", "iterations_lost", "detection_s", "restart_s", "recompute_s",
                           "lost_s", "reason", "waiting", "diagnosis", "resumed_from", "resume_step",
                           "recompute_without_snapshots_s"]
    assert fault["recompute_s"] is None and fault["checkpoint_iteration"] is None
    assert fault["waiting"] == [] and fault["diagnosis"] is None  # no diagnosis record in this log
    assert fault["restart_s"] == pytest.approx(23.2 - 20.0)


def test_a_job_without_faults_and_a_killed_launcher(tmp_path):
    # A launcher SIGKILLed mid-run has no exit record: its last record ends it.
    path = write(tmp_path / "ft_events.jsonl", [
        ev("launcher_started", 0.0, A0), ev("cycle_start", 1.0, A0, cycle=0, workers={"0": 1}),
        ev("rank_connected", 2.0, A0, rank=0, pid=1, restart_count=0), ev("progress", 9.0, A0, iteration=5)])
    report = build_report(load_records([path]))
    assert report.faults == [] and report.wall_time_s == 9.0 and report.training_time_s == 7.0
    assert report.exit_codes == [None]


def test_cli_json_and_timeline(job_dir, tmp_path, capsys):
    png = tmp_path / "timeline.png"
    assert main([str(job_dir), "--json", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["faults_total"] == 2 and data["attempts"] == 2
    with open(png, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert main([str(job_dir)]) == 0
    assert "goodput" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])


def test_a_node_sees_a_peer_fault_as_a_fault_but_not_an_exclusion(tmp_path):
    # Node A's own log only: B's hang appears as a "peer" restart, which still cost A the cycle.
    path = write(tmp_path / "ft_events.jsonl", attempt0()[A0])
    (fault,) = build_report(load_records([path])).faults
    assert fault.kind == "peer" and fault.culprit_rank is None and "rank 3 hung" in fault.reason
    excluded = [*attempt0()[A0][:4], ev("workload_control", 15.0, A0, action="ExcludeThisNode", rank=1),
                *attempt0()[A0][4:]]
    path = write(tmp_path / "excluded" / "ft_events.jsonl", excluded)
    assert build_report(load_records([path])).faults == []


def test_several_hung_ranks_leave_the_culprit_unknown(tmp_path):
    # A collective hang: both ranks miss their deadline; the log cannot say which one stopped first.
    records = [*attempt0()[B0]]
    records.insert(4, ev("hang_detected", 20.3, B0, rank=2, pid=2002, reason="section", section="step",
                         elapsed=1.5, timeout=2.0, iteration=15))
    (fault,) = build_report(load_records([write(tmp_path / "ft_events.jsonl", records)])).faults
    assert fault.culprit_rank is None and fault.ranks == [3, 2] and fault.time == pytest.approx(18.0)


def test_the_analysis_reads_typed_records(job_dir):
    # Each line is decoded into its event type: enums and ints, not strings and dicts.
    records = load_records(find_event_files([str(job_dir)]))
    written = sum(len(own) for nodes in (attempt0(), attempt1()) for own in nodes.values())
    assert len(records) == written and all(isinstance(r, Event) for r in records)
    (hang,) = [r for r in records if isinstance(r, HangDetected)]
    assert (hang.rank, hang.pid, hang.reason, hang.iteration) == (3, 2003, HangReason.SECTION, 15)
    assert {r.kind for r in records if isinstance(r, Restart)} == {RestartKind.PEER, RestartKind.HANG,
                                                                    RestartKind.CRASH}


def test_the_analysis_has_no_string_keyed_lookup():
    # Records are read by attribute: a renamed event field fails mypy there instead of silently reading None.
    tree = ast.parse(inspect.getsource(analysis))
    keyed = [node.lineno for node in ast.walk(tree)
             if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                 and isinstance(node.slice.value, str))
             or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                 and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))]
    assert keyed == []


def test_fields_and_events_the_schema_does_not_know_change_nothing(tmp_path):
    # A log of an older or newer version: a field since renamed or added, an event type this version lacks.
    plain = write(tmp_path / "plain" / "ft_events.jsonl", attempt0()[B0])
    other_version = [{**r, "elapsed_s": 99.0, "retired_field": "x"} for r in attempt0()[B0]]
    other_version.insert(4, {"event": "future_event", "time": 19.0, "node": B0, "rank": 3})
    other = write(tmp_path / "other" / "ft_events.jsonl", other_version)
    expected, report = build_report(load_records([plain])), build_report(load_records([other]))
    assert format_report(report) == format_report(expected)
    assert report.to_json() | {"files": []} == expected.to_json() | {"files": []}
    (fault,) = report.faults
    assert (fault.kind, fault.culprit_rank, fault.detection_s, fault.iteration) == ("hang", 3, 2.0, 15)


def test_a_record_of_the_wrong_type_is_skipped_not_misread(tmp_path, caplog):
    records = attempt0()[B0]
    records[3] = {**records[3], "pid": "2003"}  # the hang_detected record, its pid a string
    path = write(tmp_path / "ft_events.jsonl", records)
    loaded = load_records([path])
    assert len(loaded) == len(records) - 1 and not any(isinstance(r, HangDetected) for r in loaded)
    assert "$.pid" in caplog.text  # the warning names the field
    # The restart record still tells of the hang; without the hang record its rank and onset are unknown.
    (fault,) = build_report(loaded).faults
    assert (fault.kind, fault.culprit_rank, fault.iteration) == ("hang", None, None)


def decided(time: float, node: str, cycle: int, action: str, outcome: str = "restart", decided_by: str = A1,
            **fields) -> dict:
    return ev("fault_decision", time, node, cycle=cycle, action=action, outcome=outcome, reason=f"why {cycle}",
              restarts=cycle + 1, decided_by=decided_by, **fields)


def test_the_budget_by_cause_counts_each_decision_once_and_says_why_the_job_stopped(tmp_path):
    # Two nodes write the same job-wide decisions: a transient crash, a checkpoint marked bad (its fallback
    # rejected by two ranks), a suspect node named (no spare), a suspect node excluded, then the same
    # exception twice: a deterministic stop.
    bad = "/ckpt/step=20.ckpt"
    a = [decided(10.0, A1, 0, "restart"),
         decided(20.0, A1, 1, "mark_checkpoint_bad", checkpoint=bad),
         ev("checkpoint_rejected", 25.0, A1, rank=0, cycle=2, checkpoint=bad, reason="marked bad: NaN loss"),
         ev("checkpoint_rejected", 25.1, A1, rank=1, cycle=2, checkpoint=bad, reason="marked bad: NaN loss"),
         decided(30.0, A1, 2, "restart", suspect_node=B1),
         decided(40.0, A1, 3, "exclude_node", suspect_node=B1),
         decided(50.0, A1, 4, "stop", outcome="stop")]
    b = [{**record, "node": B1} for record in a if record["event"] == "fault_decision"]
    b[3]["outcome"] = "leave"  # B was the excluded node
    report = build_report(load_records([write(tmp_path / "a.jsonl", a), write(tmp_path / "b.jsonl", b)]))
    assert report.restarts_by_cause == {"transient": 1, "bad checkpoint": 1, "suspect node (no spare)": 1,
                                        "suspect node excluded": 1}
    assert report.stopped_by == "deterministic fault: why 4"
    assert report.rejected_checkpoints == {bad: "marked bad: NaN loss"}
    text = format_report(report)
    assert "  restarts       : 4 by cause: 1 transient, 1 bad checkpoint, 1 suspect node (no spare), " \
           "1 suspect node excluded" in text
    assert "  stopped by     : deterministic fault: why 4" in text
    assert f"  rejected       : 1 checkpoint(s): {bad} (marked bad: NaN loss)" in text
    summary = short_summary(report)
    assert summary[2:] == ["restarts   : 4 by cause: 1 transient, 1 bad checkpoint, 1 suspect node (no spare), "
                           "1 suspect node excluded", "stopped by : deterministic fault: why 4",
                           f"rejected   : 1 checkpoint(s): {bad} (marked bad: NaN loss)"]


def test_a_stop_for_the_budget_is_not_a_deterministic_fault_and_a_job_without_faults_says_nothing(tmp_path):
    path = write(tmp_path / "a.jsonl", [decided(10.0, A1, 0, "restart"),
                                        decided(20.0, A1, 1, "restart", outcome="stop")])
    report = build_report(load_records([path]))
    assert (report.restarts_by_cause, report.stopped_by) == ({"transient": 1}, "why 1")
    quiet = build_report(load_records([write(tmp_path / "b.jsonl", [ev("launcher_started", 0.0, A0)])]))
    assert len(short_summary(quiet)) == 2
