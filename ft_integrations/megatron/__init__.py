"""Fault tolerance for Megatron-style training loops: ``--enable-ft`` flags and training-loop hooks.

Example::

    from ft_integrations import megatron as ft

    parser = ft.add_ft_args(argparse.ArgumentParser())
    args = parser.parse_args()
    ft.setup(args)                     # before model init
    result = ft.load_checkpoint_verified(args.load, load, weights)  # newest good iter_N, every rank the same
    ...
    ft.on_training_step_start(iteration); loss = train_step(); ft.on_training_step_end(loss=loss)
    ...
    ft.shutdown()

See ``examples/megatron/train.py`` for a complete megatron-core loop. Megatron-LM itself
switches one import: ``from ft_integrations.megatron import ft_integration`` (same functions
and call sites as ``megatron.training.ft_integration``).
"""

from ft_integrations.megatron.args import add_ft_args
from ft_integrations.megatron.hooks import (
    FINISHED_FLAG_ENV,
    FaultToleranceSetupError,
    abort,
    choose_checkpoint_iteration,
    load_checkpoint_verified,
    load_state_dict,
    on_checkpoint_loaded,
    on_checkpointing_end,
    on_checkpointing_start,
    on_eval_step_end,
    on_eval_step_start,
    on_training_step_end,
    on_training_step_start,
    setup,
    shutdown,
    state_dict,
    timed,
)
from ft_integrations.megatron.state import FT_STATE_FILENAME, get_state, reset_state

__all__ = [
    "FINISHED_FLAG_ENV",
    "FT_STATE_FILENAME",
    "FaultToleranceSetupError",
    "abort",
    "add_ft_args",
    "choose_checkpoint_iteration",
    "get_state",
    "load_checkpoint_verified",
    "load_state_dict",
    "on_checkpoint_loaded",
    "on_checkpointing_end",
    "on_checkpointing_start",
    "on_eval_step_end",
    "on_eval_step_start",
    "on_training_step_end",
    "on_training_step_start",
    "reset_state",
    "setup",
    "shutdown",
    "state_dict",
    "timed",
]
