"""The restart policy from fault fingerprints: a pure function of the job's faults (no processes)."""

from __future__ import annotations

import random

import pytest

from ft_core.fault_policy import FaultAction, FaultClass, FaultPolicy, Fingerprint, decide_fault, user_frames

CKPT = "/ckpt/step=20.ckpt"


def value_error(iteration: int = 30, *, resumed_step: int = 20, new_checkpoint: bool = False, node: str = "n1",
                resumed_from: str = CKPT) -> Fingerprint:
    return Fingerprint(FaultClass.EXCEPTION, culprits=(1,), nodes=(node,), iteration=iteration,
                       exception_type="ValueError", frames=("train.py:42 training_step",),
                       resumed_from=resumed_from, resumed_step=resumed_step, new_checkpoint=new_checkpoint)


def test_the_same_exception_twice_from_the_same_checkpoint_stops_with_a_headline():
    # Resumed at 0 (a fresh start), the fault at step 30: not "right after a resume".
    first, second = value_error(resumed_step=0, resumed_from=None), value_error(resumed_step=0, resumed_from=None)
    assert decide_fault([first]).action is FaultAction.RESTART
    verdict = decide_fault([first, second])
    assert verdict.action is FaultAction.STOP
    assert verdict.reason == ("ValueError at train.py:42 training_step on rank 1 at iteration 30, 2 times in a row "
                              "with no new checkpoint in between: a deterministic fault, restarting cannot help")


def test_a_fault_at_another_iteration_or_rank_is_not_the_same_fault():
    first = value_error(resumed_step=0, resumed_from=None)
    assert decide_fault([first, value_error(31, resumed_step=0, resumed_from=None)]).action is FaultAction.RESTART
    other_rank = dataclasses_replace(first, culprits=(0,))
    assert decide_fault([first, other_rank]).action is FaultAction.RESTART


def test_a_new_checkpoint_in_between_means_the_job_moved_on():
    first, second = (value_error(resumed_step=0, resumed_from=None, new_checkpoint=written) for written in (True, False))
    assert decide_fault([first, second]).action is FaultAction.STOP  # written before the first fault: not "in between"
    assert decide_fault([second, first]).action is FaultAction.RESTART  # written by the second fault's cycle


def test_crashes_and_signals_never_count_as_the_same_fault():
    """Without an exception or a stack nothing places a fault: the same rank killed twice may be two transients."""
    for kind, sig in ((FaultClass.SIGNAL, "SIGKILL"), (FaultClass.CRASH, None)):
        fault = Fingerprint(kind, culprits=(1,), iteration=None, signal=sig)
        assert decide_fault([fault] * 5).action is FaultAction.RESTART
    hang_without_stack = Fingerprint(FaultClass.HANG, culprits=(1,), iteration=30)
    assert decide_fault([hang_without_stack] * 5).action is FaultAction.RESTART
    hang = dataclasses_replace(hang_without_stack, frames=("data.py:10 next_batch",))
    assert decide_fault([hang] * 2).action is FaultAction.STOP


def test_the_rule_can_be_switched_off_or_made_patient():
    faults = [value_error(resumed_step=0, resumed_from=None)] * 2
    assert decide_fault(faults, FaultPolicy(max_identical_faults=0)).action is FaultAction.RESTART
    assert decide_fault(faults, FaultPolicy(max_identical_faults=3)).action is FaultAction.RESTART
    assert decide_fault(faults * 2, FaultPolicy(max_identical_faults=3)).action is FaultAction.STOP


def test_a_fault_right_after_resuming_twice_from_one_checkpoint_marks_it_bad_once():
    faults = [value_error(22), value_error(22)]  # 2 steps after resuming from step 20, twice
    verdict = decide_fault(faults)
    assert (verdict.action, verdict.checkpoint) == (FaultAction.MARK_CHECKPOINT_BAD, CKPT)
    assert "twice within 10 steps of resuming from /ckpt/step=20.ckpt" in verdict.reason
    # Once it is marked, the same fault from the same checkpoint again is a deterministic fault.
    assert decide_fault(faults, marked_bad=frozenset({CKPT})).action is FaultAction.STOP
    assert decide_fault(faults, FaultPolicy(suspect_checkpoint_steps=0)).action is FaultAction.STOP


def test_a_nonfinite_loss_right_after_a_resume_marks_the_checkpoint_bad_at_once():
    nan = Fingerprint(FaultClass.NONFINITE_LOSS, culprits=(0,), iteration=21, resumed_from=CKPT, resumed_step=20)
    verdict = decide_fault([nan])
    assert (verdict.action, verdict.checkpoint) == (FaultAction.MARK_CHECKPOINT_BAD, CKPT)
    assert verdict.reason == f"non-finite loss 1 step(s) after resuming from {CKPT}"


