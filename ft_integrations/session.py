"""One rank's fault tolerance session: what the Lightning callback and the Megatron hooks share.

An integration connects the session's :class:`~ft_core.client.RankMonitorClient` to the
node's monitor, opens the sections its framework defines, and maps its call sites onto a
:class:`FaultToleranceSession`, which owns:

* the learning schedule: timeouts are calculated (a collective) once after enough training
  steps, once after the run's first checkpoint save and at the end of training, and only
  what may be learned at that point (:class:`LearningSchedule`);
* the state file: learned timeouts read before connecting (they ride the handshake, so they
  already guard ``setup``) and rewritten atomically by one writer rank after each calculation;
* restoring learned timeouts from a checkpoint's state dict, validated: a bad file or state
  is ignored with a warning and the configured timeouts stay in force, never a crash;
* the finished flag (``FAULT_TOL_FINISHED_FLAG_FILE``) that stops an auto-resume loop;
* rank-0 logging of learned timeouts, once per change.

Example (what an integration does, in the order it does it)::

    session = FaultToleranceSession(LearningSchedule(after_steps=10), state_file="ft_timeouts.json")
    session.begin_run(writer=rank == 0)
    session.load_state_file()
    session.client.init_workload_monitoring()
    for step in range(steps):
        session.client.start_section("step"); train_step(); session.client.end_section("step")
        session.step_completed()                 # every rank, in lockstep: may learn
    session.learn_at_end()
    session.client.shutdown_workload_monitoring()
    session.write_finished_flag()
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Optional, Union

from ft_core import autoresume
from ft_core.client import RankMonitorClient, RankMonitorClientError
from ft_core.jobdir import FINISHED_FLAG_ENV  # re-exported: the integrations' name for it
from ft_core.learning_rules import learnable_sections, learns_startup, out_of_section_watched
from ft_core.timeouts import (
    CURRENT_TIMEOUTS_KEY,
    JOB_LIFE_KEY,
    STEP_SECTION,
    describe_timeouts,
    timeouts_from_state_dict,
)
from ft_core.utils.fileutil import atomic_write_json, read_json
from ft_core.utils.strenum import StrEnum
from ft_core.warmup import WarmupRule

__all__ = [
    "FINISHED_FLAG_ENV",
    "FaultToleranceSession",
    "LearningSchedule",
    "MonitoringMode",
    "Section",
]

log = logging.getLogger("ft_integrations.session")

#: A message channel, e.g. Lightning's ``rank_zero_info``.
Emit = Callable[[str], Any]


class MonitoringMode(StrEnum):
    """How a rank shows the monitor it is alive, and so which timeouts are learned."""

    #: Heartbeats, watched by the heartbeat timeouts.
    HEARTBEATS = "heartbeats"
    #: Sections (where the rank is), watched by the section and out-of-section timeouts.
    SECTIONS = "sections"


class Section(StrEnum):
    """The sections the integrations open (the monitor's config decides which are watched)."""

    #: From connecting to the first timed step: process group, model, checkpoint load, warm-up.
    SETUP = "setup"
    #: One training step; the core warm-up rule (``num_warmup_iterations``) applies to it.
    STEP = STEP_SECTION
    #: One Megatron evaluation step.
    EVAL = "eval"
    #: Lightning's validation loop (and Megatron's eval when only this name is watched).
    VALIDATION = "validation"
    #: A checkpoint save.
    CHECKPOINTING = "checkpointing"


@dataclasses.dataclass(frozen=True)
class LearningSchedule:
    """When a session calculates timeouts, and what it may learn at each point.

    The integrations differ only here: Lightning learns heartbeat or section timeouts at
    global step ``after_steps`` and out-of-section gaps once an epoch boundary was seen;
    Megatron learns section timeouts after ``after_steps`` timed steps of each run, past its
    ``warmup_steps``. Both learn the startup phases only in a run that resumed from a checkpoint.
    """

    #: Calculate at all (``calculate_timeouts=`` / ``--calc-ft-timeouts``).
    enabled: bool = True
    #: Heartbeat timeouts, or section and out-of-section timeouts.
    learns: MonitoringMode = MonitoringMode.SECTIONS
    #: The first calculation: when the integration's own step number reaches this, or, when
    #: the session counts the steps itself, after this many *timed* steps of the run (past
    #: ``warmup_steps`` and the monitor's ``num_warmup_iterations``).
    after_steps: int = 1
    #: The first steps of every run that stay out of ``step`` (the integration keeps them in ``setup``).
    warmup_steps: int = 0
    #: Learn the startup phases (``setup``, and the ``initial`` heartbeat timeout) only in a run
    #: that loaded a persistent checkpoint (:meth:`FaultToleranceSession.checkpoint_loaded`):
    #: a fresh start is shorter than a resume, and the value must hold for the next restart's.
    #: A fresh start keeps them as they are (configured, or learned by an earlier resume).
    setup_needs_checkpoint_load: bool = False
    #: Learn the out-of-section timeout only once the integration reported the boundary where
    #: the longest gaps happen (:meth:`FaultToleranceSession.saw_boundary`), or at the end.
    out_of_section_needs_boundary: bool = False
    #: Calculate once the step count reaches ``after_steps``; False: only after saves and at
    #: the end (Megatron-LM's schedule).
    learn_after_steps: bool = True
    #: Calculate after every checkpoint save, not only the run's first one (Megatron-LM):
    #: each synchronous save refines the values with everything observed so far.
    learn_after_every_save: bool = False
    #: Learn ``step`` only once the run completed this many steps, warm-up included
    #: (Megatron-LM: 16): a few steps say too little about the slowest one.
    step_needs_steps: int = 0
    #: Learn ``checkpointing``; False with asynchronous saves, whose duration varies too much
    #: between runs (all overlapped in one, a costly finalization in the next).
    learn_checkpointing: bool = True
    #: Learn the out-of-section timeout only in a run that could also learn ``setup`` and
    #: ``step`` and saved a checkpoint: only such a run has seen all the usual gaps.
    out_of_section_needs_complete_run: bool = False


class FaultToleranceSession:
    """One rank's monitor client with its learning schedule, state file and finished flag.

    Methods that may learn (:meth:`step_completed`, :meth:`save_completed`,
    :meth:`learn_at_end`) run a collective: call them only where every rank is in lockstep.
    Learning never fails training: errors become warnings.

    Args:
        schedule: when and what to learn.
        state_file: JSON file of learned timeouts, read by :meth:`load_state_file` and
            rewritten (atomically) after each calculation by the writer rank.
        name: the prefix of every message (``"FaultToleranceCallback"``, ``"fault tolerance"``).
        logger: receives debug messages, and info and warnings unless ``info``/``warn`` are given.
        info: the rank-0 info channel; default: ``logger.info`` on global rank 0 (``RANK``).
        warn: the warning channel; default: ``logger.warning`` on every rank.
    """

    def __init__(
        self,
        schedule: LearningSchedule,
        *,
        state_file: Optional[Union[str, os.PathLike[str]]] = None,
        name: str = "fault tolerance",
        logger: logging.Logger = log,
        info: Optional[Emit] = None,
        warn: Optional[Emit] = None,
    ) -> None:
        self.schedule = schedule
        self.state_file = os.fspath(state_file) if state_file is not None else None
        self.name = name
        self.client = RankMonitorClient()
        self._log = logger
        self._info = info if info is not None else self._rank_zero_log_info
        self._warn = warn if warn is not None else logger.warning
        self._restored = False  # timeouts restored from a file or checkpoint
        self._reported: Optional[dict[str, Any]] = None  # the timeouts last logged
        self.begin_run(writer=False)

    # -- runs -------------------------------------------------------------
    def begin_run(self, writer: bool) -> None:
        """Start a run (a ``fit``, a training process): the schedule starts over; learned values stay.

        Args:
            writer: this rank writes the state file and the finished flag.
        """
        self.writer = writer
        #: Training steps completed in this run.
        self.steps_completed = 0
        #: Checkpoint saves completed in this run.
        self.saves_completed = 0
        self._learned_after_steps = False
        self._learned_after_save = False
        self._persistent_checkpoint_loaded = False
        self._boundary_seen = not self.schedule.out_of_section_needs_boundary

    def in_warmup(self) -> bool:
        """Whether the step about to start is one of this run's ``warmup_steps`` (core warm-up rule)."""
        return WarmupRule.covers(self.steps_completed, self.schedule.warmup_steps)

    def step_completed(self, step: Optional[int] = None) -> None:
        """A training step ended on every rank; learns once the schedule's first step is reached.

        Args:
            step: the integration's own step number (Lightning's global step, which a resumed
                run starts past 0): learn when it reaches ``after_steps`` and this run completed
                ``after_steps`` steps of its own. ``None``: learn after
                ``after_steps`` timed steps of this run, counted by the session.
        """
        self.steps_completed += 1
        if self._learned_after_steps or not self.schedule.learn_after_steps:
            return
        if step is None:
            step = self.steps_completed
            first = self.schedule.after_steps + self.schedule.warmup_steps + self._monitor_warmup()
        else:
            first = self.schedule.after_steps
        # A resumed run starts past ``after_steps`` (Lightning's global step): it must still see
        # ``after_steps`` steps of its own, not learn from one gap at its first batch.
        if step >= first and self.steps_completed >= self.schedule.after_steps:
            self._learned_after_steps = True
            self._learn(f"after {step} steps")

    def save_completed(self) -> None:
        """A checkpoint save ended on every rank; learns after the run's first one (or every one)."""
        self.saves_completed += 1
        if not self._learned_after_save or self.schedule.learn_after_every_save:
            first, self._learned_after_save = not self._learned_after_save, True
            self._learn("after the first checkpoint save" if first else "after a checkpoint save")

    def learn_at_end(self, when: str = "at the end of training") -> None:
        """Training ended on every rank: the last calculation, from every gap observed."""
        self._boundary_seen = True
        self._learn(when)

    def checkpoint_loaded(self, persistent: bool) -> None:
        """A checkpoint was loaded; a persistent one makes this run a resume, whose startup is learned."""
        self._persistent_checkpoint_loaded = persistent

    def saw_boundary(self) -> None:
        """The longest out-of-section gaps (an epoch boundary: data loaders restart) were observed."""
        self._boundary_seen = True

    # -- state ------------------------------------------------------------
    @property
    def has_state(self) -> bool:
        """Connected once, or timeouts restored: there are timeouts worth saving."""
        return self.client.cfg is not None or self._restored

    def state_dict(self) -> dict[str, Any]:
        """``{"current_timeouts": ...}`` for a checkpoint; ``{}`` when there is nothing to save."""
        return self.client.state_dict() if self.has_state else {}

    def restore(self, state: Any, source: str = "the checkpoint") -> bool:
        """Apply learned timeouts from a state dict, before connecting or at once after.

        An invalid ``state`` is ignored with a warning naming ``source``: the timeouts in
        force stay. Returns whether it was applied.
        """
        if not isinstance(state, Mapping) or CURRENT_TIMEOUTS_KEY not in state:
            # The client ignores such a state with a log line (as NVRx); the integration says why.
            self._warn(f"{self.name}: ignoring the timeouts in {source}: not a fault tolerance state dict "
                       f"(expected {{'{CURRENT_TIMEOUTS_KEY}': ...}}), got {type(state).__name__}")
            return False
        try:
            self.client.load_state_dict(state)
        except RankMonitorClientError as exc:
            self._warn(f"{self.name}: ignoring the timeouts in {source}: {exc}")
            return False
        self._restored = True
        self._reported = self._current_timeouts()
        self._info(f"{self.name}: timeouts restored from {source}: {self._described()}")
        return True

    def load_state_file(self) -> bool:
        """Restore from the state file, if there is one; call before connecting.

        A missing file is normal (a first run); an unreadable, truncated or invalid one is
        ignored with a warning. Returns whether timeouts were restored.
        """
        path = self.state_file
        if not path or not os.path.exists(path):
            return False
        try:
            state = read_json(path)
        except (OSError, ValueError) as exc:  # ValueError: truncated or not JSON
            self._warn(f"{self.name}: ignoring the timeouts in {path}: {exc}")
            return False
        return self.restore(state, path)

    # -- finished flag, logging --------------------------------------------
    @staticmethod
    def finished_flag_path() -> Optional[str]:
        """The file named by ``FAULT_TOL_FINISHED_FLAG_FILE``, or None when it is not set."""
        return autoresume.finished_flag_path()

    def write_finished_flag(self) -> Optional[str]:
        """Training is complete: the writer rank creates the finished flag, so a requeue loop stops.

        Returns the path created, or None (not the writer, or the variable is not set).
        """
        if not self.writer:
            return None
        flag = autoresume.mark_training_finished()
        if flag is None:
            return None
        self._info(f"{self.name}: training is complete; created {flag}")
        return flag

    def info(self, message: str) -> None:
        """Log ``message`` once per job, through the rank-0 channel."""
        self._info(message)

    # -- internals ----------------------------------------------------------
    def _monitor_warmup(self) -> int:
        cfg = self.client.cfg
        return cfg.num_warmup_iterations if cfg is not None else 0

    def _learn(self, when: str) -> None:
        """Calculate timeouts: a collective, so only where every rank is in lockstep."""
        if not self.schedule.enabled or not self.client.is_initialized:
            return
        try:
            if self.schedule.learns is MonitoringMode.HEARTBEATS:
                changed = self.client.calculate_and_set_hb_timeouts(skip_if_not_ready=True,
                                                                    calc_initial=learns_startup(self._resumed()))
            else:
                names, out_of_section = self._sections_to_learn()
                if not names and not out_of_section:
                    return  # every rank decides alike from the same config: no collective to skip
                changed = self.client.calculate_and_set_section_timeouts(
                    selected_sections=names, calc_out_of_section=out_of_section, skip_if_not_ready=True)
        except RankMonitorClientError as exc:
            # Never fail training because timeouts could not be learned.
            self._warn(f"{self.name}: timeouts not updated {when}: {exc}")
            return
        if not changed:
            self._log.debug("%s: timeouts not calculated %s: not enough data yet", self.name, when)
            return
        current = self._current_timeouts()
        if current != self._reported:
            self._reported = current
            self._info(f"{self.name}: learned timeouts {when}: {self._described()}")
        self._write_state_file()

    def _described(self) -> str:
        """The timeouts in force, in the monitor's one-line form (:func:`ft_core.timeouts.describe_timeouts`)."""
        hb, sections = self.client.hb_timeouts, self.client.section_timeouts
        if hb is None or sections is None:  # restored before connecting: the state dict holds them
            loaded_hb, loaded_sections = timeouts_from_state_dict(self.client.state_dict())
            hb, sections = hb or loaded_hb, sections or loaded_sections
        return describe_timeouts(hb, sections)

    def _current_timeouts(self) -> dict[str, Any]:
        """The timeouts in force as the state dict holds them, without the job-life maxima (logged per change)."""
        current = self.client.state_dict()[CURRENT_TIMEOUTS_KEY]
        return {part: value for part, value in current.items() if part != JOB_LIFE_KEY}

    def _resumed(self) -> bool:
        """Whether this run counts as a resume for the start-up rule (:func:`~ft_core.learning_rules.learns_startup`)."""
        return not self.schedule.setup_needs_checkpoint_load or self._persistent_checkpoint_loaded

    def _sections_to_learn(self) -> tuple[list[str], bool]:
        timeouts = self.client.section_timeouts
        assert timeouts is not None, "learning runs only on a connected client"
        schedule = self.schedule
        resumed = self._resumed()
        setup_ok = learns_startup(resumed)
        step_ok = self.steps_completed >= schedule.step_needs_steps
        excluded = set()
        if not step_ok:
            excluded.add(Section.STEP)
        if not schedule.learn_checkpointing:
            excluded.add(Section.CHECKPOINTING)
        # The core's rules (ft_core.learning_rules), with what this run knows: "setup" only in a resume,
        # out of section only where the monitor watches it. The session decides; the client only applies.
        names = learnable_sections(timeouts.section, resumed=resumed, excluded=excluded)
        cfg = self.client.cfg
        watched = out_of_section_watched(cfg.rank_out_of_section_timeout if cfg is not None else None, timeouts)
        complete = not schedule.out_of_section_needs_complete_run \
            or (setup_ok and step_ok and self.saves_completed > 0)
        return names, watched and self._boundary_seen and complete

    def _write_state_file(self) -> None:
        if not self.state_file or not self.writer:
            return
        try:
            atomic_write_json(self.state_file, self.client.state_dict())
        except OSError as exc:
            self._warn(f"{self.name}: cannot write {self.state_file}: {exc}")

    def _rank_zero_log_info(self, message: str) -> None:
        # The same message comes from every rank: show it once per job.
        if int(os.environ.get("RANK", "0") or 0) == 0:
            self._log.info(message)
