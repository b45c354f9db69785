"""Simulated faults (:mod:`ft_integrations.fault_injection`): which rank, which cycle, which step, and the
exception kind raised in the training thread (the kill, stop and hang kinds are exercised end to end by the
Lightning tests under ft_launcher)."""

from __future__ import annotations

import pytest

from ft_core.utils.validation import ValidationError
from ft_integrations.fault_injection import FaultInjector, SimulatedFault, SimulatedFaultError


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "kill"}, "exactly one of step= or delay="),
        ({"kind": "kill", "step": 1, "delay": 1.0}, "exactly one of step= or delay="),
        ({"kind": "hang_checkpoint", "delay": 1.0}, "use step="),
        ({"kind": "kill", "step": -1}, r"SimulatedFault.step: invalid value -1; allowed: an integer >= 0"),
        ({"kind": "kill", "delay": -2}, r"SimulatedFault.delay: invalid value -2; allowed: a number of seconds >= 0"),
        ({"kind": "kill", "step": 1, "rank": -1}, r"SimulatedFault.rank: invalid value -1; allowed: .* or None"),
    ],
)
def test_simulated_fault_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimulatedFault(**kwargs)


def test_a_mapping_is_coerced_and_an_unknown_key_is_named():
    assert SimulatedFault.coerce({"kind": "exception", "step": 3}) == SimulatedFault("exception", step=3)
    with pytest.raises(ValidationError, match=r"unknown key\(s\) \['stepp'\]"):
        SimulatedFault.coerce({"kind": "exception", "stepp": 3})


def test_a_random_rank_is_the_same_on_every_rank_and_only_that_rank_is_armed_in_the_first_cycle(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    fault = SimulatedFault("exception", rank=None, step=2, seed=7)
    injectors = [FaultInjector(fault, rank, world_size=8) for rank in range(8)]
    assert len({i.target_rank for i in injectors}) == 1  # every rank derives the same target
    assert [i.armed for i in injectors].count(True) == 1 and injectors[injectors[0].target_rank].armed
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # after a restart: only with all_cycles
    assert not FaultInjector(fault, injectors[0].target_rank, 8).armed
    again = SimulatedFault("exception", rank=None, step=2, seed=7, all_cycles=True)
    assert FaultInjector(again, injectors[0].target_rank, 8).armed


def test_an_exception_fault_fires_once_at_its_step_in_the_training_thread(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    injector = FaultInjector(SimulatedFault("exception", rank=0, step=3), rank=0, world_size=2)
    injector.on_step_start(2)  # before its step: nothing
    with pytest.raises(SimulatedFaultError, match="at step 3"):
        injector.on_step_start(3)
    injector.on_step_start(4)  # fired once: disarmed
    assert not FaultInjector(SimulatedFault("exception", rank=0, step=3), rank=1, world_size=2).armed
