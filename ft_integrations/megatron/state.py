"""The integration's module-level state: one small object, like Megatron's own ``ft_integration.py``."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from ft_core.client import RankMonitorClient

__all__ = ["FT_STATE_FILENAME", "HookState", "get_state", "reset_state"]

#: Name of the learned-timeouts file written into the ``--save`` directory.
FT_STATE_FILENAME = "ft_state.json"


@dataclasses.dataclass
class HookState:
    """What the hooks remember between calls in one training process."""

    #: None until ``setup(args)``; then whether ``--enable-ft`` was given.
    enabled: Optional[bool] = None
    #: Connected client; None when disabled, before setup and after shutdown/abort.
    client: Optional[RankMonitorClient] = None
    calc_timeouts: bool = False
    num_warmup_iters: int = 0
    calc_timeouts_after_iters: int = 1
    state_file: Optional[str] = None
    #: Section opened by the eval hooks: "eval", or "validation" when only that one is tracked.
    eval_section: str = "eval"
    #: No tracked section among ours: send heartbeats instead, or the monitor sees no sign of life.
    heartbeat_mode: bool = False
    #: Iteration of the current (or last) training step, as passed to on_training_step_start.
    iteration: Optional[int] = None
    steps_seen: int = 0
    saves_seen: int = 0
    in_setup: bool = False
    in_step: bool = False
    persistent_checkpoint_loaded: bool = False
    learned_after_steps: bool = False
    learned_after_save: bool = False

    @property
    def is_writer(self) -> bool:
        """Local rank 0 writes the state file (one writer per node, whether or not --save is shared)."""
        return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))) == 0


_STATE = HookState()


def get_state() -> HookState:
    return _STATE


def reset_state() -> None:
    """Forget everything (for tests): disconnect a live client without any collective."""
    global _STATE
    client = _STATE.client
    if client is not None and client.is_initialized:
        client.shutdown_workload_monitoring()
    _STATE = HookState()
