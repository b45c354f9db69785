"""``FaultToleranceCallback``: hang detection, timeout learning and auto-resume for a Lightning ``Trainer``."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional, Union

from typing_extensions import override

from ft_core.client import MONITOR_SOCKET_ENV, RankMonitorClient, RankMonitorClientError
from ft_core.config import FaultToleranceConfig
from ft_core.config_fallback import fallback_of
from ft_core.data import WorkloadControlRequest
from ft_core.fault_policy import FaultPolicy
from ft_core.monitor.standalone import connect_standalone
from ft_core.snapshots.interval import AUTO, SnapshotEvery
from ft_core.utils.strenum import StrEnum
from ft_core.utils.validation import (
    ValidationError,
    boolean,
    callable_or_none,
    enum_member,
    int_in_range,
    path_or_none,
)
from ft_integrations.checkpoint_guard import LoadResult
from ft_integrations.fault_injection import FaultInjector, SimulatedFault
from ft_integrations.lightning._pl import (
    Callback,
    MisconfigurationException,
    pl,
    rank_zero_info,
    rank_zero_warn,
)
from ft_integrations.lightning.checkpoint_io import FaultToleranceCheckpointIO
from ft_integrations.lightning.config_argument import coerce_config, config_problem, default_config
from ft_integrations.lightning.data_phase import StragglerPhases, skip_unused_step_hooks
from ft_integrations.lightning.loss_watch import ResumeLossWatch
from ft_integrations.lightning.sharded import ShardedCheckpointGuard
from ft_integrations.lightning.snapshots import (
    LightningSnapshots,
    load_learned_every,
    save_learned_every,
    snapshot_every_arg,
)
from ft_integrations.session import (
    FINISHED_FLAG_ENV,
    FaultToleranceSession,
    LearningSchedule,
    MonitoringMode,
    Section,
)

__all__ = ["FaultToleranceCallback", "StandalonePolicy"]

log = logging.getLogger("ft_integrations.lightning")


class StandalonePolicy(StrEnum):
    """What :class:`FaultToleranceCallback` does when ``ft_launcher`` did not start the run."""

    #: Start a rank monitor for this node: hung ranks are detected and killed, nothing restarts them.
    MONITOR = "monitor"
    #: No hang detection.
    OFF = "off"
    #: Raise ``MisconfigurationException``.
    ERROR = "error"


ExceptionPolicy = Callable[[BaseException], Optional[WorkloadControlRequest]]


class FaultToleranceCallback(Callback):
    r"""Detects hung or dead ranks, learns their timeouts and stops SLURM requeue loops when training is done.

    Every rank reports to the node's rank monitor: heartbeats, or the sections it is in
    (``setup``, ``step``, ``validation``, ``checkpointing``). A rank that misses its
    deadline is killed by the monitor and ``ft_launcher`` restarts all workers, which resume
    from the last checkpoint. Timeouts are learned in the first run from observed step,
    validation and checkpoint times and are saved in the Lightning checkpoint; they never fall
    below what the job has already needed (job-life maxima). A ``torch.compile`` (re)compilation
    is its own ``compile`` phase (the rank's client marks it from TorchDynamo's callbacks), timed
    by ``compile_timeout`` while the step deadline pauses. The callback maps Lightning's hooks
    onto a :class:`~ft_integrations.session.FaultToleranceSession`, which it shares with the
    Megatron integration; each hook makes one call per part (snapshots, the NaN watch, checkpoint
    IO, sharded checkpoints, straggler phases), whose body is in the part's module.

    Args:
        mode: a :class:`~ft_integrations.session.MonitoringMode` or its value: ``"heartbeats"``
            (a heartbeat at train start, after every training batch, around validation and
            checkpoint saves; watched by ``rank_heartbeat_timeout``) or ``"sections"`` (watched by
            ``rank_section_timeouts`` for the sections above and ``rank_out_of_section_timeout``
            for everything else). The monitor's config decides which sections have deadlines;
            ``step`` must be among them.
        calculate_timeouts: learn timeouts after ``calculate_timeouts_after_steps`` training steps,
            again after the first checkpoint save, and at the end of training. Learned values
            only grow afterwards (max over all ranks times ``safety_factor``).
        calculate_timeouts_after_steps: the training step of the first calculation. In heartbeats
            mode a checkpoint save is one long gap between heartbeats: if saves take much longer
            than ``safety_factor`` steps, use ``mode="sections"`` or pick a number past your
            first save.
        state_file: optional JSON file: learned timeouts are also written there (atomically, by
            rank 0) and read at start, for runs that do not resume from a checkpoint. A file that
            cannot be read or is not valid is ignored with a warning.
        autoresume: when training is complete (``max_steps``/``max_epochs`` reached, also by a
            resumed run with nothing left to do) global rank 0 creates the file named by
            ``FAULT_TOL_FINISHED_FLAG_FILE``, so a requeue loop stops.
        simulated_fault: a :class:`~ft_integrations.lightning.SimulatedFault` (or a mapping of
            its fields) to inject for drills.
        exc_handling_policy: called with the exception when training fails; a returned
            :class:`~ft_core.data.WorkloadControlRequest` (e.g. ``ShutdownWorkload``) is sent to
            ``ft_launcher``. ``SystemExit(0)`` is a graceful stop and is not passed to it.
        standalone: a :class:`StandalonePolicy` or its value: what to do when not launched by
            ``ft_launcher`` (``FT_RANK_MONITOR_IPC_SOCKET`` unset): ``"monitor"`` starts a monitor
            for this node (hangs are still detected and the rank killed, but nothing restarts it),
            ``"off"`` disables hang detection, ``"error"`` raises.
        config: timeouts for this training script: a :class:`~ft_core.config.FaultToleranceConfig`,
            a mapping, or a YAML path (its ``fault_tolerance:`` block). The monitor started with
            ``standalone="monitor"`` uses it; under ``ft_launcher`` its timeouts fill in whatever
            the launcher's user did not set (``--ft-*`` flags and ``--ft-cfg-path`` keys win,
            even when they equal the defaults). Default: the core
            defaults in heartbeats mode; in sections mode the same limits moved onto the
            sections (:data:`~ft_integrations.lightning.config_argument.DEFAULT_SECTION_CONFIG`), so ``mode="sections"`` works with a plain
            ``ft_launcher`` command line.
        verify_checkpoints: checkpoint writes through the strategy's ``CheckpointIO`` are atomic
            (temp file, fsync, rename) with a manifest beside each (size, CRC-32, step), and a
            resume checks the checkpoint it loads (manifest, loads, finite tensors), falling back
            to the newest older checkpoint of the same directory that passes, on every rank the
            same. Local and mounted filesystems only; remote URLs are written and read as they are.
            Checkpoint directories a strategy writes itself (FSDP sharded, DeepSpeed) get a manifest
            listing every file, written after the save, and are verified the same way. After a
            resume from a verified checkpoint, the loss of the first ``suspect_checkpoint_steps``
            steps (the monitor's config; 10) must be finite, else ``NonFiniteLossError`` ends the
            cycle and ``ft_launcher`` marks that checkpoint bad.
        snapshot_every: under ``ft_launcher``, keep an in-memory snapshot of the training state (the
            checkpoint Lightning would write, plus RNG states) every this many training steps in the
            node's shared memory, written off the training thread; a restart resumes from the newest
            snapshot every rank holds when it is newer than the disk checkpoint, so a fault costs at
            most this many steps. ``"auto"`` (the default): the interval that keeps the measured cost
            of this job's snapshots within 2 % of its step time (first snapshot at step 10, then
            re-measured at every one; kept in this callback's state across resumes), and only when
            the node's memory has room for them (checked before any copy); off without ``ft_launcher``.
            ``None`` or ``0``: off. A snapshot is also taken at ``calculate_timeouts_after_steps``,
            so the learned timeouts have seen one. See ``docs/snapshots.md``.

    Raises:
        MisconfigurationException: if an argument has an unsupported value, or the monitor's
            config cannot work with ``mode``.

    Example::

        # torchrun-compatible: ft_launcher --nproc-per-node=2 --max-restarts=3 \
        #     --ft-rank-section-timeouts=setup:600,step:180,validation:600,checkpointing:600 train.py
        import torch
        from lightning.pytorch import Trainer
        from lightning.pytorch.demos.boring_classes import BoringModel
        from ft_integrations.lightning import FaultToleranceCallback

        trainer = Trainer(max_steps=20, accelerator="cpu", logger=False,
                          callbacks=[FaultToleranceCallback(mode="sections")])
        trainer.fit(BoringModel(), ckpt_path="last")
    """

    def __init__(
        self,
        mode: Union[MonitoringMode, str] = MonitoringMode.HEARTBEATS,
        calculate_timeouts: bool = True,
        calculate_timeouts_after_steps: int = 100,
        state_file: Optional[Union[str, os.PathLike[str]]] = None,
        autoresume: bool = False,
        simulated_fault: Optional[Union[SimulatedFault, Mapping[str, Any]]] = None,
        exc_handling_policy: Optional[ExceptionPolicy] = None,
        standalone: Union[StandalonePolicy, str] = StandalonePolicy.MONITOR,
        config: Optional[Union[FaultToleranceConfig, Mapping[str, Any], str, os.PathLike[str]]] = None,
        verify_checkpoints: bool = True,
        snapshot_every: Optional[SnapshotEvery] = AUTO,
    ) -> None:
        super().__init__()
        name = "FaultToleranceCallback."
        try:
            mode = enum_member(name + "mode", mode, MonitoringMode)
            standalone = enum_member(name + "standalone", standalone, StandalonePolicy)
            boolean(name + "calculate_timeouts", calculate_timeouts)
            boolean(name + "autoresume", autoresume)
            boolean(name + "verify_checkpoints", verify_checkpoints)
            steps = int_in_range(name + "calculate_timeouts_after_steps", calculate_timeouts_after_steps, 1)
            state_file = path_or_none(name + "state_file", state_file)
            self.snapshot_every = snapshot_every_arg(name + "snapshot_every", snapshot_every)
            callable_or_none(name + "exc_handling_policy", exc_handling_policy,
                             allowed="None or a callable (exception -> WorkloadControlRequest or None)")
        except ValidationError as exc:
            raise MisconfigurationException(str(exc)) from None
        try:
            fault = None if simulated_fault is None else SimulatedFault.coerce(simulated_fault)
        except ValidationError as exc:
            raise MisconfigurationException(f"{name}simulated_fault: {exc}") from None
        self.autoresume = autoresume
        self.verify_checkpoints = verify_checkpoints
        self.simulated_fault = fault
        self.exc_handling_policy = exc_handling_policy
        self.standalone = standalone
        self.config = coerce_config(config)
        # Learned at global step ``steps``; "setup" and the initial heartbeat only when the Trainer
        # resumed from a checkpoint (on_load_checkpoint ran): a fresh start's would kill a resume;
        # out-of-section gaps once an epoch boundary was seen.
        schedule = LearningSchedule(enabled=calculate_timeouts, learns=mode, after_steps=steps,
                                    setup_needs_checkpoint_load=True, out_of_section_needs_boundary=True)
        self._session = FaultToleranceSession(schedule, state_file=state_file, name="FaultToleranceCallback",
                                              logger=log, info=rank_zero_info, warn=rank_zero_warn)
        #: The rank's monitor client (the session's); ``client.cfg`` is the monitor's config once connected.
        self.client: RankMonitorClient = self._session.client
        self._sections = mode is MonitoringMode.SECTIONS  # read on every step: an attribute, not a property
        self._trainer: Optional[pl.Trainer] = None
        self._injector: Optional[FaultInjector] = None
        # The parts (their bodies in their modules); None: not in this run.
        self._checkpoint_io: Optional[FaultToleranceCheckpointIO] = None
        self._sharded: Optional[ShardedCheckpointGuard] = None
        self._snapshots: Optional[LightningSnapshots] = None
        self._loss_watch = ResumeLossWatch()
        self._phases = StragglerPhases()
        skip_unused_step_hooks(self)  # no call of an empty hook at every step
        self._reset_run_state()

    def _reset_run_state(self) -> None:
        self._save_pending = False  # a checkpoint save started whose end this rank has not seen yet
        self._first_epoch: Optional[int] = None
        self._in_setup = False
        self._checkpointing_open = False
        self._last_reported: Optional[int] = None
        self._loss_watch.setup()
        self._phases.setup()

    # The arguments the session owns, read-only so that the callback and its session cannot disagree.
    @property
    def mode(self) -> MonitoringMode:
        """``mode=``: what the rank reports, and so which timeouts are learned."""
        return self._session.schedule.learns

    @property
    def calculate_timeouts(self) -> bool:
        """``calculate_timeouts=``."""
        return self._session.schedule.enabled

    @property
    def calculate_timeouts_after_steps(self) -> int:
        """``calculate_timeouts_after_steps=``."""
        return self._session.schedule.after_steps

    @property
    def state_file(self) -> Optional[str]:
        """``state_file=`` as a string path, or None."""
        return self._session.state_file

    @property
    @override
    def state_key(self) -> str:
        # One key whatever the arguments: changing ``mode`` must not orphan learned timeouts.
        return type(self).__qualname__

    @property
    def active(self) -> bool:
        """True while this rank is connected to a rank monitor."""
        return self.client.is_initialized

    # -- lifecycle --------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._reset_run_state()
        self._trainer = trainer
        self._session.begin_run(writer=trainer.is_global_zero)
        if self.autoresume and self._session.finished_flag_path() is None:
            rank_zero_warn(f"FaultToleranceCallback(autoresume=True) but {FINISHED_FLAG_ENV} is not set: "
                           "no finished flag will be written")
        # Writes timed, atomic and verified on resume (which protect a run without a monitor too).
        self._checkpoint_io = FaultToleranceCheckpointIO.attach(trainer, self, verify=self.verify_checkpoints)
        if self.verify_checkpoints:
            self._sharded = ShardedCheckpointGuard(trainer.strategy, self).attach()
        if self.snapshot_every:
            self._snapshots = LightningSnapshots.for_trainer(
                trainer, self.snapshot_every, self.calculate_timeouts_after_steps if self.calculate_timeouts else None)
        if not self._connect():
            return
        self._check_config(self.client.cfg)
        if self.simulated_fault is not None:
            self._injector = FaultInjector(self.simulated_fault, trainer.global_rank, trainer.world_size)
        if self._sections:
            self.client.start_section(Section.SETUP)
            self._in_setup = True

    def _connect(self) -> bool:
        """Connect to ft_launcher's monitor, or handle ``standalone``; False if fault tolerance is off."""
        self._session.load_state_file()
        cfg = self.config if self.config is not None else default_config(self.mode)
        if os.environ.get(MONITOR_SOCKET_ENV):
            # Settings given at launch (--ft-*, --ft-cfg-path) win; ours fill in the keys not set there.
            self.client.init_workload_monitoring(fallback_config=fallback_of(cfg))
            return True
        if self.standalone is StandalonePolicy.ERROR:
            raise MisconfigurationException(
                f"FaultToleranceCallback(standalone='error'): {MONITOR_SOCKET_ENV} is not set, so this run was "
                "not launched by ft_launcher. Launch it with `ft_launcher` (a drop-in for torchrun), or pass "
                "standalone='monitor' or 'off'")
        if self.standalone is StandalonePolicy.OFF:
            rank_zero_info("FaultToleranceCallback: not launched by ft_launcher and standalone='off': "
                           "hang detection is disabled")
            return False
        path = connect_standalone(self.client, cfg)
        rank_zero_info(f"FaultToleranceCallback: not launched by ft_launcher; started a rank monitor for this "
                       f"node ({path}). Hung ranks are detected and killed, but restarts need ft_launcher.")
        return True

    def _check_config(self, cfg: Optional[FaultToleranceConfig]) -> None:
        """Reject monitor configs that cannot work with ``mode``; say what to change."""
        assert cfg is not None
        problem = config_problem(cfg, self.mode, self.calculate_timeouts)
        if problem is not None:
            self.client.shutdown_workload_monitoring()
            raise MisconfigurationException(f"FaultToleranceCallback: the monitor's config does not fit: {problem}")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._disconnect(trainer)

    def _disconnect(self, trainer: pl.Trainer, training_finished: bool = False) -> None:
        """Leave the monitor (it stops watching this rank); local only, never a collective.

        ``training_finished``: report training complete in the goodbye (see
        ``RankMonitorClient.shutdown_workload_monitoring``).
        """
        self._phases.teardown(trainer, self.client)
        if self._injector is not None:
            self._injector.cancel()
            self._injector = None
        if self._checkpoint_io is not None:
            self._checkpoint_io.detach(trainer)
        if self._sharded is not None:
            self._sharded.detach()
        if self._snapshots is not None:
            self._snapshots.close()  # a write in progress ends whole
        self._checkpoint_io = self._sharded = self._snapshots = None
        if self.client.is_initialized:
            self.client.end_all_sections()
            self.client.shutdown_workload_monitoring(training_finished=training_finished)
        self._save_pending = self._in_setup = self._checkpointing_open = False

    # -- training ---------------------------------------------------------
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Between the restore of the model and callbacks and that of the loops and optimizers: every rank.
        if self._snapshots is not None:  # a newer snapshot's state: the NaN watch covers it
            self._loss_watch.on_fit_start(self._snapshots.on_fit_start(trainer))

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._loss_watch.on_train_start(trainer, self._suspect_checkpoint_steps())
        if not self.active:
            return
        self._phases.on_train_start(trainer, self.client)
        self._first_epoch = trainer.current_epoch
        self.client.set_iteration(trainer.global_step)
        if not self._sections:
            self.client.send_heartbeat()
        if self._injector is not None:
            self._injector.on_train_start()

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if not self.active:
            return
        self._finish_pending_save()
        if self._in_setup:
            self.client.end_section(Section.SETUP)
            self._in_setup = False
        if batch_idx == 0 and trainer.current_epoch != self._first_epoch:
            self._session.saw_boundary()
        step = trainer.global_step
        self.client.set_iteration(step)
        self._phases.on_train_batch_start(self.client, batch_idx, time.monotonic())
        if self._sections:
            self.client.start_section(Section.STEP)
        if self._injector is not None:
            self._injector.on_step_start(step)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._snapshots is not None:
            self._snapshots.maybe_take(trainer)
        if not self.active:
            return
        if self._sections:
            self.client.end_section(Section.STEP)
        else:
            self.client.send_heartbeat()
        self._session.step_completed(trainer.global_step)

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        self._loss_watch.on_before_backward(trainer, loss)  # reads the loss (a device sync) only after a resume
        if self.active:
            self._phases.on_before_backward(self.client, time.monotonic())

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.active:
            self._finish_pending_save()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.active:
            return
        self._finish_pending_save(learn=False)
        self._session.learn_at_end("at the end of training")
        # Training is over: leave the monitor now. Lightning's teardown that follows is out of
        # section, and an out-of-section timeout just learned from a short run would kill a rank
        # that is merely slow to tear down (a false kill), with nothing left to protect. With
        # max_steps/max_epochs reached the goodbye reports training complete: the launcher then
        # never restarts the job for a crash at exit (a time limit's stop is not complete).
        self._disconnect(trainer, training_finished=_training_complete(trainer))

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Global rank 0 (the session's writer) creates the flag, also when fault tolerance is off.
        if self.autoresume and _training_complete(trainer):
            self._session.write_finished_flag()

    # -- validation -------------------------------------------------------
    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.active:
            return
        self._finish_pending_save(learn=False)
        if self._sections:
            self.client.start_section(Section.VALIDATION)
        elif not trainer.sanity_checking:  # before training, the initial heartbeat timeout applies
            self.client.send_heartbeat()

    @override
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.active and not self._sections and not trainer.sanity_checking:
            self.client.send_heartbeat()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.active:
            return
        if self._sections:
            self.client.end_section(Section.VALIDATION)
        elif not trainer.sanity_checking:
            self.client.send_heartbeat()

    # -- checkpointing ----------------------------------------------------
    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # Called on every rank right before the write. Only some ranks write (rank 0 under DDP);
        # the others wait for it in a barrier, so for them the save also lasts until the write
        # ends: the section stays open until this rank's next hook. A snapshot being built is no save.
        if not self.active or (self._snapshots is not None and self._snapshots.taking):
            return
        self._save_pending = True
        self._open_checkpointing()

    def on_checkpoint_write_start(self, path: str) -> None:
        """From :class:`FaultToleranceCheckpointIO`, on a rank that writes."""
        if not self.active:
            return
        self._open_checkpointing()
        if self._injector is not None and self._trainer is not None:
            self._injector.on_checkpoint_write(self._trainer.global_step)

    def on_checkpoint_write_end(self, checkpoint: dict[str, Any], path: str) -> None:
        """From :class:`FaultToleranceCheckpointIO` after a successful write."""
        if not self.active:
            return
        iteration = checkpoint.get("global_step")
        if iteration is None and self._trainer is not None:
            iteration = self._trainer.global_step
        # ModelCheckpoint may write several files per step (top-k and last): report each step once.
        if iteration is not None and int(iteration) != self._last_reported:
            self._last_reported = int(iteration)
            self.client.report_checkpoint(int(iteration))
        self._close_checkpointing()

    def on_checkpoint_loaded_verified(self, result: LoadResult) -> None:
        """From :class:`FaultToleranceCheckpointIO`: the checkpoint a resume loaded, and the newer ones it skipped."""
        self._loss_watch.on_checkpoint_loaded_verified(result)

    def _suspect_checkpoint_steps(self) -> int:
        """How many steps after a resume a non-finite loss condemns the checkpoint (0: not watched)."""
        cfg = self.client.cfg if self.active else self.config
        return int(getattr(cfg, "suspect_checkpoint_steps", FaultPolicy.suspect_checkpoint_steps))

    def snapshot_instead_of(self, path: str) -> Optional[dict[str, Any]]:
        """From :class:`FaultToleranceCheckpointIO` before a resume loads ``path``: a newer snapshot, if any."""
        return self._snapshots.instead_of(path) if self._snapshots is not None else None

    def _open_checkpointing(self) -> None:
        if not self._sections:
            self.client.send_heartbeat()
        elif not self._checkpointing_open:
            self.client.start_section(Section.CHECKPOINTING)
            self._checkpointing_open = True

    def _close_checkpointing(self) -> None:
        if not self._sections:
            self.client.send_heartbeat()
        elif self._checkpointing_open:
            self.client.end_section(Section.CHECKPOINTING)
            self._checkpointing_open = False

    def _finish_pending_save(self, learn: bool = True) -> None:
        """At the first hook after a save: close its section; with ``learn``, the session may learn.

        Callers are hooks every rank reaches in the same order, so the learning collective is safe.
        """
        if not self._save_pending:
            return
        self._save_pending = False
        self._close_checkpointing()
        if learn:
            self._session.save_completed()

    # -- timeouts ---------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        """The learned timeouts (``{"current_timeouts": ...}``) and the interval ``snapshot_every="auto"``
        learned (``"snapshot_every"``), saved in the Lightning checkpoint."""
        return save_learned_every(self._snapshots, self._session.state_dict())

    @override
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # Lightning calls it when ``fit`` resumes from a checkpoint (after ``setup``, which began the run).
        self._session.checkpoint_loaded(persistent=True)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore learned timeouts (and snapshot interval); works before and after the rank connected to its monitor."""
        timeouts = load_learned_every(self._snapshots, state_dict)
        if timeouts:
            self._session.restore(timeouts, "the checkpoint")

    # -- failures ---------------------------------------------------------
    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        graceful = isinstance(exception, SystemExit) and exception.code in (0, None)
        if not graceful and not isinstance(exception, KeyboardInterrupt):
            self.client.report_exception(exception)  # the fault's fingerprint, before this rank disconnects
        if not graceful and self.exc_handling_policy is not None:
            self._apply_policy(exception)
        # No collectives here: other ranks may be anywhere, or dead.
        self._disconnect(trainer)

    def _apply_policy(self, exception: BaseException) -> None:
        try:
            request = self.exc_handling_policy(exception)  # type: ignore[misc]
        except Exception:
            log.exception("FaultToleranceCallback: exc_handling_policy raised; no request sent")
            return
        if request is None:
            return
        if not isinstance(request, WorkloadControlRequest):
            log.error("FaultToleranceCallback: exc_handling_policy returned %r, not a WorkloadControlRequest; "
                      "ignored", request)
            return
        try:
            self.client.send_workload_control_request(request)
            log.warning("FaultToleranceCallback: sent %s to ft_launcher (%s)", request.action.name,
                        request.description or type(exception).__name__)
        except RankMonitorClientError as exc:
            log.error("FaultToleranceCallback: could not send %s: %s", request.action.name, exc)


def _training_complete(trainer: pl.Trainer) -> bool:
    """max_steps or max_epochs reached (``should_stop`` alone is not: a time limit also sets it)."""
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    if max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps:
        return True
    return max_epochs is not None and max_epochs >= 0 and trainer.current_epoch >= max_epochs
