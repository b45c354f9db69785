"""``ft_integrations.megatron.ft_integration``: Megatron-LM's signatures, no-ops without FT, FT_SIM_FAULT_DESC parsing.

The behaviour under a monitor (sections, learning, drills) is tested end to end in
tests/e2e/test_megatron_lm_ft_integration.py.
"""

from __future__ import annotations

import inspect
import re

import pytest

from ft_integrations.fault_injection import FaultKind
from ft_integrations.megatron import ft_integration, reset_state


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.delenv("FT_SIM_FAULT_DESC", raising=False)
    reset_state()
    yield
    ft_integration.shutdown()
    reset_state()


def _call_every_hook() -> None:
    ft_integration.on_training_step_start()
    ft_integration.on_training_step_end()
    ft_integration.on_eval_step_start()
    ft_integration.on_eval_step_end()
    ft_integration.on_checkpointing_start()
    ft_integration.on_checkpointing_end(is_async_finalization=False)
    ft_integration.on_checkpoint_loaded(is_local_chkpt=True)
    ft_integration.shutdown()


def test_signatures_are_megatron_lms():
    params = {name: list(inspect.signature(getattr(ft_integration, name)).parameters)
              for name in ft_integration.__all__ if callable(getattr(ft_integration, name))}
    megatron_lms = {
        "get_rank_monitor_client": [], "maybe_setup_simulated_fault": [], "on_checkpoint_loaded": ["is_local_chkpt"],
        "on_checkpointing_end": ["is_async_finalization"], "on_checkpointing_start": [], "on_eval_step_end": [],
        "on_eval_step_start": [], "on_training_step_end": [], "on_training_step_start": [], "setup": ["args"],
        "shutdown": [],
    }
    # Our additions (migration guide): an optional argument Megatron-LM never passes, and one new function.
    ours = {"on_training_step_end": ["loss"], "choose_checkpoint_iteration": ["load_dir"]}
    assert params == {**megatron_lms, **ours}
    for name in ours:
        assert all(p.default is not inspect.Parameter.empty
                   for p in inspect.signature(getattr(ft_integration, name)).parameters.values()), name


def test_every_function_is_a_no_op_before_setup():
    _call_every_hook()  # Megatron-LM: no-ops when setup() was not called (the native hooks raise)
    assert ft_integration.get_rank_monitor_client() is None


def test_setup_without_args_reads_sys_argv_and_stays_off_without_the_flag(monkeypatch, tmp_path):
    monkeypatch.setattr("sys.argv", ["pretrain_gpt.py", "--save", str(tmp_path), "--micro-batch-size", "4"])
    ft_integration.setup()
    _call_every_hook()
    assert ft_integration.get_rank_monitor_client() is None
    assert not (tmp_path / "ft_state.json").exists()


def test_setup_requires_save_when_enabled(monkeypatch):
    monkeypatch.setattr("sys.argv", ["pretrain_gpt.py", "--enable-ft-package", "--calc-ft-timeouts"])
    with pytest.raises(ValueError, match="--save is required"):
        ft_integration.setup()


@pytest.mark.parametrize(("desc", "expected"), [
    ("rank_hung;1;2.5", (FaultKind.SIGSTOP, 1, 2.5)),
    ("rank_killed;;0", (FaultKind.KILL, None, 0.0)),
    (" random ; 0 ; 10 ", (None, 0, 10.0)),
])
def test_sim_fault_desc_is_parsed(desc, expected):
    assert ft_integration._parse_sim_fault(desc) == expected


@pytest.mark.parametrize("desc", ["rank_hung;1", "rank_frozen;1;2", "rank_hung;x;2", "rank_hung;-1;2",
                                  "rank_hung;1;-2", "rank_hung;1;inf", "rank_hung;1;2;3"])
def test_bad_sim_fault_desc_names_the_variable(desc, monkeypatch):
    monkeypatch.setenv("FT_SIM_FAULT_DESC", desc)
    with pytest.raises(ValueError, match=re.escape("FT_SIM_FAULT_DESC: invalid value")):
        ft_integration.maybe_setup_simulated_fault()
