"""The timeouts in force and their state-dict form: ``HeartbeatTimeouts``, ``SectionTimeouts``, ``JobLife``.

The state dict has NVRx's exact shape: ``{"current_timeouts": {}}`` until
something was calculated, ``"heartbeat"`` once heartbeat timeouts were, and
``"section"`` once a section or the out-of-section timeout was, and
``"job_life"`` (the job-life maxima, :class:`JobLife`; NVRx ignores keys it
does not know, and a state dict without it loads with no floor from history).
Every value crossing this boundary is validated (``InvalidTimeoutsError`` names
the key, the value and what is allowed): a string, NaN, infinity or a value <= 0
would otherwise crash the monitor, silently disable detection or kill at connect.

Learning them is :mod:`ft_core.timeouts_calc` (``TimeoutsCalc``, the merge
rule); the warm-up rule is :mod:`ft_core.warmup`; :func:`ft_core.config.timeouts_of` builds them from a
config (for the client and the monitor alike).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Optional, TypeVar

__all__ = [
    "describe_timeouts",
    "COMPILE_SECTION",
    "CURRENT_TIMEOUTS_KEY",
    "STEP_SECTION",
    "WARMUP_SECTION",
    "HeartbeatTimeouts",
    "InvalidTimeoutsError",
    "JOB_LIFE_KEY",
    "JobLife",
    "PhaseHistory",
    "SectionTimeouts",
    "apply_calculated",
    "job_life_from_state_dict",
    "timeouts_from_state_dict",
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
#: The start-up section: its timeout is a warm-up step's first fallback
#: (see :func:`ft_core.warmup.warmup_step_timeout`).
SETUP_SECTION = "setup"

_ALLOWED_TIMEOUT = "a positive finite number of seconds, or None (no timeout)"
_ALLOWED_CALCULATED = "a positive finite number of seconds (a calculated timeout cannot be None)"
_HEARTBEAT_KEYS = ("initial", "subsequent", "were_calculated")
_SECTION_KEYS = ("section", "out_of_section", "calculated_sections", "is_out_of_section_calculated")


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


_Timeouts = TypeVar("_Timeouts", "HeartbeatTimeouts", "SectionTimeouts")


def _from_mapping(cls: type[_Timeouts], data: Any, where: str, keys: Collection[str]) -> _Timeouts:
    """``cls`` from a mapping with some of ``keys``, validated; errors are keyed by ``where``, not the class."""
    values = _mapping(where, data, keys)
    try:
        return cls(**values)
    except InvalidTimeoutsError as exc:
        raise exc.moved(cls.__name__, where) from None


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
        return _from_mapping(cls, data, where, _HEARTBEAT_KEYS)


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
        return _from_mapping(cls, data, where, _SECTION_KEYS)


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
    updated by every calculation (:meth:`~ft_core.timeouts_calc.TimeoutsCalc._merged`), carried in the
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
