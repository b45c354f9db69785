"""The event records (ft_core.events): one sample of every type, their JSON, their round trip through the file."""

from __future__ import annotations

import json
import os
import typing

import pytest

from ft_core import event_file as ef
from ft_core import events as ev
from ft_core.straggler_scoring import PhaseMedian, StragglerAction

#: One instance of every record type, with every field set (optional ones too).
SAMPLES: list[ev.Event] = [
    ev.MonitorStarted(time=1.0, pid=10, socket="/job/monitor.sock"),
    ev.RankConnected(time=1.0, rank=3, local_rank=1, pid=11, restart_count=2),
    ev.RankDisconnected(time=1.0, rank=3, pid=11, graceful=True),
    ev.HangDetected(time=2.5, rank=1, pid=12, reason=ev.HangReason.SECTION, section="step", elapsed=5.012,
                    timeout=5.0, iteration=7, open_sections=["outer", "step"], deadline_time=2.49,
                    detected_time=2.5, stack_dump_file="/job/stacks/rank1_pid12.txt",
                    stack="Current thread 0x1 (most recent call first):\n  File \"t.py\", line 3 in f\n"),
    ev.RankTerminated(time=1.0, rank=1, pid=12, signal="SIGKILL"),
    ev.CheckpointReported(time=1.0, rank=0, iteration=100),
    ev.RankException(time=1.0, rank=1, pid=12, exception_type="ValueError", frames=["train.py:42 step"],
                     iteration=30),
    ev.TimeoutsUpdated(time=1.0, rank=0, timeouts={"section": {"step": 3.0}, "out_of_section": None}),
    ev.ConnectionRejected(time=1.0, pid=13, reason="wrong job token"),
    ev.MonitorLate(time=1.0, late=3.2, grace=3.2, ranks=[0, 1]),
    ev.DeadlineExtended(time=1.0, rank=2, pid=4242, reason=ev.HangReason.SECTION, section="checkpointing", timeout=30.0, bytes=1 << 20, cap=3.0),
    ev.LauncherStarted(time=1.0, run_id="job", min_nodes=1, max_nodes=2, nproc_per_node=4, max_restarts=3,
                       rdzv_backend="c10d", monitor_pid=10, config={"rank_heartbeat_timeout": 5.0}),
    ev.CycleStart(time=1.0, cycle=1, restarts=1, group_rank=0, group_world_size=2, world_size=8,
                  workers={"0": 21, "1": 22}, monitor_pid=10),
    ev.WorkerExit(time=1.0, cycle=1, local_rank=0, pid=21, cause="crash", rank=0, exit_code=1),
    ev.WorkerExit(time=1.0, cycle=1, local_rank=1, pid=22, cause="launcher SIGTERM", signal="SIGTERM"),
    ev.WorkersStopped(time=1.0, cycle=1),
    ev.WorkersSucceeded(time=1.0, cycle=None),
    ev.Restart(time=1.0, cycle=0, kind=ev.RestartKind.HANG, reason="rank 1 hung", restarts=1, max_restarts=3),
    ev.FaultFingerprint(time=1.0, cycle=0, kind="exception", culprits=[1], iteration=30, exception_type="ValueError",
                        frames=["train.py:42 step"]),
    ev.FaultDecision(time=1.0, cycle=2, action="exclude_node", outcome="restart", reason="crash; suspect node: ...",
                     restarts=3, decided_by="B:1", suspect_node="B:1"),
    ev.Progress(time=1.0, iteration=100, source="rank 0", cycle=1),
    ev.WorkloadControlReceived(time=1.0, action="ShutdownWorkload", rank=0, description="bad data"),
    ev.MonitorDied(time=1.0, exit_code=-9),
    ev.MonitorConnectionRejected(time=1.0, pid=13, reason="garbage"),
    ev.SignalReceived(time=1.0, signal="SIGTERM", running_workers=4),
    ev.LauncherExit(time=1.0, exit_code=93, reason="no progress"),
    ev.PhaseMedians(time=1.0, round=29925000, medians=[PhaseMedian(rank=3, phase="forward", median=0.1, samples=64)]),
    ev.Straggler(time=1.0, cycle=0, rank=3, rank_node="host:7", phase="forward", relative_score=0.62,
                 individual_score=0.98, median=0.16, window=64, threshold=0.75, consecutive=3,
                 action=StragglerAction.RESTART),
    ev.LiveRanks(time=1.0, ranks=[ev.RankEvidence(rank=0, pid=11, iteration=24, section="step", in_collective=True,
                                                      stack_dump_file="/s/rank0_pid11.txt")]),
    ev.Diagnosis(time=1.0, cycle=0, culprits=[1], waiting=[0], evidence="rank 0 was blocked in a collective",
                 headline="rank 1 (node h:7, pid 12) hung in section step at iteration 25 for 3.0 s; "
                          "ranks 0 were waiting for it", culprit_nodes=["h:7"], decided_by="h:7"),
    ev.ResumeChosen(time=1.0, cycle=1, source=ev.ResumeSource.SNAPSHOT, step=20, world_size=2, disk_step=10,
                    snapshot_step=20, snapshot_time=0.5, reason="every rank holds a verified snapshot of step 20, "
                                                                "newer than the disk checkpoint of step 10"),
    ev.CheckpointLoaded(time=1.0, rank=0, cycle=1, checkpoint="/ckpt/epoch=0-step=20.ckpt", step=20),
    ev.CheckpointMarkedBad(time=1.0, cycle=2, checkpoint="/ckpt/last.ckpt",
                           reason="non-finite loss 1 step(s) after resuming from /ckpt/last.ckpt"),
    ev.CheckpointRejected(time=1.0, rank=1, cycle=1, checkpoint="/ckpt/last.ckpt",
                          reason="truncated: 100 of 2048 bytes"),
]


