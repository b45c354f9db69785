"""FtElasticAgent's bookkeeping: what torch's own loop keeps on every pass, and the rendezvous it releases.

The pure decisions on what a node saw in a cycle are tested beside their modules
(``test_fault_fingerprint.py``, ``test_cycle_observations.py``).
"""

from __future__ import annotations

import types

import pytest
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.metrics import api as metrics_api

from ft_core.launcher.agent import FtElasticAgent
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


def test_a_failure_that_closes_the_rendezvous_is_recorded_as_the_jobs_stop_for_the_waiting_spares():
    # A spare waiting to join reads the job's end from the job store when the rendezvous closes: with no
    # stop recorded it takes the close for a finished job and exits 0. A launcher error must not read so.
    calls: list[object] = []
    agent = FtElasticAgent.__new__(FtElasticAgent)
    handler = types.SimpleNamespace(shutdown=lambda: calls.append("shutdown"))
    agent._worker_group = types.SimpleNamespace(spec=types.SimpleNamespace(rdzv_handler=handler))
    agent._coord = types.SimpleNamespace(job_store=object(), request_stop=lambda reason, code: calls.append((reason, code)),
                                         wait_spares_released=lambda count, timeout: True,
                                         close=lambda: calls.append("close"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("ft_core.launcher.agent.spares_waiting", lambda _handler: 0)
        agent.release_rendezvous(Outcome(1, "launcher error: OSError: boom"))
        assert calls == [("launcher error: OSError: boom", 1), "shutdown", "close"]
        calls.clear()
        agent.release_rendezvous(Outcome(0, "all workers finished successfully"))
        assert calls == ["shutdown", "close"]  # a finished job: nothing to stop; the decision notice ends