def test_faults_that_follow_one_node_exclude_it_when_a_spare_waits_else_name_it():
    faults = [Fingerprint(FaultClass.SIGNAL, culprits=(r,), nodes=("n7",), iteration=i, signal="SIGSEGV")
              for r, i in ((3, 100), (2, 250), (3, 410))]
    spare = decide_fault(faults, spare_waiting=True)
    assert (spare.action, spare.node) == (FaultAction.EXCLUDE_NODE, "n7")
    alone = decide_fault(faults)
    assert (alone.action, alone.node) == (FaultAction.RESTART, "n7") and "no spare waits" in alone.reason
    moved = faults[:2] + [dataclasses_replace(faults[2], nodes=("n2",))]
    assert decide_fault(moved, spare_waiting=True).action is FaultAction.RESTART


def dataclasses_replace(fingerprint: Fingerprint, **changes) -> Fingerprint:
    import dataclasses

    return dataclasses.replace(fingerprint, **changes)


def test_transient_faults_always_restart():
    """Random kills and hangs on random ranks and nodes at random steps: never a stop, never a mark (x20 jobs)."""
    rng = random.Random(7)
    for _ in range(20):
        history: list[Fingerprint] = []
        resumed = 0
        for _fault in range(8):
            iteration = resumed + rng.randint(15, 400)
            kind = rng.choice([FaultClass.SIGNAL, FaultClass.HANG, FaultClass.CRASH])
            rank = rng.randrange(16)
            history.append(Fingerprint(kind, culprits=(rank,), nodes=(f"n{rank // 8}{rng.randrange(100)}",),
                                       iteration=iteration, signal="SIGKILL" if kind is FaultClass.SIGNAL else None,
                                       frames=(f"train.py:{rng.randrange(500)} step",) if kind is FaultClass.HANG
                                       else (), resumed_from=f"/ckpt/{resumed}", resumed_step=resumed,
                                       new_checkpoint=True))
            assert decide_fault(history, spare_waiting=True).action is FaultAction.RESTART, history[-3:]
            resumed = iteration - rng.randint(0, 10)


def test_an_empty_history_is_a_programming_error():
    with pytest.raises(ValueError, match="history is empty"):
        decide_fault([])


def test_a_script_beside_the_package_is_user_code_and_torch_is_not():
    # In a source checkout the user's scripts sit beside ft_core (this test file does): only ft_core,
    # ft_integrations, the standard library and installed packages are skipped.
    import torch

    def training_step() -> None:
        torch.distributed.all_reduce(torch.ones(1))  # raises inside torch: no process group

    with pytest.raises(Exception) as failure:
        training_step()
    frames = user_frames(failure.value.__traceback__)
    assert frames[0].startswith("test_fault_policy.py:") and frames[0].endswith(" training_step"), frames
    assert not any("distributed_c10d.py" in f for f in frames)


def nan_check(culprit: int, *, alike: bool, iteration: int = 40) -> Fingerprint:
    """Megatron-LM's NaN check, raised at the first step after resuming from checkpoint 40."""
    return Fingerprint(FaultClass.EXCEPTION, culprits=(0, 1) if alike else (culprit,), nodes=("n1",),
                       iteration=iteration, exception_type="RuntimeError", frames=("pretrain.py:158 train",),
                       resumed_from="/ckpt/iter_0000040", resumed_step=40, alike=alike)


def test_a_fault_every_rank_raised_alike_is_the_same_fault_whichever_rank_died_first():
    # Issue 34: rank 0 exited first in one cycle, rank 1 in the next; a cycle's launcher may have
    # seen only the first rank's report. Either way, the same fault from the same checkpoint.
    for first, second in ((nan_check(0, alike=True), nan_check(1, alike=True)),
                          (nan_check(0, alike=True), nan_check(1, alike=False)),
                          (nan_check(1, alike=False), nan_check(0, alike=True))):
        assert first.same_fault(second) and second.same_fault(first)
        verdict = decide_fault([first, second])
        assert (verdict.action, verdict.checkpoint) == (FaultAction.MARK_CHECKPOINT_BAD, "/ckpt/iter_0000040")
        # Once marked, the same fault again is the deterministic-fault rule's: stop.
        marked = frozenset({"/ckpt/iter_0000040"})
        assert decide_fault([first, second], marked_bad=marked).action is FaultAction.STOP
    assert "on ranks 0, 1 alike at iteration 40" in nan_check(0, alike=True).describe()


def test_one_ranks_faults_on_different_ranks_stay_different_faults():
    # No report said "alike": the culprit rank is part of the fault (two transients on two ranks).
    first, second = nan_check(0, alike=False), nan_check(1, alike=False)
    assert not first.same_fault(second)
    assert decide_fault([first, second]).action is FaultAction.RESTART
    # Alike, but at another iteration: another fault.
    assert not nan_check(0, alike=True).same_fault(nan_check(0, alike=True, iteration=41))
