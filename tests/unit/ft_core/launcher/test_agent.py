"""FtElasticAgent's bookkeeping, on agents holding only the state it reads.

It keeps what torch's own monitoring loop does on every pass (the group's state and its metrics),
and fingerprints a hang's cycle by the hang, not by a waiter's exception.
"""

from __future__ import annotations

import types

import pytest
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.metrics import api as metrics_api

from ft_core.events import (
    CheckpointLoaded,
    FaultFingerprint,
    HangDetected,
    HangReason,
    RankException,
    RestartKind,
)
from ft_core.fault_policy import NONFINITE_LOSS_ERROR, FaultKind
from ft_core.launcher.agent import FtElasticAgent
from ft_core.launcher.agent_state import Trigger
from ft_core.launcher.outcome import Outcome


class Recorder(metrics_api.MetricHandler):
    def __init__(self) -> None:
        self.points: list[tuple[str, str, int]] = []

    def emit(self, metric_data: metrics_api.MetricData) -> None:
        self.points.append((metric_data.group_name, metric_data.name, metric_data.value))


@pytest.fixture
def recorder(monkeypatch):
    handler = Recorder()
    monkeypatch.setattr(metrics_api, "_metrics_map", {"torchelastic": handler})  # torch's registry, restored after
    return handler


def agent_with(role: str, remaining_restarts: int) -> FtElasticAgent:
    """Only the state the pass's bookkeeping reads (torch's worker group and restart count)."""
    agent = FtElasticAgent.__new__(FtElasticAgent)
    agent._worker_group = types.SimpleNamespace(state=WorkerState.HEALTHY, spec=types.SimpleNamespace(role=role))
    agent._remaining_restarts = remaining_restarts
    return agent


def test_each_pass_sets_the_group_state_and_puts_torchs_metrics(recorder):
    agent = agent_with("trainer", 3)
    agent._record_pass(RunResult(state=WorkerState.FAILED))
    assert agent._worker_group.state is WorkerState.FAILED
    assert recorder.points == [("torchelastic", "workers.trainer.remaining_restarts", 3),
                               ("torchelastic", "workers.trainer.failed", 1)]
    agent._record_pass(RunResult(state=WorkerState.HEALTHY))
    assert agent._worker_group.state is WorkerState.HEALTHY
    assert recorder.points[-1] == ("torchelastic", "workers.trainer.healthy", 1)


def test_a_group_the_launcher_gives_up_on_ends_failed_as_in_torchs_loop(recorder):
    agent = agent_with("trainer", 0)
    outcome = Outcome(1, "restart budget spent")
    result = agent._finish(outcome, RunResult(state=WorkerState.FAILED))
    assert result.state is WorkerState.FAILED and agent.outcome is outcome
    assert agent._worker_group.state is WorkerState.FAILED


def test_a_hangs_fingerprint_names_the_hung_rank_not_a_waiter_that_raised():
    # Killing the hung rank breaks its peer's collective: the peer may report its exception before the
    # launcher ends the cycle. Fingerprinted as an exception, two such cycles in a row would stop the
    # job as a deterministic fault of the waiter.
    agent = FtElasticAgent.__new__(FtElasticAgent)
    written: list[object] = []
    agent._svc = types.SimpleNamespace(events=types.SimpleNamespace(write=written.append))
    agent._cycle = None
    agent._failed = {0: (100, -9)}
    agent._hangs = {100: HangDetected(rank=0, pid=100, reason=HangReason.HEARTBEAT, section=None, elapsed=1.0,
                                      timeout=1.0, iteration=4, open_sections=[], deadline_time=1.0,
                                      detected_time=1.0, stack_dump_file=None)}
    agent._exceptions = [RankException(rank=1, pid=101, exception_type="RuntimeError",
                                       frames=["train.py:10 step"], iteration=4)]
    agent._loaded = None
    fingerprint = agent._fingerprint(Trigger(RestartKind.HANG, "rank 0 hung", 1.0))
    assert fingerprint is not None and (fingerprint.kind, fingerprint.culprits) == (FaultKind.HANG, (0,))
    (record,) = written
    assert isinstance(record, FaultFingerprint) and (record.kind, record.culprits) == ("hang", [0])
    # A crash is still fingerprinted by the exception its rank reported.
    fingerprint = agent._fingerprint(Trigger(RestartKind.CRASH, "rank 1 exited with code 1", 1.0))
    assert fingerprint is not None and (fingerprint.kind, fingerprint.culprits) == (FaultKind.EXCEPTION, (1,))


def test_a_fingerprint_names_the_checkpoint_the_cycle_resumed_from_and_a_nan_loss_is_its_own_kind():
    agent = FtElasticAgent.__new__(FtElasticAgent)
    written: list[object] = []
    agent._svc = types.SimpleNamespace(events=types.SimpleNamespace(write=written.append))
    agent._cycle, agent._hangs, agent._failed = None, {}, {0: (100, 1)}
    agent._loaded = CheckpointLoaded(rank=0, cycle=2, checkpoint="/c/step=20.ckpt", step=20, time=1.0)
    agent._exceptions = [RankException(rank=0, pid=100, exception_type=NONFINITE_LOSS_ERROR,
                                       frames=["train.py:10 step"], iteration=21)]
    fingerprint = agent._fingerprint(Trigger(RestartKind.CRASH, "rank 0 exited with code 1", 1.0))
    assert fingerprint is not None and fingerprint.kind is FaultKind.NONFINITE_LOSS
    assert (fingerprint.resumed_from, fingerprint.resumed_step, fingerprint.steps_after_resume) == (
        "/c/step=20.ckpt", 20, 1)
    (record,) = written
    assert isinstance(record, FaultFingerprint)
    assert (record.kind, record.resumed_from, record.resumed_step) == ("nonfinite_loss", "/c/step=20.ckpt", 20)
