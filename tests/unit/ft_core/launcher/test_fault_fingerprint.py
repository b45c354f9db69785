"""The fingerprint of a faulty cycle (:func:`ft_core.launcher.fault_fingerprint.fingerprint`): a pure function of
the cycle's :class:`.CycleObservations`, built here directly. A hang's cycle is fingerprinted by the hang, not by a
waiter's exception; a crash by the rank that died first.
"""

from __future__ import annotations

import os
import threading

from ft_core.diagnosis import evidence_of_hang
from ft_core.events import (
    CheckpointLoaded,
    FaultFingerprint,
    HangDetected,
    HangReason,
    RankEvidence,
    RankException,
    RestartKind,
    ResumeChosen,
    ResumeSource,
)
from ft_core.fault_policy import NONFINITE_LOSS_ERROR, FaultAction, FaultClass, Fingerprint, decide_fault
from ft_core.launcher.cycle_observations import CycleObservations
from ft_core.launcher.fault_fingerprint import fingerprint as fingerprint_of
from ft_core.launcher.fault_fingerprint import fingerprint_record
from ft_core.launcher.resumed_checkpoint import megatron_load_at_start

NODE = "hostA:7"
#: Local rank -> global rank of the cycle's two workers on this node.
RANKS = {0: 2, 1: 3}


class Seen(CycleObservations):
    """The cycle's observations, with :meth:`fingerprint` as the agent takes it: the function and its record."""

    def fingerprint(self, kind: RestartKind, written: list[object]):
        result = fingerprint_of(self, kind, NODE, RANKS)
        if result is not None:
            written.append(fingerprint_record(result, self.cycle))
        return result


def test_a_hangs_fingerprint_names_the_hung_rank_not_a_waiter_that_raised():
    # Killing the hung rank breaks its peer's collective: the peer may report its exception before the
    # launcher ends the cycle. Fingerprinted as an exception, two such cycles in a row would stop the
    # job as a deterministic fault of the waiter.
    written: list[object] = []
    seen = Seen()
    seen.failed = {0: (100, -9)}
    seen.hangs = {100: HangDetected(rank=0, pid=100, reason=HangReason.HEARTBEAT, section=None, elapsed=1.0,
                                      timeout=1.0, iteration=4, open_sections=[], deadline_time=1.0,
                                      detected_time=1.0, stack_dump_file=None)}
    seen.exceptions = [RankException(rank=1, pid=101, exception_type="RuntimeError",
                                       frames=["train.py:10 step"], iteration=4)]
    seen.loaded = None
    fingerprint = seen.fingerprint(RestartKind.HANG, written)
    assert fingerprint is not None and (fingerprint.kind, fingerprint.culprits) == (FaultClass.HANG, (0,))
    (record,) = written
    assert isinstance(record, FaultFingerprint) and (record.kind, record.culprits) == ("hang", [0])
    # A crash is still fingerprinted by the exception its rank reported.
    seen.failed = {1: (101, 1)}
    fingerprint = seen.fingerprint(RestartKind.CRASH, written)
    assert fingerprint is not None and (fingerprint.kind, fingerprint.culprits) == (FaultClass.EXCEPTION, (1,))


def test_a_fingerprint_names_the_checkpoint_the_cycle_resumed_from_and_a_nan_loss_is_its_own_kind():
    written: list[object] = []
    seen = Seen()
    seen.failed = {0: (100, 1)}
    seen.loaded = CheckpointLoaded(rank=0, cycle=2, checkpoint="/c/step=20.ckpt", step=20, time=1.0)
    seen.exceptions = [RankException(rank=0, pid=100, exception_type=NONFINITE_LOSS_ERROR,
                                       frames=["train.py:10 step"], iteration=21)]
    fingerprint = seen.fingerprint(RestartKind.CRASH, written)
    assert fingerprint is not None and fingerprint.kind is FaultClass.NONFINITE_LOSS
    assert (fingerprint.resumed_from, fingerprint.resumed_step, fingerprint.steps_after_resume) == (
        "/c/step=20.ckpt", 20, 1)
    (record,) = written
    assert isinstance(record, FaultFingerprint)
    assert (record.kind, record.resumed_from, record.resumed_step) == ("nonfinite_loss", "/c/step=20.ckpt", 20)


