"""Timeouts: the values in force, their state-dict form, the warm-up rule, and learning them.

Learning (``TimeoutsCalc``) measures, in each rank, the delay to the first
heartbeat, the largest gap between heartbeats, the longest run of each section
and the longest time outside every section (including the stretch still
running when the calculation is made). ``_synchronized`` takes the maximum
over all ranks with one all-reduce (when a process group exists), so every
rank computes identical timeouts; a rank without data for a phase contributes
nothing to it. A new value is ``max observed * safety_factor`` and is merged
with a previously *calculated* one as NVRx does, by an exponential average
(alpha 0.5), with two floors that make a merge unable to cause a false kill:

* ``min_calculated_timeout`` (a few fast steps must not yield a deadline a GC
  pause can miss), and
* the largest interval this run observed for that phase (max over ranks): a
  merge never yields a deadline the run has already needed once. The floor is
  the observation itself, not scaled: with a safety factor >= 2 the average is
  always above it, so it only binds for smaller factors or for values loaded
  after the interval was observed; and
* ``safety_factor ×`` the largest interval the *job* has observed for that
  phase over its whole life (:class:`JobLife`, carried in the state dict), so
  a resume that saw only short intervals cannot halve a timeout the job's
  earlier runs needed: learned timeouts never shrink below that floor across
  resumes, requeues and restarts.

The state dict has NVRx's exact shape: ``{"current_timeouts": {}}`` until
something was calculated, ``"heartbeat"`` once heartbeat timeouts were, and
``"section"`` once a section or the out-of-section timeout was, and
``"job_life"`` (the job-life maxima; NVRx ignores keys it does not know, and
a state dict without it loads with no floor from history). Every value
crossing this boundary is validated (``InvalidTimeoutsError`` names the key,
the value and what is allowed): a string, NaN, infinity or a value <= 0 would
otherwise crash the monitor, silently disable detection or kill at connect.

NVRx's own ``TimeoutsCalc`` API (``update_on_section_event`` with a
:class:`SectionAction`, ``can_get_*``, ``get_*`` with an optional ``current``,
``synchronize_all``, ``maybe_bump_oos_time``) is a thin layer over the same
observations and the same merge rule, for code written against NVRx.

This module imports torch lazily, only for the all-reduce.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
import time
from collections.abc import Collection, Container, Iterable, Mapping
from typing import Any, Optional

__all__ = [
    "describe_timeouts",
    "COMPILE_SECTION",
    "CURRENT_TIMEOUTS_KEY",
    "EMA_ALPHA",
    "STEP_SECTION",
    "WARMUP_SECTION",
    "HeartbeatTimeouts",
    "InvalidTimeoutsError",
    "JOB_LIFE_KEY",
    "JobLife",
    "PhaseHistory",
    "SectionAction",
    "SectionTimeouts",
    "TimeoutsCalc",
    "TimeoutsCalcError",
    "TimeoutsNotReadyError",
    "WarmupRule",
    "apply_calculated",
    "job_life_from_state_dict",
    "timeouts_from_state_dict",
    "warmup_step_timeout",
    "timeouts_state_dict",
]

#: The one key of a client state dict (NVRx's ``RankMonitorClient.CURRENT_TIMEOUTS_STATE_KEY``).
CURRENT_TIMEOUTS_KEY = "current_timeouts"
#: The key of ``current_timeouts`` that holds the job-life maxima (:class:`JobLife`).
JOB_LIFE_KEY = "job_life"
#: The training-step section that warm-up applies to.
STEP_SECTION = "step"
#: When configured, its timeout (and learned value) covers ``step`` sections during warm-up.
WARMUP_SECTION = "warmup"
#: The section the client opens while torch.compile compiles (see :mod:`ft_core.compile_phase`): timed by
#: ``compile_timeout``; while it is open every other deadline of the rank is paused.
COMPILE_SECTION = "compile"
#: The start-up section: its timeout is a warm-up step's first fallback (see :func:`warmup_step_timeout`).
SETUP_SECTION = "setup"
#: Weight of the new value when merging with a previously calculated one (NVRx's).
EMA_ALPHA = 0.5

_NO_DATA = -1.0  # intervals are >= 0: a negative maximum after the all-reduce means "no rank measured it"
_ALLOWED_TIMEOUT = "a positive finite number of seconds, or None (no timeout)"
_ALLOWED_CALCULATED = "a positive finite number of seconds (a calculated timeout cannot be None)"
_HEARTBEAT_KEYS = ("initial", "subsequent", "were_calculated")
_SECTION_KEYS = ("section", "out_of_section", "calculated_sections", "is_out_of_section_calculated")


class TimeoutsCalcError(Exception):
    """Misuse of :class:`TimeoutsCalc`, or not enough data for the timeouts asked for (NVRx's exception)."""


class TimeoutsNotReadyError(TimeoutsCalcError, RuntimeError):
    """No rank has observed enough intervals to calculate the requested timeouts."""


class SectionAction(enum.Enum):
    """A section event for :meth:`TimeoutsCalc.update_on_section_event` (NVRx's names)."""

    OPEN = enum.auto()
    CLOSE = enum.auto()
    CLOSE_ALL = enum.auto()


class InvalidTimeoutsError(ValueError):
    """A timeouts value is malformed; the message names the key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"{key}: invalid value {value!r}; allowed: {allowed}")
        self.key, self.value, self.allowed = key, value, allowed

    def moved(self, old_prefix: str, new_prefix: str) -> InvalidTimeoutsError:
        """The same error with its key under ``new_prefix`` (for values read from a state dict)."""
        key = new_prefix + self.key[len(old_prefix):] if self.key.startswith(old_prefix) else self.key
        return InvalidTimeoutsError(key, self.value, self.allowed)


def _timeout(key: str, value: Any, calculated: bool = False) -> Optional[float]:
    if value is None and not calculated:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value <= 0):
        raise InvalidTimeoutsError(key, value, _ALLOWED_CALCULATED if calculated else _ALLOWED_TIMEOUT)
    return float(value)


def _flag(key: str, value: Any) -> bool:
    # NVRx's HeartbeatTimeouts.were_calculated defaults to None.
    if value is None or isinstance(value, bool):
        return bool(value)
    raise InvalidTimeoutsError(key, value, "true or false")


def _mapping(key: str, data: Any, allowed_keys: Collection[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise InvalidTimeoutsError(key, data, f"a mapping with keys {', '.join(allowed_keys)}")
    unknown = sorted(map(str, set(data) - set(allowed_keys)))
    if unknown:
        raise InvalidTimeoutsError(key, unknown, f"only the keys {', '.join(allowed_keys)}")
    return data


@dataclasses.dataclass
class HeartbeatTimeouts:
    """Heartbeat timeouts (NVRx's data class): ``initial`` until the first heartbeat, then ``subsequent``.

    ``None`` disables a timeout. ``were_calculated`` says the values were
    learned, not copied from the config. Values are validated on construction.
    """

    initial: Optional[float] = None
    subsequent: Optional[float] = None
    were_calculated: bool = False

    def __post_init__(self) -> None:
        where = type(self).__name__
        self.were_calculated = _flag(f"{where}.were_calculated", self.were_calculated)
        # ``initial`` may stay None when calculated: a fresh start keeps the configured value
        # (see TimeoutsCalc.calculate_hb_timeouts), and None is a configured value.
        self.initial = _timeout(f"{where}.initial", self.initial)
        self.subsequent = _timeout(f"{where}.subsequent", self.subsequent, self.were_calculated)

    @property
    def are_valid(self) -> bool:
        """Both timeouts are set (NVRx's meaning: usable as a pair)."""
        return self.initial is not None and self.subsequent is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "heartbeat") -> HeartbeatTimeouts:
        """Read NVRx's ``dataclasses.asdict`` form; any subset of the keys; errors are keyed by ``where``."""
        values = _mapping(where, data, _HEARTBEAT_KEYS)
        try:
            return cls(**values)
        except InvalidTimeoutsError as exc:
            raise exc.moved(cls.__name__, where) from None


@dataclasses.dataclass
class SectionTimeouts:
    """Section timeouts (NVRx's data class). ``None`` disables a timeout.

    ``calculated_sections`` (a set) and ``is_out_of_section_calculated`` say
    which values were learned rather than copied from the config. Values are
    validated on construction: a calculated section needs a timeout in ``section``.
    """

    section: dict[str, Optional[float]] = dataclasses.field(default_factory=dict)
    out_of_section: Optional[float] = None
    calculated_sections: set[str] = dataclasses.field(default_factory=set)
    is_out_of_section_calculated: bool = False

    def __post_init__(self) -> None:
        where = type(self).__name__
        if not isinstance(self.section, Mapping):
            raise InvalidTimeoutsError(f"{where}.section", self.section, "a mapping of section name to timeout")
        section: dict[str, Optional[float]] = {}
        for name, value in self.section.items():
            if not isinstance(name, str) or not name:
                raise InvalidTimeoutsError(f"{where}.section", name, "section names are non-empty strings")
            section[name] = _timeout(f"{where}.section.{name}", value)
        self.section = section
        calculated = self.calculated_sections
        if isinstance(calculated, (str, bytes)) or not isinstance(calculated, Iterable):
            raise InvalidTimeoutsError(f"{where}.calculated_sections", calculated, "a list of section names")
        self.calculated_sections = set(calculated)
        for name in sorted(map(str, self.calculated_sections)):
            if name not in section:
                raise InvalidTimeoutsError(f"{where}.calculated_sections", name,
                                           f"names of sections that have a timeout in 'section': {sorted(section)}")
            _timeout(f"{where}.section.{name}", section[name], calculated=True)
        self.is_out_of_section_calculated = _flag(f"{where}.is_out_of_section_calculated",
                                                  self.is_out_of_section_calculated)
        self.out_of_section = _timeout(f"{where}.out_of_section", self.out_of_section,
                                       self.is_out_of_section_calculated)

    @property
    def are_valid(self) -> bool:
        """Every section and the out-of-section timeout are set (NVRx's meaning)."""
        return all(value is not None for value in self.section.values()) and self.out_of_section is not None

    @property
    def were_calculated(self) -> bool:
        """Every section *and* the out-of-section timeout were calculated (NVRx's meaning)."""
        return self.calculated_sections == set(self.section) and self.is_out_of_section_calculated

    def to_dict(self) -> dict[str, Any]:
        """NVRx's form: ``calculated_sections`` as a sorted list (JSON has no sets)."""
        return {
            "section": dict(self.section),
            "out_of_section": self.out_of_section,
            "calculated_sections": sorted(self.calculated_sections),
            "is_out_of_section_calculated": self.is_out_of_section_calculated,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "section") -> SectionTimeouts:
        """Read :meth:`to_dict`'s form; any subset of the keys; errors are keyed by ``where``."""
        values = _mapping(where, data, _SECTION_KEYS)
        try:
            return cls(**values)
        except InvalidTimeoutsError as exc:
            raise exc.moved(cls.__name__, where) from None


@dataclasses.dataclass(frozen=True)
class PhaseHistory:
    """One timed phase over the job's life: the largest interval observed, and how many runs observed it."""

    max: float
    runs: int


class JobLife:
    """Per timed phase, the largest interval the job observed over its whole life (see the module docstring).

    Phases are named ``heartbeat.initial`` (start-up: connect to the first
    heartbeat), ``heartbeat.subsequent`` (the heartbeat interval),
    ``section.<name>`` and ``out_of_section``. Held by the rank's client,
    updated by every calculation (:meth:`TimeoutsCalc._merged`), carried in the
    state dict under :data:`JOB_LIFE_KEY` and merged by maximum when loaded, so
    it only ever grows. ``runs`` counts the runs (connections) that contributed.

    >>> life = JobLife()
    >>> life.observe("section.step", 2.0, new_run=True); life.observe("section.step", 1.0, new_run=True)
    >>> life.floor("section.step"), life.to_dict()
    (2.0, {'section.step': {'max': 2.0, 'runs': 2}})
    """

    def __init__(self, phases: Optional[Mapping[str, PhaseHistory]] = None) -> None:
        self.phases: dict[str, PhaseHistory] = dict(phases or {})

    def __bool__(self) -> bool:
        return bool(self.phases)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobLife) and other.phases == self.phases

    def __repr__(self) -> str:
        return f"JobLife({self.phases!r})"

    def floor(self, phase: str) -> float:
        """The largest interval of ``phase`` the job observed (0 when it never did)."""
        record = self.phases.get(phase)
        return record.max if record is not None else 0.0

    def observe(self, phase: str, seconds: float, new_run: bool) -> None:
        """``seconds`` of ``phase`` were observed; ``new_run``: the first observation of it in this run."""
        record = self.phases.get(phase)
        if record is None:
            self.phases[phase] = PhaseHistory(seconds, 1)
        else:
            self.phases[phase] = PhaseHistory(max(record.max, seconds), record.runs + int(new_run))

    def merge(self, other: JobLife) -> None:
        """Take in ``other`` (e.g. a loaded checkpoint's) by maximum: nothing the job saw is forgotten."""
        for phase, theirs in other.phases.items():
            ours = self.phases.get(phase)
            self.phases[phase] = theirs if ours is None else PhaseHistory(max(ours.max, theirs.max),
                                                                          max(ours.runs, theirs.runs))

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {phase: {"max": record.max, "runs": record.runs} for phase, record in sorted(self.phases.items())}

    @classmethod
    def from_dict(cls, data: Any, where: str = JOB_LIFE_KEY) -> JobLife:
        """Read :meth:`to_dict`'s form, validated; errors are keyed by ``where``."""
        if not isinstance(data, Mapping):
            raise InvalidTimeoutsError(where, data, "a mapping of phase name to {'max': seconds, 'runs': count}")
        phases: dict[str, PhaseHistory] = {}
        for phase, record in data.items():
            key = f"{where}.{phase}"
            if not isinstance(phase, str) or not phase:
                raise InvalidTimeoutsError(where, phase, "phase names are non-empty strings")
            values = _mapping(key, record, ("max", "runs"))
            runs = values.get("runs")
            if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
                raise InvalidTimeoutsError(f"{key}.runs", runs, "an integer >= 1")
            seconds = _timeout(f"{key}.max", values.get("max"), calculated=True)
            assert seconds is not None
            phases[phase] = PhaseHistory(seconds, runs)
        return cls(phases)


def timeouts_state_dict(hb: Optional[HeartbeatTimeouts], sections: Optional[SectionTimeouts],
                        job_life: Optional[JobLife] = None) -> dict[str, Any]:
    """NVRx's ``{"current_timeouts": {...}}``: only the parts that were calculated; JSON-safe.

    ``job_life`` is added under :data:`JOB_LIFE_KEY` when it holds anything.
    """
    current: dict[str, Any] = {}
    if hb is not None and hb.were_calculated and hb.subsequent is not None:
        current["heartbeat"] = hb.to_dict()
    if sections is not None and (sections.calculated_sections or sections.is_out_of_section_calculated):
        current["section"] = sections.to_dict()
    if job_life:
        current[JOB_LIFE_KEY] = job_life.to_dict()
    return {CURRENT_TIMEOUTS_KEY: current}


def job_life_from_state_dict(state: Any) -> JobLife:
    """The job-life maxima of a state dict, validated; empty when it has none (NVRx's, older ones).

    Raises :class:`InvalidTimeoutsError` for a malformed one. Call after
    :func:`timeouts_from_state_dict`, which checks the state dict's shape.
    """
    current = state[CURRENT_TIMEOUTS_KEY]
    if JOB_LIFE_KEY not in current:
        return JobLife()
    return JobLife.from_dict(current[JOB_LIFE_KEY], f"{CURRENT_TIMEOUTS_KEY}.{JOB_LIFE_KEY}")


def timeouts_from_state_dict(state: Any) -> tuple[Optional[HeartbeatTimeouts], Optional[SectionTimeouts]]:
    """Parse and validate a state dict; ``None`` for a part it does not carry.

    Raises :class:`InvalidTimeoutsError` (a ``ValueError``). Keys of
    ``current_timeouts`` other than ``heartbeat`` and ``section`` are ignored, as NVRx does
    (:func:`job_life_from_state_dict` reads ``job_life``).
    """
    if not isinstance(state, Mapping) or CURRENT_TIMEOUTS_KEY not in state:
        shown = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
        raise InvalidTimeoutsError("state", shown, "a fault tolerance state dict, a mapping like "
                                   "{'current_timeouts': {'heartbeat': {...}, 'section': {...}}}")
    current = state[CURRENT_TIMEOUTS_KEY]
    if not isinstance(current, Mapping):
        raise InvalidTimeoutsError(CURRENT_TIMEOUTS_KEY, current, "a mapping with 'heartbeat' and/or 'section'")
    hb = sections = None
    if "heartbeat" in current:
        hb = HeartbeatTimeouts.from_dict(current["heartbeat"], f"{CURRENT_TIMEOUTS_KEY}.heartbeat")
    if "section" in current:
        sections = SectionTimeouts.from_dict(current["section"], f"{CURRENT_TIMEOUTS_KEY}.section")
    return hb, sections


def describe_timeouts(hb: Optional[HeartbeatTimeouts], sections: Optional[SectionTimeouts]) -> str:
    """The timeouts in force in one line for people, ``*`` marking the learned ones.

    ``step 1.06 s*, checkpointing 600 s, out of section off, heartbeat off first / off between (* learned)``:
    what the monitor logs at each change, and what the integrations log when they learn or restore.
    A part that is None (a state dict without it) is shown with its defaults.
    """
    hb = hb if hb is not None else HeartbeatTimeouts()
    sections = sections if sections is not None else SectionTimeouts({})

    def value(seconds: Optional[float], calculated: bool) -> str:
        return ("off" if seconds is None else f"{seconds:.3g} s") + ("*" if calculated else "")

    parts = [f"{name} {value(seconds, name in sections.calculated_sections)}"
             for name, seconds in sections.section.items()]
    parts.append(f"out of section {value(sections.out_of_section, sections.is_out_of_section_calculated)}")
    parts.append(f"heartbeat {value(hb.initial, hb.were_calculated)} first / "
                 f"{value(hb.subsequent, hb.were_calculated)} between")
    return ", ".join(parts) + " (* learned)"


def apply_calculated(
    hb: HeartbeatTimeouts, sections: SectionTimeouts, state: Mapping[str, Any]
) -> tuple[HeartbeatTimeouts, SectionTimeouts]:
    """Overlay the *calculated* values of ``state`` on ``hb``/``sections`` (new objects).

    Values in a state dict that were never calculated are copies of an old
    config; applying them would silently undo a config change, so they are ignored.
    """
    loaded_hb, loaded_sec = timeouts_from_state_dict(state)
    if loaded_hb is not None and loaded_hb.were_calculated:
        hb = dataclasses.replace(loaded_hb)
    merged = dataclasses.replace(sections, section=dict(sections.section),
                                 calculated_sections=set(sections.calculated_sections))
    if loaded_sec is not None:
        for name in loaded_sec.calculated_sections:
            merged.section[name] = loaded_sec.section[name]
        merged.calculated_sections |= loaded_sec.calculated_sections
        if loaded_sec.is_out_of_section_calculated:
            merged.out_of_section = loaded_sec.out_of_section
            merged.is_out_of_section_calculated = True
    return hb, merged


class WarmupRule:
    """Which section's timeout times a ``step`` section during warm-up (one connection = one cycle).

    The first ``num_warmup_iterations`` iterations of a cycle are warm-up.
    Iterations are those the rank reports with its sections (``set_iteration``,
    Megatron's iteration counter), counted from the first one reported with a
    ``step``; a rank that reports none counts its ``step`` sections. During
    warm-up a ``step`` is timed by :func:`warmup_step_timeout` (the ``warmup``
    section's timeout when one is set, else a generous one derived from the
    configuration: never by nothing, never by the learned ``step``). The
    monitor times with this rule and the client learns with it, so a warm-up
    step feeds the ``warmup`` value (when that section is tracked), never the
    ``step`` one.
    """

    def __init__(self, num_warmup_iterations: int, sections: Container[str]) -> None:
        self.num_warmup_iterations = num_warmup_iterations
        self._warmup_section = WARMUP_SECTION if WARMUP_SECTION in sections else None
        self._first_iteration: Optional[int] = None
        self._steps_started = 0

    @staticmethod
    def covers(index: int, num_warmup_iterations: int) -> bool:
        """Whether the iteration ``index`` (0 for a cycle's first) is a warm-up iteration.

        >>> [WarmupRule.covers(i, 2) for i in (0, 1, 2)]
        [True, True, False]
        """
        return index < num_warmup_iterations

    def section_opened(self, name: str, iteration: Optional[int]) -> Optional[str]:
        """Record that ``name`` opened; return the section whose timeout applies, or None (untimed)."""
        if name != STEP_SECTION:
            return name
        index = self._steps_started
        self._steps_started += 1
        if iteration is not None:
            if self._first_iteration is None:
                self._first_iteration = iteration
            index = iteration - self._first_iteration
        return self._warmup_section if self.covers(index, self.num_warmup_iterations) else name


def warmup_step_timeout(sections: SectionTimeouts, initial_heartbeat: Optional[float],
                        configured_step: Optional[float]) -> Optional[float]:
    """The timeout of a ``step`` during warm-up: generous, but finite whenever anything is configured.

    A warm-up step may compile, allocate and start data loaders, so the
    (learned) ``step`` timeout would kill it; but while a section is open no
    other section-mode timeout runs, so an untimed warm-up step that hangs
    (the first all-reduce on a misconfigured network) would hang the job until
    the scheduler kills it. The first of these that is set applies:

    1. the ``warmup`` section's timeout (configured or learned, as in NVRx);
    2. the larger of the ``setup`` and the out-of-section timeouts (what the
       job allows for start-up and for untracked work; Megatron-LM's own warm-up
       runs out of section);
    3. ``initial_heartbeat``: the start-up budget, which warm-up is part of;
    4. ``configured_step``: the ``step`` timeout as *configured* (a learned one
       says nothing about compilation).

    None only when none of them is set: then nothing in section mode is timed at all.

    >>> warmup_step_timeout(SectionTimeouts({"step": 2.0}, 5.0), None, 2.0)
    5.0
    """
    warmup = sections.section.get(WARMUP_SECTION)
    if warmup is not None:
        return warmup
    budgets = [value for value in (sections.section.get(SETUP_SECTION), sections.out_of_section) if value is not None]
    if budgets:
        return max(budgets)
    return initial_heartbeat if initial_heartbeat is not None else configured_step


def _process_group_exists() -> bool:
    import sys

    dist_module = sys.modules.get("torch.distributed")
    return dist_module is not None and dist_module.is_available() and dist_module.is_initialized()


def _all_reduce_max(values: list[float]) -> list[float]:
    """MAX over all ranks if a default process group exists; identity otherwise."""
    import sys

    if not _process_group_exists():
        return values
    dist_module = sys.modules["torch.distributed"]
    import torch

    device = torch.device("cpu")
    if dist_module.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist_module.all_reduce(tensor, op=dist_module.ReduceOp.MAX)
    return tensor.cpu().tolist()


def _synchronized(local: list[Optional[float]]) -> list[Optional[float]]:
    """All-reduce MAX of the values; ``None`` only where *no* rank had a measurement."""
    reduced = _all_reduce_max([_NO_DATA if value is None else float(value) for value in local])
    return [None if value < 0 else value for value in reduced]


def _ema_merge(new: float, previous: Optional[float], previous_calculated: bool) -> float:
    """NVRx's merge of a new timeout with the one in force: their average if that one was calculated too."""
    if previous_calculated and previous is not None:
        return EMA_ALPHA * new + (1.0 - EMA_ALPHA) * previous
    return new


def _measured(value: Optional[float]) -> bool:
    return value is not None and value > 0


class TimeoutsCalc:
    """Observes one rank's intervals and turns them into timeouts agreed by all ranks.

    ``now`` and NVRx's ``hb_time``/``event_time``/``curr_time`` arguments exist
    so tests can feed synthetic times. ``sections`` are the tracked section
    names (they decide whether warm-up steps are learned as ``warmup``, see
    :class:`WarmupRule`, and are the sections NVRx's API accepts).

    >>> calc = TimeoutsCalc(safety_factor=2.0, start_time=0.0)
    >>> calc.update_on_heartbeat(hb_time=3.0); calc.update_on_heartbeat(hb_time=4.0)
    >>> calc.calculate_hb_timeouts(HeartbeatTimeouts(60.0, 30.0))
    HeartbeatTimeouts(initial=6.0, subsequent=2.0, were_calculated=True)

    NVRx's API reads the observations of this rank, or of all ranks after
    :meth:`synchronize_all`, and merges with ``current`` by the same rule:

    >>> calc = TimeoutsCalc(sections=["step"], start_time=0.0, safety_factor=2.0)
    >>> calc.update_on_section_event("step", SectionAction.OPEN, event_time=1.0)
    >>> calc.update_on_section_event("step", SectionAction.CLOSE, event_time=4.0)
    >>> calc.get_section_timeouts().section, calc.get_section_timeouts().out_of_section
    ({'step': 6.0}, 2.0)
    """

    def __init__(
        self,
        safety_factor: float = 5.0,
        start_time: Optional[float] = None,
        num_warmup_iterations: int = 0,
        min_timeout: float = 0.0,
        sections: Optional[Iterable[str]] = (),
        job_life: Optional[JobLife] = None,
    ) -> None:
        self.safety_factor = safety_factor
        #: The job-life maxima: floors every calculation, and is updated by it (in place: the client's).
        self.job_life = job_life if job_life is not None else JobLife()
        self._contributed: set[str] = set()  # phases this run (this calculator) already added to job_life
        self.min_timeout = min_timeout
        self.start_time = time.monotonic() if start_time is None else start_time
        #: The sections NVRx's API accepts, in a rank-independent order (the all-reduce's): as given in a
        #: list or tuple, sorted from a set (whose order varies from process to process).
        given = sections or ()
        self.sections: tuple[str, ...] = tuple(dict.fromkeys(given if isinstance(given, (list, tuple))
                                                             else sorted(given)))
        self.warmup = WarmupRule(num_warmup_iterations, self.sections)
        self.first_hb_delay: Optional[float] = None
        self.max_hb_interval: Optional[float] = None
        self.last_hb_time: Optional[float] = None
        self.section_max: dict[str, float] = {}
        self.max_out_of_section: Optional[float] = None
        self._open: dict[str, tuple[float, Optional[str]]] = {}  # name -> (started, learned as)
        self._out_of_section_since: Optional[float] = self.start_time

    # -- observations -----------------------------------------------------
    def update_on_heartbeat(self, hb_time: Optional[float] = None) -> None:
        now = time.monotonic() if hb_time is None else hb_time
        if self.last_hb_time is None:
            self.first_hb_delay = now - self.start_time
        else:
            gap = now - self.last_hb_time
            self.max_hb_interval = gap if self.max_hb_interval is None else max(self.max_hb_interval, gap)
        self.last_hb_time = now

    def update_on_section_start(self, name: str, now: Optional[float] = None,
                                iteration: Optional[int] = None) -> None:
        now = time.monotonic() if now is None else now
        self._observe_out_of_section(now)
        self._out_of_section_since = None
        self._open[name] = (now, self.warmup.section_opened(name, iteration))

    def update_on_section_end(self, name: str, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        started, learned_as = self._open.pop(name, (None, None))
        if name == COMPILE_SECTION and started is not None:
            # Compilation is its own phase: the sections it ran inside do not learn its time.
            self._open = {other: (since + now - started, learned) for other, (since, learned) in self._open.items()}
        if started is not None and learned_as is not None:
            self.section_max[learned_as] = max(self.section_max.get(learned_as, 0.0), now - started)
        if not self._open:
            self._out_of_section_since = now

    def _observe_out_of_section(self, now: float) -> None:
        """Count the out-of-section stretch up to ``now`` (it may still be running)."""
        if not self._open and self._out_of_section_since is not None:
            gap = now - self._out_of_section_since
            self.max_out_of_section = gap if self.max_out_of_section is None else max(self.max_out_of_section, gap)

    # -- calculation ------------------------------------------------------
    def _merged(self, phase: str, previous: Optional[float], was_calculated: bool, observed: float) -> float:
        """The merge rule (see the module docstring): NVRx's average, floored so it cannot kill falsely.

        Records ``observed`` in :attr:`job_life` under ``phase`` first, so the floor holds it too.
        """
        self.job_life.observe(phase, observed, new_run=phase not in self._contributed)
        self._contributed.add(phase)
        new = _ema_merge(max(observed * self.safety_factor, self.min_timeout), previous, was_calculated)
        return max(new, observed, self.min_timeout, self.safety_factor * self.job_life.floor(phase))

    def calculate_hb_timeouts(
        self, current: HeartbeatTimeouts, skip_if_not_ready: bool = False, calc_initial: bool = True
    ) -> Optional[HeartbeatTimeouts]:
        """New heartbeat timeouts, or ``None`` if not ready and ``skip_if_not_ready``.

        With ``calc_initial=False`` the ``initial`` timeout keeps its current value: the
        delay to the first heartbeat of a fresh start says nothing about a resume's, which
        also loads a checkpoint. Collective when a process group exists: every rank must call it.
        """
        initial, subsequent = _synchronized([self.first_hb_delay, self.max_hb_interval])
        if initial is None or subsequent is None:
            if skip_if_not_ready:
                return None
            raise TimeoutsNotReadyError(
                "cannot calculate heartbeat timeouts yet: no rank has sent two heartbeats "
                "(pass skip_if_not_ready=True to skip instead)"
            )
        return self._merged_hb(current, initial if calc_initial else None, subsequent)

    def _merged_hb(self, current: HeartbeatTimeouts, initial: Optional[float], subsequent: float) -> HeartbeatTimeouts:
        """``current`` merged with the observed first-heartbeat delay (None: keep it) and longest gap."""
        return HeartbeatTimeouts(
            initial=current.initial if initial is None else self._merged(
                "heartbeat.initial", current.initial, current.were_calculated, initial),
            subsequent=self._merged("heartbeat.subsequent", current.subsequent, current.were_calculated, subsequent),
            were_calculated=True,
        )

    def calculate_section_timeouts(
        self,
        current: SectionTimeouts,
        section_names: Iterable[str],
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
        now: Optional[float] = None,
    ) -> Optional[SectionTimeouts]:
        """New section timeouts for ``section_names`` (sorted for a rank-independent order).

        Sections that no rank has completed yet keep their current value when
        ``skip_if_not_ready``; otherwise :class:`TimeoutsNotReadyError`.
        Returns ``None`` when nothing could be calculated. Collective.
        """
        self._observe_out_of_section(time.monotonic() if now is None else now)
        names = sorted(set(section_names))
        local = [self.section_max.get(name) for name in names]
        local.append(self.max_out_of_section if calc_out_of_section else None)
        synced = _synchronized(local)
        missing = [n for n, v in zip(names, synced) if v is None]
        if calc_out_of_section and synced[-1] is None:
            missing.append("<out-of-section>")
        if missing and not skip_if_not_ready:
            raise TimeoutsNotReadyError(
                f"cannot calculate section timeouts yet: no rank has completed {', '.join(missing)} "
                "(pass skip_if_not_ready=True to skip those)"
            )
        section = dict(current.section)
        calculated = set(current.calculated_sections)
        for name, observed in zip(names, synced):
            if observed is not None:
                section[name] = self._merged(f"section.{name}", section.get(name), name in calculated, observed)
                calculated.add(name)
        out_of_section, oos_calculated = current.out_of_section, current.is_out_of_section_calculated
        if calc_out_of_section and synced[-1] is not None:
            out_of_section = self._merged("out_of_section", out_of_section, oos_calculated, synced[-1])
            oos_calculated = True
        if len(missing) == len(names) + int(calc_out_of_section):
            return None
        return SectionTimeouts(section, out_of_section, calculated, oos_calculated)

    # -- NVRx's API -----------------------------------------------------------
    def update_on_section_event(self, section: Optional[str], action: SectionAction,
                                event_time: Optional[float] = None) -> None:
        """Record that ``section`` opened or closed, or (``CLOSE_ALL``, ``section`` None) every open one closed.

        Raises:
            TimeoutsCalcError: for a section not given to the constructor, opening an open
                section or closing one that is not open (as NVRx).
        """
        if section is not None and section not in self.sections:
            raise TimeoutsCalcError(f"unknown section {section!r}: the sections are {list(self.sections)} "
                                    "(the keys of rank_section_timeouts)")
        now = time.monotonic() if event_time is None else event_time
        if action is SectionAction.OPEN:
            if section is None or section in self._open:
                raise TimeoutsCalcError(f"section {section!r} is already open; close it before opening it again")
            self.update_on_section_start(section, now)
        elif action is SectionAction.CLOSE:
            if section is None or section not in self._open:
                raise TimeoutsCalcError(f"section {section!r} is not open")
            self.update_on_section_end(section, now)
        else:
            for name in list(self._open):
                self.update_on_section_end(name, now)

    @property
    def is_out_of_section(self) -> bool:
        return not self._open

    def maybe_bump_oos_time(self, curr_time: Optional[float] = None) -> None:
        """Count the out-of-section stretch still running up to ``curr_time`` (NVRx's name)."""
        self._observe_out_of_section(time.monotonic() if curr_time is None else curr_time)

    def reset_start_time(self) -> None:
        """Measure the delay to the first heartbeat from now."""
        self.start_time = time.monotonic()

    def synchronize_all(self) -> None:
        """Replace this rank's observations by the maximum over all ranks (a collective, as NVRx's).

        A phase no rank observed stays unobserved. Raises :class:`TimeoutsCalcError`
        without an initialized default process group.
        """
        if not _process_group_exists():
            raise TimeoutsCalcError("synchronize_all() needs an initialized torch.distributed process group")
        synced = _synchronized([self.first_hb_delay, self.max_hb_interval, self.max_out_of_section,
                                *(self.section_max.get(name) for name in self.sections)])
        self.first_hb_delay, self.max_hb_interval, self.max_out_of_section = synced[:3]
        for name, value in zip(self.sections, synced[3:]):
            if value is not None:
                self.section_max[name] = value

    def can_get_hb_timeouts(self) -> bool:
        """Whether the first heartbeat and a gap between two were observed."""
        return _measured(self.first_hb_delay) and _measured(self.max_hb_interval)

    def get_hb_timeouts(self, current: Optional[HeartbeatTimeouts] = None) -> HeartbeatTimeouts:
        """Heartbeat timeouts from the observations, merged with ``current`` if it was calculated.

        Raises:
            TimeoutsCalcError: not enough data (:meth:`can_get_hb_timeouts` is False).
        """
        if not self.can_get_hb_timeouts():
            raise TimeoutsNotReadyError("not enough data for heartbeat timeouts: the first heartbeat and a "
                                        "second one are needed")
        assert self.first_hb_delay is not None and self.max_hb_interval is not None
        return self._merged_hb(current if current is not None else HeartbeatTimeouts(), self.first_hb_delay,
                               self.max_hb_interval)

    def _selected(self, selected_sections: Optional[Collection[str]]) -> Collection[str]:
        unknown = sorted(set(selected_sections or ()) - set(self.sections))
        if unknown:
            raise TimeoutsCalcError(f"unknown section(s) {unknown}: the sections are {list(self.sections)}")
        return self.sections if selected_sections is None else selected_sections

    def can_get_section_timeouts(self, selected_sections: Optional[Collection[str]] = None,
                                 calc_out_of_section: bool = True) -> bool:
        """Whether every selected section (all if none or empty are given, as NVRx) and, if asked, the
        time out of sections were observed."""
        selected = self._selected(selected_sections or None)
        return (all(_measured(self.section_max.get(name)) for name in selected)
                and (not calc_out_of_section or _measured(self.max_out_of_section)))

    def get_section_timeouts(self, selected_sections: Optional[Collection[str]] = None,
                             calc_out_of_section: bool = True,
                             current: Optional[SectionTimeouts] = None) -> SectionTimeouts:
        """Timeouts of the selected sections (all by default) and out of sections, merged with ``current``.

        Every section given to the constructor is in the result: one not selected keeps
        its value in ``current`` (None without one). Unlike :meth:`calculate_section_timeouts`,
        the out-of-section stretch still running is not counted (see :meth:`maybe_bump_oos_time`).

        Raises:
            TimeoutsCalcError: not enough data (:meth:`can_get_section_timeouts` is False).
        """
        if not self.can_get_section_timeouts(selected_sections, calc_out_of_section):
            raise TimeoutsNotReadyError("not enough data for the section timeouts asked for")
        selected = self._selected(selected_sections)
        current = current if current is not None else SectionTimeouts(dict.fromkeys(self.sections))
        section = {name: current.section.get(name) for name in self.sections}
        calculated = set(current.calculated_sections) | set(selected)
        for name in selected:
            section[name] = self._merged(f"section.{name}", section[name], name in current.calculated_sections,
                                         self.section_max[name])
        out_of_section, oos_calculated = current.out_of_section, current.is_out_of_section_calculated
        if calc_out_of_section:
            assert self.max_out_of_section is not None
            out_of_section = self._merged("out_of_section", out_of_section, oos_calculated, self.max_out_of_section)
            oos_calculated = True
        return SectionTimeouts(section, out_of_section, calculated, oos_calculated)

    @staticmethod
    def _get_merged_section_timeouts(new: SectionTimeouts, current: Optional[SectionTimeouts]) -> SectionTimeouts:
        """NVRx's merge of two section timeouts: a value calculated in both is averaged, one calculated in
        only one of them wins, else ``current``'s stays."""
        if current is None:
            return new

        def merge(new_value: Optional[float], new_calculated: bool, value: Optional[float],
                  calculated: bool) -> Optional[float]:
            if not new_calculated or new_value is None:
                return value
            return _ema_merge(new_value, value, calculated)

        section = {name: merge(value, name in new.calculated_sections, current.section.get(name),
                               name in current.calculated_sections) for name, value in new.section.items()}
        return SectionTimeouts(
            section,
            merge(new.out_of_section, new.is_out_of_section_calculated, current.out_of_section,
                  current.is_out_of_section_calculated),
            set(current.calculated_sections) | set(new.calculated_sections),
            current.is_out_of_section_calculated or new.is_out_of_section_calculated)
