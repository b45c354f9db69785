"""The job-wide decision on a fault (``decide_cycle_end``): the fault policy's verdicts carried into the job state."""

from __future__ import annotations

from ft_core.fault_policy import NONFINITE_LOSS_ERROR, FaultAction, FaultClass, Fingerprint
from ft_core.launcher.coordination import (
    DecisionAction,
    JobState,
    RestartPolicy,
    decide_cycle_end,
)

POLICY = RestartPolicy(max_restarts=5, max_no_progress_cycles=3, no_restart_exit_code=93)
BAD = "/ckpt/step=20.ckpt"


def end(state: JobState, cycle: int, fingerprint: Fingerprint, best_progress: int = 20,
        spare_waiting: bool = False) -> JobState:
    return decide_cycle_end(state, cycle, "worker failed", fault=True, progress_active=True,
                            best_progress=best_progress, policy=POLICY, node="n:1", fingerprint=fingerprint,
                            spare_waiting=spare_waiting)


def nan_loss(resumed_from: str = BAD, resumed_step: int = 20) -> Fingerprint:
    return Fingerprint(FaultClass.NONFINITE_LOSS, culprits=(0,), iteration=resumed_step + 1,
                       exception_type=NONFINITE_LOSS_ERROR, frames=("train.py:9 step",),
                       resumed_from=resumed_from, resumed_step=resumed_step)


def test_a_nonfinite_loss_after_a_resume_marks_the_checkpoint_bad_and_restarts():
    state = end(JobState(), 0, nan_loss())
    assert state.decision is not None and state.decision.action is DecisionAction.RESTART
    assert state.decision.mark_bad == BAD
    assert "checkpoint marked bad" in state.decision.reason and BAD in state.decision.reason
    assert state.marked_bad == (BAD,) and state.restarts == 1 and state.no_progress == 0


def test_a_checkpoint_is_marked_bad_once_and_the_job_state_survives_its_encoding():
    state = JobState.decode(end(JobState(), 0, nan_loss()).encode())
    again = end(state, 1, nan_loss())  # the mark did not take (say, another node's disk): no second mark
    assert again.decision is not None and again.decision.mark_bad is None
    assert again.marked_bad == (BAD,)


def test_the_same_exception_twice_from_the_same_checkpoint_right_after_resuming_marks_it_bad_not_stop():
    boom = Fingerprint(FaultClass.EXCEPTION, culprits=(1,), iteration=22, exception_type="ValueError",
                       frames=("train.py:30 step",), resumed_from=BAD, resumed_step=20)
    first = end(JobState(progress_mark=20), 0, boom)
    assert first.decision is not None and first.decision.mark_bad is None
    second = end(first, 1, boom)
    assert second.decision is not None and second.decision.action is DecisionAction.RESTART
    assert second.decision.mark_bad == BAD  # rule 1 before rule 2: an older checkpoint may well help


def test_a_transient_fault_marks_nothing():
    crash = Fingerprint(FaultClass.SIGNAL, culprits=(1,), signal="SIGKILL", resumed_from=BAD, resumed_step=20)
    state = JobState()
    for cycle in range(4):
        state = end(state, cycle, crash, best_progress=20 + 10 * cycle)
        assert state.decision is not None and state.decision.action is DecisionAction.RESTART
        assert state.decision.mark_bad is None
    assert state.marked_bad == ()


def test_marking_bad_never_spends_more_than_the_budget():
    state = JobState(restarts=POLICY.max_restarts)
    state = end(state, 9, nan_loss())
    assert state.decision is not None and state.decision.action is DecisionAction.STOP
    assert "restart budget spent" in state.decision.reason and state.marked_bad == ()


#: Three different faults of node B's ranks (a crash, a signal, an exception): they follow the node.
ON_B = [Fingerprint(FaultClass.CRASH, culprits=(2,), nodes=("B:1",)),
        Fingerprint(FaultClass.SIGNAL, culprits=(3,), nodes=("B:1",), signal="SIGSEGV"),
        Fingerprint(FaultClass.EXCEPTION, culprits=(2,), nodes=("B:1",), iteration=7, exception_type="OSError",
                    frames=("io.py:3 read",))]


def test_faults_that_follow_a_node_exclude_it_when_a_spare_waits_and_every_decision_says_its_verdict():
    state = JobState()
    for cycle, fingerprint in enumerate(ON_B):
        state = JobState.decode(end(state, cycle, fingerprint, spare_waiting=True).encode())
        assert state.decision is not None and state.decision.action is DecisionAction.RESTART
    assert state.decision is not None
    assert (state.decision.fault_action, state.decision.suspect_node) == (FaultAction.EXCLUDE_NODE, "B:1")
    assert "suspect node: 3 different faults in a row on node B:1" in state.decision.reason
    assert state.restarts == 3  # the faults spent the budget; the exclusion is the third one's restart
    first = end(JobState(), 0, ON_B[0], spare_waiting=True).decision
    assert first is not None and (first.fault_action, first.suspect_node) == (FaultAction.RESTART, None)


def test_without_a_spare_the_suspect_node_is_named_in_the_cause_and_the_job_restarts():
    state = JobState()
    for cycle, fingerprint in enumerate(ON_B):
        state = end(state, cycle, fingerprint)
    assert state.decision is not None and state.decision.action is DecisionAction.RESTART
    assert (state.decision.fault_action, state.decision.suspect_node) == (FaultAction.RESTART, "B:1")
    assert "no spare waits to replace it" in state.decision.reason


def test_a_membership_change_has_no_fault_verdict():
    state = decide_cycle_end(JobState(), 0, "new nodes are waiting", fault=False, progress_active=False,
                             best_progress=-1, policy=POLICY, node="n:1")
    assert state.decision is not None and state.decision.fault_action is None


def test_a_job_on_one_node_never_suspects_it():
    state = JobState()
    for cycle, fingerprint in enumerate(ON_B):
        state = decide_cycle_end(state, cycle, "worker failed", fault=True, progress_active=True, best_progress=20,
                                 policy=POLICY, node="B:1", fingerprint=fingerprint, only_node=True)
    assert state.decision is not None and state.decision.suspect_node is None
    assert "suspect" not in state.decision.reason