def test_after_a_resume_from_a_snapshot_the_fingerprint_names_the_snapshot_not_the_disk_checkpoint():
    # The ranks loaded the disk checkpoint of step 20, then a newer in-memory snapshot replaced it: a
    # fault right after is evidence against the snapshot (rule 1 may condemn it), none against the disk
    # checkpoint (rule 1 must not mark it bad).
    written: list[object] = []
    seen = Seen()
    seen.failed = {0: (100, 1)}
    seen.loaded = CheckpointLoaded(rank=0, cycle=2, checkpoint="/c/step=20.ckpt", step=20, time=1.0)
    seen.resumed_snapshot = ResumeChosen(cycle=2, source=ResumeSource.SNAPSHOT, step=26, reason="newer",
                                           world_size=2, disk_step=20, snapshot_step=26, snapshot="snapshot:26:1.1")
    seen.exceptions = [RankException(rank=0, pid=100, exception_type="ValueError", frames=["train.py:10 step"],
                                       iteration=27)]
    fingerprint = seen.fingerprint(RestartKind.CRASH, written)
    assert fingerprint is not None
    assert (fingerprint.resumed_from, fingerprint.resumed_step, fingerprint.steps_after_resume) == (
        "snapshot:26:1.1", 26, 1)
    (record,) = written
    assert isinstance(record, FaultFingerprint) and record.resumed_from == "snapshot:26:1.1"


def test_every_rank_raising_alike_has_no_first_culprit_and_megatrons_resume_is_inferred(tmp_path):
    # Unmodified Megatron-LM: no checkpoint_loaded record. The tracker of --load named 40 when the cycle
    # started, and the ranks' first reported iteration (the monitor's) confirms the resume from iter_0000040.
    os.makedirs(tmp_path / "iter_0000040")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("40\n")
    written: list[object] = []
    seen = Seen()
    seen.load_dir, seen.tracker_at_start = megatron_load_at_start(("-u", "pretrain_gpt.py", "--load", str(tmp_path)))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("50\n")  # a later save moves it: not the resume
    seen.failed = {1: (103, 1)}  # local rank 1 is rank 3
    seen.exceptions = [RankException(rank=r, pid=100 + r, exception_type="RuntimeError",
                                       frames=["pretrain.py:158 train"], iteration=40, first_iteration=40)
                         for r in (3, 2)]
    fingerprint = seen.fingerprint(RestartKind.CRASH, written)
    assert fingerprint is not None and (fingerprint.culprits, fingerprint.alike) == ((2, 3), True)
    assert (fingerprint.resumed_from, fingerprint.resumed_step) == (str(tmp_path / "iter_0000040"), 40)
    # One rank's report only, or ranks that raised differently: the first rank is the culprit.
    seen.exceptions = seen.exceptions[:1] + [RankException(rank=2, pid=102, exception_type="RuntimeError",
                                                               frames=["pretrain.py:99 train"], iteration=40)]
    fingerprint = seen.fingerprint(RestartKind.CRASH, written)
    assert fingerprint is not None and (fingerprint.culprits, fingerprint.alike) == ((3,), False)
    # A rank that reported an earlier iteration first did not resume from 40: nothing is inferred.
    seen.exceptions = [RankException(rank=3, pid=103, exception_type="RuntimeError",
                                       frames=["pretrain.py:158 train"], iteration=41, first_iteration=0)]
    fingerprint = seen.fingerprint(RestartKind.CRASH, written)
    assert fingerprint is not None and fingerprint.resumed_from is None


STACK = f"""Current thread 0x00007f (most recent call first):
  File "{threading.__file__}", line 320 in wait
  File "/work/train.py", line 42 in wait_for_peer
  File "/work/train.py", line 90 in training_step
  File "/work/train.py", line 120 in main

Thread 0x00007e (most recent call first):
  File "/work/loader.py", line 7 in prefetch
"""


