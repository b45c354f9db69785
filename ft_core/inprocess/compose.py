"""``Compose``: several hooks where the ``Wrapper`` takes one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ft_core.utils.validation import callable_or_none

__all__ = ["Compose"]


class Compose:
    """Call hooks in order, each on the result of the previous one.

    A hook that returns ``None`` (``initialize``, ``health_check``...) passes its
    input on unchanged, so ``Compose`` chains filters as well as side-effect
    hooks: ``Compose(FaultCounter(3), my_check)``.
    """

    def __init__(self, *hooks: Callable[[Any], Any]) -> None:
        for index, hook in enumerate(hooks):
            callable_or_none(f"Compose hook #{index}", hook, allow_none=False)
        self.hooks = hooks

    def __call__(self, arg: Any) -> Any:
        for hook in self.hooks:
            result = hook(arg)
            arg = arg if result is None else result
        return arg
