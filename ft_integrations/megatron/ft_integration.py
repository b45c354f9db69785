"""Drop-in for Megatron-LM's ``megatron/training/ft_integration.py``: the same functions, same call sites.

Switch one import in Megatron-LM and launch with ``ft_launcher``::

    # from megatron.training import ft_integration
    from ft_integrations.megatron import ft_integration

    ft_integration.setup()                       # before initialize_megatron: opens "setup"
    ft_integration.maybe_setup_simulated_fault() # after the process group exists (FT drills)
    args.ckpt_step = ft_integration.choose_checkpoint_iteration()  # optional: the newest good iter_N
    ... load_checkpoint -> ft_integration.on_checkpoint_loaded(is_local_chkpt)
    ft_integration.on_training_step_start(); train_step(); ft_integration.on_training_step_end()
    ft_integration.on_eval_step_start(); eval_step(); ft_integration.on_eval_step_end()
    ft_integration.on_checkpointing_start(); save(); ft_integration.on_checkpointing_end(False)
    ft_integration.shutdown()

Every function is a no-op unless ``--enable-ft-package`` (or ``--enable-ft``) was given and
:func:`setup` ran. The sections are Megatron-LM's: ``setup``, ``step`` (training steps and,
past each evaluation's warm-up, eval steps) and ``checkpointing``. With ``--calc-ft-timeouts``
timeouts are learned as Megatron-LM learns them (after every synchronous save and at
shutdown) and kept in ``<--save>/ft_state.json``. This module maps Megatron-LM's signatures
onto :mod:`ft_integrations.megatron.hooks` (``setup(args, megatron_lm=True)``), where the
semantics live. Beyond Megatron-LM's functions: every complete persistent checkpoint (the
tracker moved) gets its ``iter_N`` manifest, and :func:`choose_checkpoint_iteration` (one added
line before ``load_checkpoint``) picks the newest ``iter_N`` that verifies on every rank;
``on_training_step_end(loss=...)`` optionally watches the loss right after such a resume.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from typing import Any, Optional

from ft_core.client import RankMonitorClient
from ft_core.utils.validation import ValidationError
from ft_integrations.fault_injection import FaultInjector, FaultKind, SimulatedFault
from ft_integrations.megatron import hooks
from ft_integrations.megatron.args import add_ft_args
from ft_integrations.megatron.state import get_state

__all__ = [
    "SIM_FAULT_ENV",
    "choose_checkpoint_iteration",
    "get_rank_monitor_client",
    "maybe_setup_simulated_fault",
    "on_checkpoint_loaded",
    "on_checkpointing_end",
    "on_checkpointing_start",
    "on_eval_step_end",
    "on_eval_step_start",
    "on_training_step_end",
    "on_training_step_start",
    "setup",
    "shutdown",
]

log = logging.getLogger("ft_integrations.megatron")

#: Megatron-LM's simulated-fault variable: ``"rank_hung|rank_killed|random;<rank or empty>;<base_delay>"``.
SIM_FAULT_ENV = "FT_SIM_FAULT_DESC"

#: Megatron-LM's fault names and the fault each one is here: a hang is a frozen process.
_SIM_FAULT_KINDS = {"rank_hung": FaultKind.SIGSTOP, "rank_killed": FaultKind.KILL}

#: The Megatron-LM args object :func:`setup` used (Megatron-LM's global args, updated by its loop).
_args: Any = None


def get_rank_monitor_client() -> Optional[RankMonitorClient]:
    """The connected client, or None when FT is disabled, not set up or shut down."""
    return get_state().client


def setup(args: Any = None) -> None:
    """Connect to the node's rank monitor and open ``setup``; call once, before ``initialize_megatron``.

    ``args``: a parsed namespace; by default, inside Megatron-LM, its global args (or its
    ``parse_args(ignore_unknown_args=True)`` before they are set), else ``sys.argv`` parsed with
    :func:`add_ft_args` (other arguments ignored). With FT enabled ``--save`` (or ``--ft-state-file``)
    is required: it holds ``ft_state.json``, created if missing.
    """
    global _args
    if args is None:
        args = _megatron_global_args() or _parse_argv()
    if getattr(args, "enable_ft_package", False):
        save = getattr(args, "save", None)
        if not save and not getattr(args, "ft_state_file", None):
            raise ValueError("fault tolerance: --save is required with --enable-ft-package "
                             "(it holds ft_state.json, the learned timeouts)")
        if save:
            os.makedirs(save, exist_ok=True)
    _args = args
    hooks.setup(args, megatron_lm=True)


def on_training_step_start() -> None:
    """Before each training step (Megatron-LM's iteration, ``args.curr_iteration``, is reported)."""
    if _active():
        # Megatron-LM's global args are set after setup() and updated by its train loop.
        args = _megatron_global_args(parse=False) or _args
        hooks.on_training_step_start(getattr(args, "curr_iteration", None))


def on_training_step_end(loss: Any = None) -> None:
    """After each training step; ``loss`` (optional, not in Megatron-LM's signature) is checked right after a
    verified resume (:func:`choose_checkpoint_iteration`), see :func:`ft_integrations.megatron.hooks.on_training_step_end`."""
    if _active():
        hooks.on_training_step_end(loss)


def on_eval_step_start() -> None:
    """Before each evaluation step."""
    if _active():
        hooks.on_eval_step_start()


def on_eval_step_end() -> None:
    """After each evaluation step."""
    if _active():
        hooks.on_eval_step_end()


def on_checkpointing_start() -> None:
    """Before each checkpoint save or async-save finalization."""
    if _active():
        hooks.on_checkpointing_start()


def on_checkpointing_end(is_async_finalization: bool) -> None:
    """After each checkpoint save (learns timeouts) or async finalization (never learns)."""
    if _active():
        hooks.on_checkpointing_end(is_async_finalization=is_async_finalization)


def on_checkpoint_loaded(is_local_chkpt: bool) -> None:
    """After a checkpoint load; a persistent (not local) one lets ``setup`` be learned."""
    if _active():
        hooks.on_checkpoint_loaded(is_local_chkpt)


def choose_checkpoint_iteration(load_dir: Optional[str] = None) -> Optional[int]:
    """The newest ``iter_N`` of ``load_dir`` (default: ``args.load``) that verifies on every rank; None: none there.

    Megatron-LM loads what its tracker names unless ``args.ckpt_step`` is set: call this
    after ``initialize_megatron`` (the process group agrees on the choice) and before
    ``load_checkpoint``, ``args.ckpt_step = ft_integration.choose_checkpoint_iteration()``. It
    skips a torn, truncated or launcher-marked-bad checkpoint for the newest older good one
    and writes the ``checkpoint_rejected``/``checkpoint_loaded`` records ``ft_launcher`` reads
    (see :func:`ft_integrations.megatron.hooks.choose_checkpoint_iteration`).
    """
    if load_dir is None:
        args = _megatron_global_args(parse=False) or _args
        load_dir = getattr(args, "load", None)
    return hooks.choose_checkpoint_iteration(load_dir)


def shutdown() -> None:
    """End of training: the last timeout calculation (a collective), then disconnect."""
    global _args
    if _active():
        hooks.shutdown()
    _args = None


def maybe_setup_simulated_fault() -> None:
    """Arm the fault described by ``FT_SIM_FAULT_DESC`` (FT drills); call after the process group exists.

    Format ``"<kind>;<rank>;<base_delay>"``: kind ``rank_hung`` (SIGSTOP), ``rank_killed``
    (SIGKILL) or ``random`` (one of them); rank empty for a random one (the same on every
    rank); the fault fires ``base_delay`` to ``1.2 * base_delay`` seconds from now. As every
    simulated fault here, it fires in the first cycle only, so the restarted job shows recovery.
    A malformed value raises ``ValueError`` naming the variable.
    """
    desc = os.environ.get(SIM_FAULT_ENV)
    if not desc:
        return
    kind, rank, base_delay = _parse_sim_fault(desc)
    rng = random.Random()
    if kind is None:
        kind = rng.choice(list(_SIM_FAULT_KINDS.values()))
    import torch.distributed as dist

    initialized = dist.is_available() and dist.is_initialized()
    fault = SimulatedFault(kind, rank=rank, delay=base_delay * (1.0 + 0.2 * rng.random()))
    injector = FaultInjector(fault, rank=dist.get_rank() if initialized else 0,
                             world_size=dist.get_world_size() if initialized else 1)
    log.warning("fault tolerance: simulated fault %s on rank %d in %.1f s%s", fault.kind,
                injector.target_rank, fault.delay or 0.0, " (this rank)" if injector.armed else "")
    injector.on_train_start()  # starts the delay timer on the target rank


# -- internals ------------------------------------------------------------
def _active() -> bool:
    # Megatron-LM's functions are no-ops until setup() enabled FT (hooks would raise instead).
    return get_state().session is not None


def _parse_sim_fault(desc: str) -> tuple[Optional[FaultKind], Optional[int], float]:
    allowed = "'rank_hung|rank_killed|random;<rank or empty>;<base delay seconds>'"
    parts = [part.strip() for part in desc.split(";")]
    try:
        if len(parts) != 3 or parts[0] not in (*_SIM_FAULT_KINDS, "random"):
            raise ValueError
        rank = int(parts[1]) if parts[1] else None
        delay = float(parts[2])
        if (rank is not None and rank < 0) or not 0.0 <= delay < float("inf"):
            raise ValueError
    except ValueError:
        raise ValidationError(SIM_FAULT_ENV, desc, allowed) from None
    return _SIM_FAULT_KINDS.get(parts[0]), rank, delay


def _megatron_global_args(parse: bool = True) -> Any:
    """Inside Megatron-LM: its global args, or (``parse``) its own parse of ``sys.argv``; else None."""
    try:
        from megatron.training import arguments, global_vars
    except ImportError:
        return None
    args = getattr(global_vars, "_GLOBAL_ARGS", None)
    # Megatron-LM calls setup() before initialize_megatron() has set them: parse as it does.
    if args is None and parse:
        args = arguments.parse_args(ignore_unknown_args=True)
    return args


def _parse_argv() -> argparse.Namespace:
    """FT flags (and ``--save``, ``--async-save``) from ``sys.argv``; everything else is Megatron's."""
    parser = add_ft_args(argparse.ArgumentParser(add_help=False, allow_abbrev=False))
    parser.add_argument("--save", default=None)
    parser.add_argument("--async-save", dest="async_save", action="store_true")
    args, _unknown = parser.parse_known_args(sys.argv[1:])
    return args