def test_a_hangs_fingerprint_carries_the_innermost_user_frames_of_the_hung_ranks_stack_and_its_node():
    written: list[object] = []
    seen = Seen()
    seen.failed = {1: (101, -15)}
    seen.hangs = {101: HangDetected(rank=3, pid=101, reason=HangReason.HEARTBEAT, section="step", elapsed=9.0,
                                      timeout=8.0, iteration=30, open_sections=["step"], deadline_time=1.0,
                                      detected_time=1.0, stack_dump_file="/tmp/s", stack=STACK)}
    fingerprint = seen.fingerprint(RestartKind.HANG, written)
    assert fingerprint is not None
    assert fingerprint.frames == ("train.py:42 wait_for_peer", "train.py:90 training_step", "train.py:120 main")
    assert (fingerprint.culprits, fingerprint.nodes, fingerprint.iteration) == ((3,), ("hostA:7",), 30)
    (record,) = written
    assert isinstance(record, FaultFingerprint) and record.nodes == ["hostA:7"] and record.frames[0].endswith("peer")
    # A rank that hung waiting in a collective is a waiter: the suspect is the other one, whenever it hung.
    waiting = STACK.replace(f"{threading.__file__}\", line 320 in wait", "/x/torch/distributed/c10d.py\", line 9 in all_reduce")
    seen.hangs[100] = HangDetected(rank=2, pid=100, reason=HangReason.HEARTBEAT, section="step", elapsed=9.0,
                                     timeout=8.0, iteration=30, open_sections=["step"], deadline_time=0.5,
                                     detected_time=0.5, stack_dump_file="/tmp/w", stack=waiting)
    fingerprint = seen.fingerprint(RestartKind.HANG, written)
    assert fingerprint is not None and fingerprint.culprits == (3,) and fingerprint.frames[0] == "train.py:42 wait_for_peer"


def test_when_only_a_waiter_has_hung_yet_the_live_ranks_stacks_name_the_rank_it_waits_for():
    # Seen in CI on a loaded machine: the waiter (blocked in a collective) expired first; the hung rank was
    # still within its timeout. The diagnosis named the hung rank from the live ranks' stacks; the
    # fingerprint, on the hang records alone, named the waiter.
    written: list[object] = []
    seen = Seen()
    waiting = STACK.replace(f"{threading.__file__}\", line 320 in wait", "/x/torch/distributed/c10d.py\", line 9 in all_reduce")
    seen.hangs = {100: HangDetected(rank=2, pid=100, reason=HangReason.SECTION, section="step", elapsed=3.0,
                                      timeout=3.0, iteration=3, open_sections=["step"], deadline_time=5.0,
                                      detected_time=5.0, stack_dump_file="/tmp/w", stack=waiting)}
    before = seen.fingerprint(RestartKind.HANG, [])  # before the live ranks' evidence is taken: only a waiter
    assert before is not None and (before.culprits, before.nodes, before.iteration) == ((), (), 3)
    seen.evidence = [evidence_of_hang(seen.hangs[100], NODE),
                     RankEvidence(rank=3, pid=101, node=NODE, iteration=3, section="step", last_activity=2.5,
                                  stalled_for=2.6, in_collective=False)]
    fingerprint = seen.fingerprint(RestartKind.HANG, written)
    assert fingerprint is not None and (fingerprint.culprits, fingerprint.nodes, fingerprint.iteration) == (
        (3,), (NODE,), 3)
    assert fingerprint.frames == ()  # the live rank has no hang record: no stack of its own to fingerprint


