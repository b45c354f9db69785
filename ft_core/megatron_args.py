"""Megatron-LM's global args: where the client reads the iteration when ``set_iteration`` is never called.

Megatron-LM's unmodified ``ft_integration`` never tells the client the
iteration; the client reads ``curr_iteration`` (or ``iteration``, as NVRx
does) from Megatron-LM's global args. This module finds them without
importing Megatron-LM (a rank without it pays nothing).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional

__all__ = ["PendingMegatronArgs", "megatron_args", "megatron_global_vars", "megatron_iteration", "resolved_megatron_args"]

#: The module in which Megatron-LM keeps its global args (``_GLOBAL_ARGS``).
GLOBAL_VARS_MODULE = "megatron.training.global_vars"


@dataclasses.dataclass(frozen=True, slots=True)
class PendingMegatronArgs:
    """Megatron-LM is imported but has not set its global args yet.

    Megatron-LM's ``ft_integration.setup()`` connects the client before
    ``initialize_megatron()`` sets the args, so they are looked up again, on
    each call that reports an iteration, until they exist (as NVRx does).
    """

    global_vars: Any

    def lookup(self) -> Any:
        return getattr(self.global_vars, "_GLOBAL_ARGS", None)


def megatron_global_vars() -> Any:
    """Megatron-LM's ``global_vars`` module once imported (never imported here), else None."""
    return sys.modules.get(GLOBAL_VARS_MODULE)


def resolved_megatron_args(args: Any) -> Any:
    """``args`` as :func:`megatron_args` found them, once Megatron-LM set them; None while pending or without it."""
    return None if args is None or args.__class__ is PendingMegatronArgs else args


def megatron_args() -> Any:
    """Megatron's global args (they carry ``curr_iteration``), a pending lookup, or None without Megatron-LM."""
    global_vars = megatron_global_vars()
    if global_vars is None:
        return None
    args = getattr(global_vars, "_GLOBAL_ARGS", None)
    return PendingMegatronArgs(global_vars) if args is None else args


def megatron_iteration(args: Any) -> tuple[Any, Optional[int]]:
    """(the args to keep, the iteration they carry): ``curr_iteration``, or ``iteration`` as NVRx reads it.

    A pending lookup is resolved here; once found, the caller keeps the args and later calls read them directly.
    """
    if args.__class__ is PendingMegatronArgs:
        found = args.lookup()
        if found is None:
            return args, None
        args = found
    iteration = getattr(args, "curr_iteration", None)
    if not isinstance(iteration, int):
        iteration = getattr(args, "iteration", None)
    return args, iteration if isinstance(iteration, int) else None