def test_every_record_type_has_a_sample_and_one_event_name():
    types = set(typing.get_args(ev.AnyEvent))
    assert {type(s) for s in SAMPLES} == types
    names = [t.__struct_config__.tag for t in types]
    assert sorted(names) == sorted(name.value for name in ev.EventName)


def test_every_record_round_trips_through_the_file(tmp_path):
    path = str(tmp_path / "events.jsonl")
    with ef.EventWriter(path) as out:
        for record in SAMPLES:
            out.write(record)
    records, offset = ef.read_records(path)
    assert records == SAMPLES
    assert offset == os.path.getsize(path)


def test_the_json_keeps_plain_names_and_values(tmp_path):
    path = str(tmp_path / "events.jsonl")
    with ef.EventWriter(path, node="host:7") as out:
        out.write(ev.Restart(time=3.0, cycle=0, kind=ev.RestartKind.HANG, reason="r", restarts=1, max_restarts=2))
        out.write(ev.WorkerExit(time=3.0, cycle=0, local_rank=1, pid=5, cause="crash", signal="SIGKILL"))
    restart, worker_exit = (json.loads(line) for line in open(path, encoding="utf-8") if line.strip())
    assert restart == {"event": "restart", "time": 3.0, "node": "host:7", "cycle": 0, "kind": "hang",
                       "reason": "r", "restarts": 1, "max_restarts": 2}
    # "exit_code or signal": the unset one (and an unknown rank) is left out, as before.
    assert worker_exit == {"event": "worker_exit", "time": 3.0, "node": "host:7", "cycle": 0, "local_rank": 1,
                           "pid": 5, "cause": "crash", "signal": "SIGKILL"}


def test_event_names_are_plain_strings_in_the_json():
    assert json.dumps({"event": ev.EventName.HANG_DETECTED}) == '{"event": "hang_detected"}'
    assert SAMPLES[3].name is ev.EventName.HANG_DETECTED


@pytest.mark.parametrize(("kind", "fault"), [
    (ev.RestartKind.CRASH, True), (ev.RestartKind.HANG, True), (ev.RestartKind.MONITOR, True),
    (ev.RestartKind.UNHEALTHY, True), (ev.RestartKind.EXCLUDED, False), (ev.RestartKind.SHUTDOWN, False),
    (ev.RestartKind.PEER, False), (ev.RestartKind.MEMBERSHIP, False),
    # A straggler is slow, not broken: its restart spends no budget and is not "no progress".
    (ev.RestartKind.STRAGGLER, False),
    # ExcludeThisNode on a node the job cannot lose: the node is said to be faulty; a restart is spent.
    (ev.RestartKind.NODE_FAULT, True),
])
def test_which_restart_kinds_are_faults(kind, fault):
    assert kind.is_fault is fault


def test_the_hang_sentence():
    hang = SAMPLES[3]
    assert isinstance(hang, ev.HangDetected)
    assert hang.describe() == ("rank 1 (pid 12) hung: section timeout in section 'step', 5.0 s elapsed > 5.0 s "
                               "allowed, iteration 7")
    heartbeat = ev.HangDetected(time=1.0, rank=0, pid=3, reason=ev.HangReason.HEARTBEAT, section=None,
                                elapsed=3.25, timeout=3.0, iteration=None, open_sections=[], deadline_time=0.9,
                                detected_time=1.0, stack_dump_file=None)
    assert heartbeat.describe() == "rank 0 (pid 3) hung: heartbeat timeout, 3.2 s elapsed > 3.0 s allowed, iteration None"
