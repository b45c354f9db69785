"""The integration's module-level state: one small object, like Megatron's own ``ft_integration.py``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from ft_core.client import RankMonitorClient
from ft_integrations.checkpoint_guard import LossWatch
from ft_integrations.session import FaultToleranceSession, Section

if TYPE_CHECKING:  # annotations only
    from ft_integrations.megatron.checkpoints import ManifestWriter

__all__ = ["FT_STATE_FILENAME", "HookState", "get_state", "reset_state"]

#: Name of the learned-timeouts file written into the ``--save`` directory.
FT_STATE_FILENAME = "ft_state.json"


@dataclasses.dataclass
class HookState:
    """What the hooks remember between calls in one training process."""

    #: None until ``setup(args)``; then whether ``--enable-ft`` was given.
    enabled: Optional[bool] = None
    #: The rank's session (client, learning schedule, state file); None when disabled, before
    #: setup and after shutdown/abort.
    session: Optional[FaultToleranceSession] = None
    #: Section opened by the eval hooks: "eval", or "validation" when only that one is tracked.
    eval_section: Section = Section.EVAL
    #: No tracked section among ours: send heartbeats instead, or the monitor sees no sign of life.
    heartbeat_mode: bool = False
    #: Iteration of the current (or last) training step, as passed to on_training_step_start.
    iteration: Optional[int] = None
    in_setup: bool = False
    in_step: bool = False
    #: Megatron-LM's semantics (``ft_integration``): eval steps in ``step`` past each
    #: evaluation's first warm-up steps, which also close ``setup``.
    megatron_lm: bool = False
    #: An eval step is open (in ``eval_section``).
    in_eval_step: bool = False
    #: Eval steps since the last training step (Megatron-LM's eval warm-up counts per evaluation).
    eval_steps_in_round: int = 0
    #: ``--async-save``: a save's end only schedules it; its files are complete at its finalization.
    async_save: bool = False
    #: Megatron-LM's tracker of the latest persistent checkpoint (``<--save>/latest_checkpointed_iteration.txt``),
    #: read for progress by the drop-in; None: progress is what the hooks are told.
    tracker_file: Optional[str] = None
    #: A save ended (or was scheduled) whose persistent iteration the tracker has not shown yet.
    save_pending: bool = False
    #: The last checkpointed iteration reported to the monitor.
    reported_iteration: Optional[int] = None
    #: ``args.save`` (absolute): where the ``iter_N`` directories whose manifests rank 0 writes are.
    save_dir: Optional[str] = None
    #: Writes those manifests off the training thread (global rank 0 only; None elsewhere).
    manifests: Optional[ManifestWriter] = None
    #: ``(iteration, iter_N directory)`` chosen by the verified load, until ``on_checkpoint_loaded`` arms the watch.
    verified_load: Optional[tuple[int, str]] = None
    #: Checks the loss of the first steps after a verified resume (``on_training_step_end(loss=...)``).
    loss_watch: Optional[LossWatch] = None

    @property
    def client(self) -> Optional[RankMonitorClient]:
        """The connected client; None when disabled, before setup and after shutdown/abort."""
        return self.session.client if self.session is not None else None


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
