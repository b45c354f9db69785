"""Where the client finds Megatron-LM's iteration when ``set_iteration`` is never called."""

from __future__ import annotations

import sys
import types

import pytest

from ft_core.megatron_args import (
    GLOBAL_VARS_MODULE,
    PendingMegatronArgs,
    megatron_args,
    megatron_iteration,
    resolved_megatron_args,
)


@pytest.fixture
def global_vars(monkeypatch):
    """Megatron-LM's global_vars module as it is before ``initialize_megatron()`` (no args yet)."""
    module = types.ModuleType(GLOBAL_VARS_MODULE)
    module._GLOBAL_ARGS = None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, GLOBAL_VARS_MODULE, module)
    return module


def test_without_megatron_there_are_no_args(monkeypatch):
    monkeypatch.delitem(sys.modules, GLOBAL_VARS_MODULE, raising=False)
    assert megatron_args() is None
    assert resolved_megatron_args(None) is None


def test_args_set_after_the_client_connected_are_found_on_a_later_call(global_vars):
    args = megatron_args()
    assert isinstance(args, PendingMegatronArgs)
    assert resolved_megatron_args(args) is None
    assert megatron_iteration(args) == (args, None)  # still pending: looked up again next time
    global_vars._GLOBAL_ARGS = types.SimpleNamespace(curr_iteration=12)
    found, iteration = megatron_iteration(args)
    assert found is global_vars._GLOBAL_ARGS and iteration == 12
    assert megatron_args() is found and resolved_megatron_args(found) is found


@pytest.mark.parametrize(("fields", "iteration"), [
    ({"curr_iteration": 5, "iteration": 3}, 5),
    ({"iteration": 3}, 3),  # as NVRx reads it
    ({"curr_iteration": None, "iteration": 4}, 4),
    ({"curr_iteration": "5"}, None),
    ({}, None),
])
def test_the_iteration_is_curr_iteration_else_iteration_when_an_integer(fields, iteration):
    args = types.SimpleNamespace(**fields)
    assert megatron_iteration(args) == (args, iteration)
