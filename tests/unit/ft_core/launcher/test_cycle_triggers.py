"""What ends a cycle (:mod:`ft_core.launcher.cycle_triggers`): pure functions of the cycle's
:class:`.CycleObservations`, a rank's request or a straggler report, built here directly."""

from __future__ import annotations

import signal
import types

from torch.distributed.elastic.agent.server.api import WorkerState

from ft_core.data import WorkloadAction
from ft_core.events import HangDetected, HangReason, RestartKind, Straggler
from ft_core.exit_causes import ExitCause
from ft_core.launcher.control import ControlRequest
from ft_core.launcher.cycle_observations import CycleObservations
from ft_core.launcher.cycle_triggers import control_trigger, straggler_trigger, worker_exits, worker_trigger
from ft_core.straggler_scoring import StragglerAction

#: Local rank -> global rank of the cycle's two workers on this node.
RANKS = {0: 2, 1: 3}


def _hang(pid: int, rank: int, detected: float) -> HangDetected:
    return HangDetected(rank=rank, pid=pid, reason=HangReason.HEARTBEAT, section="step", elapsed=9.0, timeout=8.0,
                        iteration=30, open_sections=["step"], deadline_time=detected, detected_time=detected,
                        stack_dump_file="/tmp/stack", stack=None)


def test_a_healthy_group_with_nothing_seen_goes_on_and_a_hung_rank_still_running_ends_the_cycle():
    seen = CycleObservations(cycle=1, pids=frozenset({100, 101}))
    assert worker_trigger(WorkerState.HEALTHY, seen, RANKS, {}, now=5.0) is None
    # The monitor could not kill it (a catchable termination signal): the hang itself ends the cycle, at its time.
    seen.hangs[101] = _hang(101, 3, detected=4.5)
    trigger = worker_trigger(WorkerState.HEALTHY, seen, RANKS, {}, now=5.0)
    assert trigger is not None and (trigger.kind, trigger.time) == (RestartKind.HANG, 4.5)


def test_a_failed_worker_is_a_crash_unless_the_monitor_had_found_it_hung():
    seen = CycleObservations(cycle=1, pids=frozenset({100, 101}), failed={0: (100, 3)}, failed_at=7.0)
    crash = worker_trigger(WorkerState.FAILED, seen, RANKS, {}, now=8.0)
    assert crash is not None and (crash.kind, crash.time) == (RestartKind.CRASH, 7.0)
    assert crash.reason == "rank 2 (pid 100) exited with code 3"
    killed = CycleObservations(cycle=1, pids=frozenset({100, 101}), failed={1: (101, -signal.SIGKILL)}, failed_at=7.0)
    killed.hangs[101] = _hang(101, 3, detected=6.5)
    hang = worker_trigger(WorkerState.FAILED, killed, RANKS, {}, now=8.0)
    assert hang is not None and hang.kind is RestartKind.HANG and hang.reason == killed.hangs[101].describe()
    # What torch alone saw fail (the launcher saw no worker die itself) is still a crash, named by torch's record.
    torch_only = worker_trigger(WorkerState.FAILED, CycleObservations(cycle=1), RANKS,
                                {2: types.SimpleNamespace(exitcode=1)}, now=8.0)
    assert torch_only is not None and torch_only.kind is RestartKind.CRASH and torch_only.time == 8.0
    assert torch_only.reason == "rank 2 failed (exit code 1)"


def test_a_group_stuck_in_uninterruptible_sleep_or_in_another_state_ends_the_cycle():
    seen = CycleObservations(cycle=1)
    unhealthy = worker_trigger(WorkerState.UNHEALTHY, seen, RANKS, {}, now=2.0)
    assert unhealthy is not None and unhealthy.kind is RestartKind.UNHEALTHY
    other = worker_trigger(WorkerState.UNKNOWN, seen, RANKS, {}, now=2.0)
    assert other is not None and other.kind is RestartKind.CRASH and "UNKNOWN" in other.reason


def test_worker_exit_records_name_each_failed_worker_its_cause_and_signal():
    seen = CycleObservations(cycle=4, pids=frozenset({100, 101}), failed={1: (101, -signal.SIGKILL), 0: (100, 3)},
                             failed_at=7.0)
    seen.hangs[101] = _hang(101, 3, detected=6.5)
    first, second = worker_exits(seen, RANKS)
    assert (first.local_rank, first.rank, first.cause, first.exit_code, first.signal) == (0, 2, ExitCause.CRASH, 3, None)
    assert (second.local_rank, second.rank, second.cause, second.signal) == (1, 3, ExitCause.HANG, "SIGKILL")
    assert {r.cycle for r in (first, second)} == {4} and {r.time for r in (first, second)} == {7.0}
    finished = worker_exits(seen, RANKS, cause=ExitCause.FINISHED)
    assert {r.cause for r in finished} == {ExitCause.FINISHED}


def test_a_ranks_request_to_leave_is_an_exclusion_only_when_the_node_can_leave():
    asked: list[str] = []

    def blocker(reason):
        return lambda: asked.append("asked") or reason

    exclude = ControlRequest(WorkloadAction.ExcludeThisNode, "bad GPU", rank=3, time=9.0)
    trigger = control_trigger(exclude, blocker(None))
    assert trigger is not None and (trigger.kind, trigger.time) == (RestartKind.EXCLUDED, 9.0)
    assert trigger.reason == "rank 3 requested ExcludeThisNode: bad GPU"
    # Leaving would end the job unfinished: restart every worker as after a fault, never only report.
    kept = control_trigger(exclude, blocker("the job cannot lose a node"))
    assert kept is not None and kept.kind is RestartKind.NODE_FAULT and "not excluded: the job cannot" in kept.reason
    shutdown = control_trigger(ControlRequest(WorkloadAction.ShutdownWorkload, "", rank=0, time=1.0), blocker(None))
    assert shutdown is not None and shutdown.kind is RestartKind.SHUTDOWN and shutdown.reason.endswith("ShutdownWorkload")
    asked.clear()
    assert control_trigger(ControlRequest(WorkloadAction.Continue, "", rank=0, time=1.0), blocker(None)) is None
    assert asked == []  # the network is looked at only for an exclusion


def _straggler(action: StragglerAction, rank_node: str) -> Straggler:
    return Straggler(cycle=1, rank=3, rank_node=rank_node, phase="forward", relative_score=0.5,
                     individual_score=0.9, median=0.2, window=10, threshold=0.7, consecutive=3, action=action)


def test_stragglers_restart_or_exclude_their_own_node_and_say_why_an_exclusion_fell_back():
    report = [_straggler(StragglerAction.REPORT, "hostA:7")]
    assert straggler_trigger(report, "hostA:7", lambda: None, now=3.0) == (None, [])
    restart, blocked = straggler_trigger([_straggler(StragglerAction.RESTART, "hostB:7")], "hostA:7", lambda: None, 3.0)
    assert restart is not None and restart.kind is RestartKind.STRAGGLER and blocked == []
    # Another node's straggler is that node's to exclude.
    assert straggler_trigger([_straggler(StragglerAction.EXCLUDE_NODE, "hostB:7")], "hostA:7",
                             lambda: None, 3.0) == (None, [])
    mine = [_straggler(StragglerAction.EXCLUDE_NODE, "hostA:7")]
    excluded, blocked = straggler_trigger(mine, "hostA:7", lambda: None, 3.0)
    assert excluded is not None and excluded.kind is RestartKind.EXCLUDED and blocked == []
    assert straggler_trigger(mine, "hostA:7", lambda: "no spare", 3.0) == (None, ["no spare"])
