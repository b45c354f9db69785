"""The Megatron integration's module-level state: one object, replaced whole by ``reset_state``."""

from __future__ import annotations

from ft_integrations.megatron.state import HookState, get_state, reset_state
from ft_integrations.session import Section


def test_the_state_is_one_object_until_reset_forgets_it():
    reset_state()
    state = get_state()
    assert get_state() is state
    state.enabled, state.iteration, state.in_step = True, 12, True
    reset_state()
    fresh = get_state()
    assert fresh is not state and fresh == HookState()
    assert (fresh.enabled, fresh.iteration, fresh.in_step) == (None, None, False)


def test_a_state_without_a_session_has_no_client_and_evaluation_is_its_own_section():
    state = HookState()
    assert state.client is None and state.session is None
    assert state.eval_section is Section.EVAL
