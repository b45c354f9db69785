"""``Compose``: several hooks where the ``Wrapper`` takes one, each on the result of the previous."""

from __future__ import annotations

import pytest

from ft_core.inprocess import Compose


def test_hooks_run_in_order_on_the_previous_result_and_none_passes_the_input_on():
    calls = []
    compose = Compose(lambda x: calls.append(("first", x)), lambda x: x + 1, lambda x: calls.append(("third", x)))
    assert compose(1) == 2
    assert calls == [("first", 1), ("third", 2)]
    assert Compose()(5) == 5


def test_every_hook_must_be_callable_and_the_error_names_which():
    with pytest.raises(TypeError, match=r"^Compose hook #0: invalid value None; allowed: a callable"):
        Compose(None)  # type: ignore[arg-type]
