"""Hooks for a Megatron-style training loop: sections, iteration, checkpoints and timeout learning.

Call order in a training process (every hook is a no-op without ``--enable-ft``)::

    setup(args)                                  # before model init: opens "setup"
    load checkpoint -> load_state_dict(ckpt["ft_state"]); on_checkpoint_loaded(is_local_chkpt=False)
    for each step:
        on_training_step_start(iteration)        # warm-up steps stay in "setup"; then "step"
        ...; on_training_step_end()
        on_eval_step_start() / on_eval_step_end()          # around each eval step
        on_checkpointing_start(); save({..., "ft_state": state_dict()}); on_checkpointing_end(False)
    shutdown()                                   # normal end; abort() on a failure path

Timeouts are learned (``--calc-ft-timeouts``) only at points every rank reaches in
lockstep, because the calculation is a collective: after ``--ft-calc-timeouts-after-iters``
timed steps, after the first checkpoint save of the run, and at ``shutdown()``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional

from ft_core.autoresume import FINISHED_FLAG_ENV, mark_training_finished
from ft_core.client import RankMonitorClient, RankMonitorClientError
from ft_core.fileutil import atomic_write_json, read_json
from ft_integrations.megatron.args import DEFAULT_CALC_TIMEOUTS_AFTER_ITERS, DEFAULT_NUM_WARMUP_ITERS
from ft_integrations.megatron.state import FT_STATE_FILENAME, HookState, get_state

__all__ = [
    "FINISHED_FLAG_ENV",
    "FaultToleranceSetupError",
    "abort",
    "load_state_dict",
    "on_checkpoint_loaded",
    "on_checkpointing_end",
    "on_checkpointing_start",
    "on_eval_step_end",
    "on_eval_step_start",
    "on_training_step_end",
    "on_training_step_start",
    "setup",
    "shutdown",
    "state_dict",
]

log = logging.getLogger("ft_integrations.megatron")

SETUP, STEP, CHECKPOINTING = "setup", "step", "checkpointing"
EVAL_SECTIONS = ("eval", "validation")


class FaultToleranceSetupError(RuntimeError):
    """A hook was used in the wrong order (e.g. before ``setup(args)``)."""


# -- lifecycle ------------------------------------------------------------
def setup(args: Any) -> None:
    """Connect to the node's rank monitor and open the ``setup`` section (call before model init).

    ``args`` is the parsed namespace (flags from :func:`add_ft_args`; ``args.save`` locates
    ``ft_state.json``). Learned timeouts found in the state file are sent with the handshake,
    so they already guard this ``setup``.
    """
    state = get_state()
    if state.enabled is not None:
        raise FaultToleranceSetupError("ft_integrations.megatron.setup() was already called in this process")
    if not getattr(args, "enable_ft_package", False):
        state.enabled = False
        return
    state.calc_timeouts = bool(getattr(args, "calc_ft_timeouts", False))
    state.num_warmup_iters = int(getattr(args, "ft_num_warmup_iters", DEFAULT_NUM_WARMUP_ITERS))
    state.calc_timeouts_after_iters = int(
        getattr(args, "ft_calc_timeouts_after_iters", DEFAULT_CALC_TIMEOUTS_AFTER_ITERS))
    state.state_file = _state_file_path(args)
    client = RankMonitorClient()
    _load_state_file(client, state.state_file)
    client.init_workload_monitoring()
    state.client = client
    state.enabled = True
    client.start_section(SETUP)
    state.in_setup = True

    tracked = set(client.section_timeouts.section)
    if "eval" not in tracked and "validation" in tracked:
        state.eval_section = "validation"  # the Lightning callback's name, e.g. from a shared YAML
    ours = {SETUP, STEP, CHECKPOINTING, state.eval_section}
    state.heartbeat_mode = not (tracked & ours)
    if state.heartbeat_mode:
        _info(f"fault tolerance: the monitor tracks none of {sorted(ours)}; sending heartbeats only "
              "(pass e.g. --ft-rank-section-timeouts=setup:600,step:180,eval:600,checkpointing:600 "
              "to ft_launcher for section timeouts)")
    else:
        _info(f"fault tolerance: monitored sections {sorted(tracked)}, timeouts "
              f"{client.section_timeouts.to_dict()}, warm-up steps {state.num_warmup_iters}, "
              f"learning {'on' if state.calc_timeouts else 'off'}")


def shutdown(training_finished: bool = False) -> None:
    """Normal end of training on every rank: last timeout calculation (a collective), then disconnect.

    With ``training_finished=True`` local rank 0 also creates the file named by
    ``FAULT_TOL_FINISHED_FLAG_FILE`` (if set), so an auto-resume loop stops requeueing.
    """
    state = get_state()
    client = _client("shutdown")
    if client is None:
        return
    client.end_all_sections()
    state.in_setup = state.in_step = False
    _learn(state, "at shutdown")
    client.shutdown_workload_monitoring()
    state.client = None
    flag = mark_training_finished() if training_finished and state.is_writer else None
    if flag:
        _info(f"fault tolerance: training is complete; created {flag}")


def abort() -> None:
    """Failure path: leave the monitor without any collective or timeout update. Never raises."""
    state = get_state()
    client, state.client = state.client, None
    if client is None:
        return
    try:
        client.shutdown_workload_monitoring()
    except Exception as exc:  # noqa: BLE001 - the rank is already failing; keep its original error
        log.warning("fault tolerance: abort() could not disconnect cleanly: %s", exc)


# -- training, evaluation -------------------------------------------------
def on_training_step_start(iteration: int) -> None:
    """Before a training step; ``iteration`` is reported to the monitor with the section."""
    state = get_state()
    client = _client("on_training_step_start")
    if client is None:
        return
    state.iteration = int(iteration)
    client.set_iteration(state.iteration)
    if state.steps_seen < state.num_warmup_iters:
        # Warm-up (compilation, allocator, first collectives) stays in "setup"; the heartbeat
        # carries the iteration, so a hang here is reported with it.
        client.send_heartbeat()
        return
    if state.in_setup:
        client.end_section(SETUP)
        state.in_setup = False
    client.start_section(STEP)
    state.in_step = True


def on_training_step_end() -> None:
    """After a training step; may learn timeouts (every rank ends the same step, so this is in lockstep)."""
    state = get_state()
    client = _client("on_training_step_end")
    if client is None:
        return
    if state.in_step:
        client.end_section(STEP)
        state.in_step = False
    state.steps_seen += 1
    if state.heartbeat_mode:
        client.send_heartbeat()
    # The monitor's own num_warmup_iterations (an ft_launcher flag) leaves that many more
    # "step" sections untimed and unlearned: count timed steps after both warm-ups.
    assert client.cfg is not None
    learn_at = state.num_warmup_iters + client.cfg.num_warmup_iterations + state.calc_timeouts_after_iters
    if not state.learned_after_steps and state.steps_seen >= learn_at:
        state.learned_after_steps = True
        _learn(state, f"after {state.steps_seen} steps")


def on_eval_step_start() -> None:
    state = get_state()
    client = _client("on_eval_step_start")
    if client is not None:
        client.start_section(state.eval_section)


def on_eval_step_end() -> None:
    state = get_state()
    client = _client("on_eval_step_end")
    if client is None:
        return
    client.end_section(state.eval_section)
    if state.heartbeat_mode:
        client.send_heartbeat()


# -- checkpoints ----------------------------------------------------------
def on_checkpointing_start() -> None:
    """Before a checkpoint save (or before finalizing an async one)."""
    client = _client("on_checkpointing_start")
    if client is not None:
        client.start_section(CHECKPOINTING)


def on_checkpointing_end(is_async_finalization: bool = False, iteration: Optional[int] = None) -> None:
    """After a save: reports the checkpointed iteration; learns timeouts after the run's first save.

    ``iteration`` is the iteration stored in the checkpoint; by default the number of steps
    completed (last step's iteration + 1, Megatron's convention), reported for a regular save
    only. For async saves pass ``iteration`` with the finalization call, when the files are complete.
    """
    state = get_state()
    client = _client("on_checkpointing_end")
    if client is None:
        return
    client.end_section(CHECKPOINTING)
    if iteration is None and not is_async_finalization and state.iteration is not None:
        iteration = state.iteration + 1
    if iteration is not None:
        client.report_checkpoint(iteration)
    if state.heartbeat_mode:
        client.send_heartbeat()
    if is_async_finalization:
        return  # may run before any step, not necessarily in lockstep: never learn here
    state.saves_seen += 1
    if not state.learned_after_save:
        state.learned_after_save = True
        _learn(state, "after the first checkpoint save")


def on_checkpoint_loaded(is_local_chkpt: bool) -> None:
    """After a checkpoint load. A persistent (not local) load makes ``setup`` representative to learn."""
    state = get_state()
    if _client("on_checkpoint_loaded") is not None:
        state.persistent_checkpoint_loaded = not is_local_chkpt


def state_dict() -> dict[str, Any]:
    """Learned timeouts (``{"current_timeouts": ...}``) to store in the checkpoint; ``{}`` when disabled."""
    client = _client("state_dict")
    return client.state_dict() if client is not None else {}


def load_state_dict(ft_state: Optional[dict[str, Any]]) -> None:
    """Restore timeouts saved by :func:`state_dict` (they apply at once); empty or None is ignored."""
    client = _client("load_state_dict")
    if client is None or not ft_state:
        return
    client.load_state_dict(ft_state)
    _info(f"fault tolerance: timeouts restored from the checkpoint: {client.state_dict()['current_timeouts']}")


# -- internals ------------------------------------------------------------
def _client(hook: str) -> Optional[RankMonitorClient]:
    """The live client, or None where the hook is a no-op (FT disabled, or after shutdown/abort)."""
    state = get_state()
    if state.enabled is None and not _megatron_args_disable_ft():
        raise FaultToleranceSetupError(
            f"ft_integrations.megatron.{hook}() was called before setup(args): call setup(args) once per "
            "process before model init (it does nothing without --enable-ft)")
    return state.client


def _megatron_args_disable_ft() -> bool:
    """Inside Megatron-LM, its global args say whether FT is on even if setup() was never called."""
    global_vars = sys.modules.get("megatron.training.global_vars")
    args = getattr(global_vars, "_GLOBAL_ARGS", None)
    return args is not None and not getattr(args, "enable_ft_package", False)


def _learn(state: HookState, when: str) -> None:
    """Calculate section timeouts: a collective, so only where all ranks are in lockstep."""
    client = state.client
    if not state.calc_timeouts or client is None or client.cfg is None:
        return
    # "setup" is learned only when this run loaded a persistent checkpoint: a fresh start is
    # shorter than a resume, and the value must hold for the next restart's setup.
    names = sorted(name for name in client.section_timeouts.section
                   if name != SETUP or state.persistent_checkpoint_loaded)
    out_of_section = (client.cfg.rank_out_of_section_timeout is not None
                      or client.section_timeouts.is_out_of_section_calculated)
    if not names and not out_of_section:
        return
    try:
        changed = client.calculate_and_set_section_timeouts(
            selected_sections=names, calc_out_of_section=out_of_section, skip_if_not_ready=True)
    except RankMonitorClientError as exc:
        # Never fail training because timeouts could not be learned.
        log.warning("fault tolerance: timeouts not updated %s: %s", when, exc)
        return
    if not changed:
        log.debug("fault tolerance: timeouts not calculated %s: not enough data yet", when)
        return
    # The rank monitor logs the values once per change; here only with debug logging.
    log.debug("fault tolerance: learned timeouts %s: %s", when, client.section_timeouts.to_dict())
    if state.state_file and state.is_writer:
        try:
            atomic_write_json(state.state_file, client.state_dict())
        except OSError as exc:
            log.warning("fault tolerance: cannot write %s: %s", state.state_file, exc)


def _state_file_path(args: Any) -> Optional[str]:
    explicit = getattr(args, "ft_state_file", None)
    if explicit:
        return os.path.abspath(explicit)
    save = getattr(args, "save", None)
    return os.path.join(os.path.abspath(save), FT_STATE_FILENAME) if save else None


def _load_state_file(client: RankMonitorClient, path: Optional[str]) -> None:
    if not path or not os.path.exists(path):
        return
    try:
        client.load_state_dict(read_json(path))
    except (OSError, ValueError, RankMonitorClientError) as exc:
        log.warning("fault tolerance: ignoring %s: %s", path, exc)
        return
    _info(f"fault tolerance: timeouts loaded from {path}")


def _info(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        log.info(message)