def test_a_node_whose_ranks_only_wait_in_a_collective_names_no_culprit_and_is_never_made_a_suspect():
    # Seen in benchmarks/goodput.py: a node of one rank, waiting in the all-reduce for a hung rank on another
    # node, fingerprinted its own waiter; with a crash of its own before, three "different faults in a row on
    # this node" excluded it, while the job-wide diagnosis named the other node's rank.
    waiting = STACK.replace(f"{threading.__file__}\", line 320 in wait", "/x/torch/distributed/c10d.py\", line 9 in all_reduce")
    history = [Fingerprint(FaultClass.EXCEPTION, culprits=(2,), nodes=(NODE,), exception_type="RuntimeError",
                           frames=("train.py:7 step",), iteration=10)]
    for cycle in (1, 2):
        seen = Seen()
        seen.cycle = cycle
        seen.hangs = {100: HangDetected(rank=2, pid=100, reason=HangReason.HEARTBEAT, section=None, elapsed=1.0,
                                          timeout=1.0, iteration=20 * cycle, open_sections=[], deadline_time=5.0,
                                          detected_time=5.0, stack_dump_file="/tmp/w", stack=waiting)}
        seen.evidence = [evidence_of_hang(seen.hangs[100], NODE)]
        fingerprint = seen.fingerprint(RestartKind.HANG, [])
        assert fingerprint is not None
        assert (fingerprint.kind, fingerprint.culprits, fingerprint.nodes) == (FaultClass.HANG, (), ())
        history.append(fingerprint)
    verdict = decide_fault(history, spare_waiting=True)
    assert verdict.action is FaultAction.RESTART and verdict.node is None, verdict


def crash_cycle(gone_at: dict[int, float], reported_at: float, failed: tuple[int, ...] = (100, 101)) -> FaultFingerprint:
    """Local rank 1 (pid 101) exited with code 3 without a report; local rank 0 (pid 100) reported a gloo
    error at ``reported_at`` and exited 1. ``gone_at``: the monitor's records of their connections' ends;
    ``failed``: the pids this launcher saw dead at its first look (at time 11.0)."""
    written: list[object] = []
    seen = Seen()
    seen.failed = {local: (pid, code) for local, pid, code in ((0, 100, 1), (1, 101, 3)) if pid in failed}
    seen.failed_at = 11.0
    seen.connected = {100, 101}
    seen.gone_at = gone_at
    seen.exceptions = [RankException(rank=2, pid=100, exception_type="torch.distributed.DistBackendError",
                                       frames=["train.py:50 all_reduce"], iteration=7, time=reported_at)]
    seen.fingerprint(RestartKind.CRASH, written)
    (record,) = written
    assert isinstance(record, FaultFingerprint)
    return record


def test_a_crash_is_blamed_on_the_rank_that_died_first_not_on_the_exception_it_caused():
    # Rank 3 died silently first; rank 2's collective lost its peer, it raised, reported, and exited: a reaction.
    reaction = crash_cycle({101: 10.0, 100: 10.2}, reported_at=10.1)
    assert (reaction.kind, reaction.culprits, reaction.nodes, reaction.exception_type) == (
        "crash", [3], ["hostA:7"], None)
    # A busy monitor read rank 2's report before rank 3's death (rank 2's pending heartbeat came first), but
    # rank 2 was still connected after rank 3's end: still a reaction.
    assert crash_cycle({101: 10.3}, reported_at=10.1, failed=(101,)).culprits == [3]
    # Rank 2 raised and exited first; rank 3 died after it (a peer's reaction that sent no report): the exception
    # is the fault, even when the monitor read rank 3's death before rank 2's report.
    cause = crash_cycle({100: 10.2, 101: 10.3}, reported_at=10.1)
    assert (cause.kind, cause.culprits, cause.iteration) == ("exception", [2], 7)
    assert crash_cycle({100: 10.2, 101: 10.3}, reported_at=10.25).kind == "exception"
    # Rank 2 raised first and its teardown broke rank 3's collective before rank 2's process exited: the launcher
    # saw rank 3 dead first, but rank 2's connection had ended before (the case seen with real processes).
    assert crash_cycle({100: 10.2, 101: 10.6}, reported_at=10.1, failed=(101,)).kind == "exception"
    # Rank 3 never connected, rank 2's end is recorded before the launcher saw rank 3 dead: nothing says rank 3
    # died first, the exception is blamed.
    assert crash_cycle({100: 10.2}, reported_at=10.1).kind == "exception"
