"""The whole restart loop on a single rank, in this process (its watchdog process is real)."""

from __future__ import annotations

import os

import pytest
from helpers import free_port

from ft_core.inprocess import CallWrapper, RestartAbort, RetryController, State, Wrapper

pytestmark = pytest.mark.timeout(120)

FAST = dict(soft_timeout=5.0, hard_timeout=10.0, heartbeat_timeout=20.0, barrier_timeout=60.0,
            monitor_thread_interval=0.05, monitor_process_interval=0.25, progress_watchdog_interval=0.25,
            termination_grace_time=2.0)


@pytest.fixture
def single_rank(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("FT_INPROCESS_STORE_PORT", str(free_port()))


def test_function_is_called_again_after_a_fault_and_hooks_run_in_order(single_rank):
    calls: list[tuple[str, int]] = []

    def hook(name):
        return lambda state: calls.append((name, state.iteration))

    @Wrapper(initialize=hook("initialize"), abort=hook("abort"), finalize=hook("finalize"),
             health_check=hook("health_check"), **FAST)
    def train(scale: int, call_wrapper: CallWrapper = None) -> int:
        calls.append(("train", call_wrapper.iteration))
        assert (call_wrapper.rank, call_wrapper.world_size) == (0, 1)
        call_wrapper.ping()
        with call_wrapper.atomic():
            call_wrapper.store.set("key", "value")  # a store private to the iteration
        if call_wrapper.iteration == 0:
            raise ValueError("injected fault")
        return scale * 7

    assert train(6) == 42
    assert calls == [
        ("initialize", 0), ("train", 0), ("abort", 0), ("finalize", 0), ("health_check", 0),
        ("initialize", 1), ("train", 1),
    ]
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"  # restored


def test_restart_abort_propagates_when_in_process_restart_gives_up(single_rank):
    seen: list[State] = []

    @Wrapper(initialize=RetryController(max_iterations=2), health_check=seen.append, **FAST)
    def train() -> None:
        raise ValueError("always fails")

    with pytest.raises(RestartAbort, match="2 iterations used"):
        train()
    assert [(s.iteration, s.fault_count) for s in seen] == [(0, 1), (1, 2)]
