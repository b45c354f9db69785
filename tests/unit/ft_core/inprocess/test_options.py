"""Validation of in-process restart options, with errors that name the argument, value and rule."""

from __future__ import annotations

import threading

import pytest
import torch.distributed as dist

from ft_core.inprocess import Wrapper
from ft_core.utils.validation import ValidationError

FAST = dict(soft_timeout=1.0, hard_timeout=2.0, heartbeat_timeout=5.0, barrier_timeout=10.0,
            monitor_process_interval=0.5, progress_watchdog_interval=0.5, termination_grace_time=1.0)


def test_defaults_are_valid():
    Wrapper()
    Wrapper(**FAST)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (dict(soft_timeout=3.0), "soft_timeout: invalid value 3.0; allowed: soft_timeout < hard_timeout < barrier_"),
        (dict(hard_timeout=10.0), "hard_timeout: invalid value 10.0; allowed: soft_timeout < hard_timeout < barrier"),
        (dict(heartbeat_timeout=10.0), "heartbeat_timeout: invalid value 10.0; allowed: heartbeat_timeout < barrier"),
        (dict(monitor_thread_interval=1.0), "monitor_thread_interval: invalid value 1.0"),
        (dict(monitor_process_interval=1.5), "monitor_process_interval: invalid value 1.5"),
        (dict(progress_watchdog_interval=1.0), "progress_watchdog_interval: invalid value 1.0"),
        (dict(termination_grace_time=8.0), "hard_timeout + termination_grace_time < barrier_timeout"),
        (dict(soft_timeout=-1.0), "soft_timeout: invalid value -1.0; allowed: a positive number of seconds"),
        (dict(barrier_timeout=float("inf")), "barrier_timeout: invalid value inf"),
        (dict(hard_timeout="2"), "hard_timeout: invalid value '2'"),
        (dict(soft_timeout=True), "soft_timeout: invalid value True"),
        (dict(interrupt_signal=9), "interrupt_signal: invalid value 9; allowed: a catchable signal number"),
    ],
)
def test_invalid_times_name_argument_value_and_rule(changes, expected):
    with pytest.raises(ValidationError, match="^Wrapper[.]") as info:
        Wrapper(**{**FAST, **changes})
    assert isinstance(info.value, ValueError)
    assert expected in str(info.value)


def test_options_are_keyword_only_and_hooks_callable():
    with pytest.raises(TypeError):
        Wrapper(None)  # type: ignore[misc]
    with pytest.raises(TypeError, match="Wrapper.health_check: invalid value 3; allowed: None or a callable"):
        Wrapper(health_check=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Wrapper.rank_assignment: invalid value None"):
        Wrapper(rank_assignment=None)  # type: ignore[arg-type]
    Wrapper(progress_watchdog_interval=None, abort=None)




def test_call_checks_environment_thread_and_torch_distributed(monkeypatch):
    train = Wrapper(**FAST)(lambda: 1)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="RANK=None is invalid"):
        train()
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(RuntimeError, match=r"RANK=2 is not in 0..WORLD_SIZE-1 \(2\)"):
        train()

    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, train)))
    thread.start()
    thread.join()
    assert "from the main thread" in str(errors[0].value)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="torch.distributed is already initialized"):
            train()
    finally:
        dist.destroy_process_group()
