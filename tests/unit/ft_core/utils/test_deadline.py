"""wait_until: the one way to wait for a condition with a deadline."""

from __future__ import annotations

import math

from ft_core.utils.deadline import wait_until


def test_the_first_truthy_value_is_returned_without_waiting_for_the_deadline():
    answers = iter([None, 0, "", "ready", "never asked"])
    assert wait_until(lambda: next(answers), timeout=math.inf, interval=0) == "ready"
    assert next(answers) == "never asked"


def test_a_condition_that_became_true_while_sleeping_past_the_deadline_is_not_missed():
    # One sleep (the interval is longer than the timeout) takes us to the deadline: asked once more there.
    answers = iter([False, True])
    assert wait_until(lambda: next(answers), timeout=0.01, interval=60.0) is True


def test_at_the_deadline_the_last_falsy_value_is_returned_after_asking_at_least_once():
    calls = []
    assert wait_until(lambda: calls.append(1) or 0, timeout=0.0) == 0
    assert calls == [1]
