"""Hooks for a Megatron-style training loop: sections, iteration, checkpoints and timeout learning.

Call order in a training process (every hook is a no-op without ``--enable-ft``)::

    setup(args)                                  # before model init: opens "setup"
    load_checkpoint_verified(args.load, load, weights)   # or choose_checkpoint_iteration(args.load)
    load checkpoint -> load_state_dict(ckpt["ft_state"]); on_checkpoint_loaded(is_local_chkpt=False)
    for each step:
        on_training_step_start(iteration)        # warm-up steps stay in "setup"; then "step"
        ...; on_training_step_end(loss=loss)     # the loss: checked for NaN right after a resume
        on_eval_step_start() / on_eval_step_end()          # around each eval step
        on_checkpointing_start(); save({..., "ft_state": state_dict()}); on_checkpointing_end(False)
    shutdown()                                   # normal end; abort() on a failure path

Timeouts are learned (``--calc-ft-timeouts``) only at points every rank reaches in
lockstep, because the calculation is a collective: after ``--ft-calc-timeouts-after-iters``
timed steps, after the first checkpoint save of the run, and at ``shutdown()``. The
schedule, the state file and the finished flag are the shared
:class:`~ft_integrations.session.FaultToleranceSession`; these hooks map Megatron's call
sites onto it.

Checkpoints (:mod:`ft_integrations.megatron.checkpoints`): after each complete persistent
save global rank 0 writes the ``iter_N`` directory's manifest; before a load
:func:`load_checkpoint_verified` (or :func:`choose_checkpoint_iteration`, for a loader that
loads by itself) picks the newest ``iter_N`` that verifies on every rank, and
``on_training_step_end(loss=...)`` raises
:class:`~ft_core.fault_policy.NonFiniteLossError` for a non-finite loss in the first
``suspect_checkpoint_steps`` steps after it (the launcher then marks it bad and restarts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, Optional

from ft_core.fault_policy import FaultPolicy
from ft_core.megatron_tracker import TRACKER_FILENAME, checkpoint_dir, iteration_of
from ft_integrations.checkpoint_guard import LoadResult, LossWatch
from ft_integrations.megatron import checkpoints
from ft_integrations.megatron.args import DEFAULT_CALC_TIMEOUTS_AFTER_ITERS, DEFAULT_NUM_WARMUP_ITERS
from ft_integrations.megatron.state import FT_STATE_FILENAME, get_state
from ft_integrations.session import (
    FINISHED_FLAG_ENV,
    FaultToleranceSession,
    LearningSchedule,
    MonitoringMode,
    Section,
)

__all__ = [
    "FINISHED_FLAG_ENV",
    "FaultToleranceSetupError",
    "abort",
    "choose_checkpoint_iteration",
    "load_checkpoint_verified",
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
    "timed",
]

log = logging.getLogger("ft_integrations.megatron")


class FaultToleranceSetupError(RuntimeError):
    """A hook was used in the wrong order (e.g. before ``setup(args)``)."""


# -- lifecycle ------------------------------------------------------------
def setup(args: Any, *, megatron_lm: bool = False) -> None:
    """Connect to the node's rank monitor and open the ``setup`` section (call before model init).

    ``args`` is the parsed namespace (flags from :func:`add_ft_args`; ``args.save`` locates
    ``ft_state.json``). Learned timeouts found in the state file are sent with the handshake,
    so they already guard this ``setup``.

    ``megatron_lm=True`` gives Megatron-LM's semantics (used by
    :mod:`ft_integrations.megatron.ft_integration`): eval steps are timed as ``step`` (past
    the first ``--ft-num-warmup-iters`` of each evaluation), and timeouts are learned after
    every synchronous save and at shutdown only, ``step`` once ``--ft-calc-timeouts-after-iters``
    steps ran, ``checkpointing`` only without ``args.async_save``, out-of-section only at the
    shutdown of a run that saw everything else.
    """
    state = get_state()
    if state.enabled is not None:
        raise FaultToleranceSetupError("ft_integrations.megatron.setup() was already called in this process")
    if not getattr(args, "enable_ft_package", False):
        state.enabled = False
        return
    after_steps = int(getattr(args, "ft_calc_timeouts_after_iters", DEFAULT_CALC_TIMEOUTS_AFTER_ITERS))
    schedule = LearningSchedule(
        enabled=bool(getattr(args, "calc_ft_timeouts", False)),
        learns=MonitoringMode.SECTIONS,
        after_steps=after_steps,
        warmup_steps=int(getattr(args, "ft_num_warmup_iters", DEFAULT_NUM_WARMUP_ITERS)),
        setup_needs_checkpoint_load=True,
    )
    if megatron_lm:
        schedule = dataclasses.replace(
            schedule, learn_after_steps=False, learn_after_every_save=True, step_needs_steps=after_steps,
            learn_checkpointing=not getattr(args, "async_save", False),
            out_of_section_needs_boundary=True, out_of_section_needs_complete_run=True)
    session = FaultToleranceSession(schedule, state_file=_state_file_path(args), name="fault tolerance",
                                    logger=log)
    # Local rank 0 writes: one writer per node, whether or not --save is shared.
    session.begin_run(writer=int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))) == 0)
    session.load_state_file()
    client = session.client
    client.init_workload_monitoring()
    state.session = session
    state.enabled = True
    state.megatron_lm = megatron_lm
    state.async_save = bool(getattr(args, "async_save", False))
    save = getattr(args, "save", None)
    # Megatron-LM writes its tracker only once a persistent checkpoint is complete (after an async
    # save's finalization; never for a non-persistent, node-local one): that is progress.
    state.tracker_file = os.path.join(os.path.abspath(save), TRACKER_FILENAME) if megatron_lm and save else None
    if state.tracker_file is not None:  # a checkpoint already there (a resume) is no progress of this run
        state.reported_iteration = _persistent_iteration(state.tracker_file)
    state.save_dir = os.path.abspath(save) if save else None
    if state.save_dir is not None and int(os.environ.get("RANK", "0")) == 0:
        state.manifests = checkpoints.ManifestWriter()
    client.start_section(Section.SETUP)
    state.in_setup = True

    timeouts = client.section_timeouts
    assert timeouts is not None  # set by init_workload_monitoring() above
    tracked = set(timeouts.section)
    if megatron_lm:
        state.eval_section = Section.STEP
    elif Section.EVAL not in tracked and Section.VALIDATION in tracked:
        state.eval_section = Section.VALIDATION  # the Lightning callback's name, e.g. from a shared YAML
    ours = {Section.SETUP, Section.STEP, Section.CHECKPOINTING, state.eval_section}
    state.heartbeat_mode = not (tracked & ours)
    if state.heartbeat_mode:
        session.info(f"fault tolerance: the monitor tracks none of {sorted(map(str, ours))}; sending "
                     "heartbeats only (pass e.g. --ft-rank-section-timeouts=setup:600,step:180,eval:600,"
                     "checkpointing:600 to ft_launcher for section timeouts)")
    else:
        session.info(f"fault tolerance: monitored sections {sorted(tracked)}, timeouts "
                     f"{timeouts.to_dict()}, warm-up steps {schedule.warmup_steps}, "
                     f"learning {'on' if schedule.enabled else 'off'}")


def shutdown(training_finished: bool = False) -> None:
    """Normal end of training on every rank: last timeout calculation (a collective), then disconnect.

    With ``training_finished=True`` the rank's goodbye reports training complete (once every
    rank did, ``ft_launcher`` never restarts the job for a crash at exit), and local rank 0 also
    creates the file named by ``FAULT_TOL_FINISHED_FLAG_FILE`` (if set), so an auto-resume loop
    stops requeueing.
    """
    state = get_state()
    session = _session("shutdown")
    if session is None:
        return
    session.client.end_all_sections()
    state.in_setup = state.in_step = state.in_eval_step = False
    session.learn_at_end("at shutdown")
    session.client.shutdown_workload_monitoring(training_finished=training_finished)
    state.session = None
    if state.manifests is not None:
        state.manifests.wait()  # the last checkpoint's manifest, before the process ends
    if training_finished:
        session.write_finished_flag()


def abort() -> None:
    """Failure path: leave the monitor without any collective or timeout update. Never raises.

    Called in an ``except`` block, it first reports the exception being handled to the
    monitor (the fault's fingerprint: a deterministic fault stops the job, a non-finite
    loss after a resume marks the checkpoint bad); the client's exception hook could
    not, once disconnected.
    """
    state = get_state()
    session, state.session = state.session, None
    if session is None:
        return
    try:
        failing = sys.exc_info()[1]
        if failing is not None:
            session.client.report_exception(failing)
        session.client.shutdown_workload_monitoring()
    except Exception as exc:  # noqa: BLE001 - the rank is already failing; keep its original error
        log.warning("fault tolerance: abort() could not disconnect cleanly: %s", exc)


# -- training, evaluation -------------------------------------------------
def on_training_step_start(iteration: Optional[int] = None) -> None:
    """Before a training step; ``iteration`` (if given) is reported to the monitor with the section."""
    state = get_state()
    session = _session("on_training_step_start")
    if session is None:
        return
    client = session.client
    state.eval_steps_in_round = 0  # training resumed: the next evaluation warms up again
    if iteration is not None:
        state.iteration = int(iteration)
        client.set_iteration(state.iteration)
    if session.in_warmup():
        # Warm-up (compilation, allocator, first collectives) stays in "setup"; the heartbeat
        # carries the iteration, so a hang here is reported with it.
        client.send_heartbeat()
        return
    if state.in_setup:
        client.end_section(Section.SETUP)
        state.in_setup = False
    client.start_section(Section.STEP)
    state.in_step = True


def on_training_step_end(loss: Any = None) -> None:
    """After a training step; may learn timeouts (every rank ends the same step, so this is in lockstep).

    ``loss`` (a float or tensor, optional): in the first ``suspect_checkpoint_steps`` steps
    after a verified resume (:func:`load_checkpoint_verified`, then ``on_checkpoint_loaded``)
    a NaN or infinite loss raises :class:`~ft_core.fault_policy.NonFiniteLossError`: the
    checkpoint is bad, the launcher marks it so and the next resume falls back. Read only
    inside that window (a tensor is synchronized only there).
    """
    state = get_state()
    session = _session("on_training_step_end")
    if session is None:
        return
    watch = state.loss_watch
    if watch is not None and state.iteration is not None:
        if state.iteration - watch.resumed_step > watch.steps:
            state.loss_watch = None  # past the window: a later NaN is the training's business
        elif loss is not None:
            watch.check(loss, state.iteration)
    if state.in_step:
        session.client.end_section(Section.STEP)
        state.in_step = False
    if state.heartbeat_mode:
        session.client.send_heartbeat()
    session.step_completed()


@contextlib.contextmanager
def timed(phase: str) -> Iterator[None]:
    """Mark a rank-local phase for straggler detection: ``with ft.timed("data"): batch = next(it)``.

    The hooks mark no phase themselves: ``on_training_step_start/end`` bracket the
    whole step, whose forward and backward carry pipeline sends/receives and the
    gradient all-reduce, so a fast rank's time there includes waiting for the slow
    one. Only code without any communication may be marked, e.g. ``next(data_iterator)``
    on the first pipeline stage (not Megatron's ``get_batch``, which broadcasts over
    the tensor-parallel group). A no-op when FT is off.
    """
    session = _session("timed")
    if session is None or not session.client.is_initialized:
        yield
        return
    with session.client.timed(phase):
        yield


def on_eval_step_start() -> None:
    """Before an evaluation step: opens ``eval`` (Megatron-LM semantics: ``step``, past eval warm-up)."""
    state = get_state()
    session = _session("on_eval_step_start")
    if session is None:
        return
    client = session.client
    if state.megatron_lm:
        if state.in_setup:  # an evaluation before any training step ends setup, as in Megatron-LM
            client.end_section(Section.SETUP)
            state.in_setup = False
        if state.eval_steps_in_round < session.schedule.warmup_steps:
            client.send_heartbeat()  # the first eval steps of a round are slow: keep them out of step
            return
    client.start_section(state.eval_section)
    state.in_eval_step = True


def on_eval_step_end() -> None:
    """After an evaluation step."""
    state = get_state()
    session = _session("on_eval_step_end")
    if session is None:
        return
    state.eval_steps_in_round += 1
    if state.in_eval_step:
        session.client.end_section(state.eval_section)
        state.in_eval_step = False
    if state.heartbeat_mode:
        session.client.send_heartbeat()


# -- checkpoints ----------------------------------------------------------
def on_checkpointing_start() -> None:
    """Before a checkpoint save (or before finalizing an async one)."""
    session = _session("on_checkpointing_start")
    if session is not None:
        session.client.start_section(Section.CHECKPOINTING)


def on_checkpointing_end(is_async_finalization: bool = False, iteration: Optional[int] = None,
                         persistent: bool = True) -> None:
    """After a save: reports the checkpointed iteration as progress; learns timeouts after the run's first save.

    Progress is reported only for a complete, persistent checkpoint. ``iteration`` is the iteration
    stored in it; by default, for a synchronous save, the number of steps completed (last step's
    iteration + 1, Megatron's convention). With ``--async-save`` the save's end only schedules it:
    pass ``iteration`` with the finalization call, when the files are complete. ``persistent=False``
    (a node-local checkpoint) reports nothing. Under Megatron-LM (the drop-in) the iteration is read
    from Megatron-LM's own tracker file, which it writes for complete persistent checkpoints only.
    For each iteration reported, global rank 0 writes the manifest of ``<save>/iter_NNNNNNN`` (when
    that directory exists) in a background thread.
    """
    state = get_state()
    session = _session("on_checkpointing_end")
    if session is None:
        return
    client = session.client
    client.end_section(Section.CHECKPOINTING)
    if state.tracker_file is not None:
        state.save_pending |= not is_async_finalization
        if state.save_pending:  # finalization runs every iteration: read the tracker only while a save is out
            iteration = _persistent_iteration(state.tracker_file)
            if iteration is not None and (state.reported_iteration is None or iteration > state.reported_iteration):
                state.save_pending = False
            else:
                iteration = None
    elif iteration is None and not is_async_finalization and not state.async_save and state.iteration is not None:
        iteration = state.iteration + 1
    if iteration is not None and persistent:
        client.report_checkpoint(iteration)
        state.reported_iteration = iteration
        if state.manifests is not None and state.save_dir is not None:
            directory = checkpoint_dir(state.save_dir, iteration)
            if os.path.isdir(directory):  # Megatron's layout (another layout gets no manifest)
                state.manifests.submit(directory, iteration)
    if state.heartbeat_mode:
        client.send_heartbeat()
    if is_async_finalization:
        return  # may run before any step, not necessarily in lockstep: never learn here
    session.save_completed()


def on_checkpoint_loaded(is_local_chkpt: bool) -> None:
    """After a checkpoint load. A persistent (not local) load makes ``setup`` representative to learn.

    After a verified load (:func:`load_checkpoint_verified`, :func:`choose_checkpoint_iteration`)
    of a persistent checkpoint it also starts watching the loss of the next
    ``suspect_checkpoint_steps`` steps (see :func:`on_training_step_end`).
    """
    state = get_state()
    session = _session("on_checkpoint_loaded")
    if session is None:
        return
    session.checkpoint_loaded(persistent=not is_local_chkpt)
    verified, state.verified_load = state.verified_load, None
    if verified is not None and not is_local_chkpt:
        # Read with getattr: the config key is newer than this hook (the fault policy's default otherwise).
        steps = int(getattr(session.client.cfg, "suspect_checkpoint_steps", FaultPolicy.suspect_checkpoint_steps))
        state.loss_watch = LossWatch(verified[0], verified[1], steps=steps) if steps > 0 else None


def load_checkpoint_verified(load_dir: Optional[str], load: Optional[Callable[[str], Any]] = None,
                             weights: Optional[Callable[[Any], Any]] = None) -> Optional[LoadResult]:
    """Load the newest good ``iter_N`` checkpoint of ``load_dir`` (``args.load``), the same one on every rank.

    Candidates: the tracker's (``latest_checkpointed_iteration.txt``) iteration first,
    then older ``iter_N`` directories with a manifest, newest first. Each is checked
    (manifest: every file there with its size and CRC-32; not marked bad by the
    launcher), then loaded with ``load(iter_dir)`` and the tensors of ``weights(state)``
    checked for NaN and infinity; the first that passes on every rank (an all-reduce
    over the default process group) is returned, with the ones skipped. The ranks write
    ``checkpoint_rejected`` and ``checkpoint_loaded`` records for ``ft_launcher``.
    ``load=None`` only verifies (see :func:`choose_checkpoint_iteration`). Works with or
    without ``--enable-ft``; call ``on_checkpoint_loaded`` after applying the state, as
    after any load.

    Returns None when there is no checkpoint to resume from (no ``load_dir``, no tracker).
    Raises :class:`~ft_integrations.checkpoint_guard.NoGoodCheckpointError` when every
    candidate is rejected: resuming would load a bad checkpoint.

    Example (``examples/megatron/train.py``)::

        result = ft.load_checkpoint_verified(
            args.load, lambda path: dist_checkpointing.load(model.sharded_state_dict(), path),
            weights=lambda state: {k: state[k] for k in model.state_dict()})
        if result is not None:
            model.load_state_dict(...); ft.on_checkpoint_loaded(is_local_chkpt=False)
    """
    if not load_dir or not os.path.isdir(load_dir):
        return None
    result = checkpoints.load_verified_checkpoint(load_dir, load, weights)
    if result is not None:
        iteration = iteration_of(result.path)
        get_state().verified_load = (iteration, result.path) if iteration is not None else None
    return result


def choose_checkpoint_iteration(load_dir: Optional[str]) -> Optional[int]:
    """The iteration of the newest ``iter_N`` checkpoint of ``load_dir`` that verifies on every rank.

    For a loader that loads by itself (Megatron-LM's ``load_checkpoint``: pass the result as
    ``args.ckpt_step``): :func:`load_checkpoint_verified` without a load, so without the
    finite check. None when there is nothing to resume from; raises
    :class:`~ft_integrations.checkpoint_guard.NoGoodCheckpointError` when every candidate
    is rejected.
    """
    result = load_checkpoint_verified(load_dir)
    return None if result is None else iteration_of(result.path)


def state_dict() -> dict[str, Any]:
    """Learned timeouts (``{"current_timeouts": ...}``) to store in the checkpoint; ``{}`` when disabled."""
    session = _session("state_dict")
    return session.state_dict() if session is not None else {}


def load_state_dict(ft_state: Optional[dict[str, Any]]) -> None:
    """Restore timeouts saved by :func:`state_dict` (they apply at once); empty or None is ignored.

    Invalid state is ignored with a warning: the timeouts in force stay.
    """
    session = _session("load_state_dict")
    if session is not None and ft_state:
        session.restore(ft_state, "the checkpoint")


# -- internals ------------------------------------------------------------
def _session(hook: str) -> Optional[FaultToleranceSession]:
    """The live session, or None where the hook is a no-op (FT disabled, or after shutdown/abort)."""
    state = get_state()
    if state.enabled is None and not _megatron_args_disable_ft():
        raise FaultToleranceSetupError(
            f"ft_integrations.megatron.{hook}() was called before setup(args): call setup(args) once per "
            "process before model init (it does nothing without --enable-ft)")
    return state.session


def _megatron_args_disable_ft() -> bool:
    """Inside Megatron-LM, its global args say whether FT is on even if setup() was never called."""
    global_vars = sys.modules.get("megatron.training.global_vars")
    args = getattr(global_vars, "_GLOBAL_ARGS", None)
    return args is not None and not getattr(args, "enable_ft_package", False)


def _persistent_iteration(tracker_file: str) -> Optional[int]:
    """The iteration in Megatron-LM's tracker file; None when absent, unreadable or ``release``."""
    try:
        with open(tracker_file, encoding="utf-8") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def _state_file_path(args: Any) -> Optional[str]:
    explicit = getattr(args, "ft_state_file", None)
    if explicit:
        return os.path.abspath(explicit)
    save = getattr(args, "save", None)
    return os.path.join(os.path.abspath(save), FT_STATE_FILENAME) if save else None
