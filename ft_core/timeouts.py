"""Timeouts: the values in force, their state-dict form, and learning them from observed intervals.

Learning (``TimeoutsCalc``) measures, in each rank, the delay to the first
heartbeat, the largest gap between heartbeats, the longest run of each section
and the longest time outside every section. ``synchronize`` takes the maximum
over all ranks with one all-reduce (when a process group exists), so every
rank computes identical timeouts: ``max observed * safety_factor``, merged
with earlier calculated values by taking the larger one, so a later, quieter
phase of training never shrinks a timeout that an earlier phase needed.

This module imports torch lazily, only for the all-reduce.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, Optional

__all__ = [
    "WARMUP_SECTION",
    "HeartbeatTimeouts",
    "SectionTimeouts",
    "TimeoutsCalc",
    "TimeoutsNotReadyError",
    "in_warmup",
    "timeouts_from_state_dict",
    "timeouts_state_dict",
]

_MISSING = -1.0

#: The section whose first occurrences are warm-up (compilation, allocator, first collectives).
WARMUP_SECTION = "step"


def in_warmup(step_number: int, num_warmup_iterations: int) -> bool:
    """The warm-up rule: the first ``num_warmup_iterations`` training steps are neither timed nor learned.

    ``step_number`` counts from 1 (the first step is 1). The one home of this rule: the
    monitor's deadlines, :class:`TimeoutsCalc` and the Megatron hooks' own warm-up all call it.

    >>> [in_warmup(n, 2) for n in (1, 2, 3)]
    [True, True, False]
    """
    return step_number <= num_warmup_iterations


class TimeoutsNotReadyError(RuntimeError):
    """Some rank has not observed enough intervals to calculate the requested timeouts."""


@dataclasses.dataclass
class HeartbeatTimeouts:
    initial: Optional[float] = None
    subsequent: Optional[float] = None
    were_calculated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], key: str = "heartbeat") -> HeartbeatTimeouts:
        """Validated: ``ValueError`` naming ``key.<field>``, the value and what is allowed."""
        data = _mapping(key, data)
        return cls(
            _timeout(f"{key}.initial", data.get("initial")),
            _timeout(f"{key}.subsequent", data.get("subsequent")),
            _flag(f"{key}.were_calculated", data.get("were_calculated", False)),
        )


@dataclasses.dataclass
class SectionTimeouts:
    section: dict[str, Optional[float]] = dataclasses.field(default_factory=dict)
    out_of_section: Optional[float] = None
    calculated_sections: list[str] = dataclasses.field(default_factory=list)
    is_out_of_section_calculated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "section": dict(self.section),
            "out_of_section": self.out_of_section,
            "calculated_sections": sorted(self.calculated_sections),
            "is_out_of_section_calculated": self.is_out_of_section_calculated,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], key: str = "section") -> SectionTimeouts:
        """Validated: ``ValueError`` naming ``key.<field>``, the value and what is allowed."""
        data = _mapping(key, data)
        section = {
            _name(f"{key}.section", name): _timeout(f"{key}.section.{name}", seconds)
            for name, seconds in _mapping(f"{key}.section", data.get("section", {})).items()
        }
        calculated = data.get("calculated_sections", [])
        if not isinstance(calculated, (list, tuple)):
            raise ValueError(f"{key}.calculated_sections: invalid value {_short(calculated)}; expected a list of "
                             "section names")
        for name in calculated:
            if _name(f"{key}.calculated_sections", name) not in section:
                # apply_calculated would turn the missing value into "no timeout".
                raise ValueError(f"{key}.calculated_sections: {name!r} has no value in {key}.section; "
                                 f"expected names among {sorted(section)}")
        return cls(
            section,
            _timeout(f"{key}.out_of_section", data.get("out_of_section")),
            list(calculated),
            _flag(f"{key}.is_out_of_section_calculated", data.get("is_out_of_section_calculated", False)),
        )


def timeouts_state_dict(hb: HeartbeatTimeouts, sections: SectionTimeouts) -> dict[str, Any]:
    """The NVRx-compatible ``{"current_timeouts": {...}}`` form, JSON-safe."""
    return {"current_timeouts": {"heartbeat": hb.to_dict(), "section": sections.to_dict()}}


def timeouts_from_state_dict(state: Mapping[str, Any]) -> tuple[HeartbeatTimeouts, SectionTimeouts]:
    """Parse and validate a state dict (it crosses a boundary: checkpoint, file or socket).

    NVRx leaves out ``heartbeat`` or ``section`` while nothing of that kind was calculated;
    a missing part reads as "nothing calculated". Raises ``ValueError`` naming the bad key,
    its value and what is allowed.
    """
    current = state.get("current_timeouts") if isinstance(state, Mapping) else None
    if not isinstance(current, Mapping):
        raise ValueError(
            "not a fault tolerance state dict (expected {'current_timeouts': {'heartbeat': ..., "
            f"'section': ...}}}}), got {_short(state)}"
        )
    return (HeartbeatTimeouts.from_dict(current.get("heartbeat", {}), "current_timeouts.heartbeat"),
            SectionTimeouts.from_dict(current.get("section", {}), "current_timeouts.section"))


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _mapping(key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: invalid value {_short(value)}; expected a mapping")
    return value


def _name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key}: invalid section name {_short(value)}; expected a non-empty string")
    return value


def _timeout(key: str, value: Any) -> Optional[float]:
    # JSON numbers only: unlike a config value, a state dict never holds "none" or "30" strings.
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{key}: invalid value {_short(value)}; expected a positive number of seconds or None")
    return value


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}: invalid value {_short(value)}; expected true or false")
    return value


def apply_calculated(
    hb: HeartbeatTimeouts, sections: SectionTimeouts, state: Mapping[str, Any]
) -> tuple[HeartbeatTimeouts, SectionTimeouts]:
    """Overlay the *calculated* values of ``state`` on ``hb``/``sections``.

    Values in a state dict that were never calculated are copies of an old
    config; applying them would silently undo a config change, so they are ignored.
    """
    loaded_hb, loaded_sec = timeouts_from_state_dict(state)
    if loaded_hb.were_calculated:
        hb = dataclasses.replace(loaded_hb)
    sections = dataclasses.replace(
        sections, section=dict(sections.section), calculated_sections=list(sections.calculated_sections)
    )
    for name in loaded_sec.calculated_sections:
        sections.section[name] = loaded_sec.section.get(name)
        if name not in sections.calculated_sections:
            sections.calculated_sections.append(name)
    if loaded_sec.is_out_of_section_calculated:
        sections.out_of_section = loaded_sec.out_of_section
        sections.is_out_of_section_calculated = True
    return hb, sections


def _all_reduce_max(values: list[float]) -> list[float]:
    """MAX over all ranks if a default process group exists; identity otherwise."""
    import sys

    dist_module = sys.modules.get("torch.distributed")
    if dist_module is None or not dist_module.is_available() or not dist_module.is_initialized():
        return values
    import torch

    device = torch.device("cpu")
    if dist_module.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist_module.all_reduce(tensor, op=dist_module.ReduceOp.MAX)
    return tensor.cpu().tolist()


def _synchronized(local: list[Optional[float]]) -> list[Optional[float]]:
    """All-reduce MAX of the values, ``None`` where *any* rank had no measurement.

    One collective carries both the values and "has a value" flags (negated, so
    MAX of the negated flag is minus the MIN over ranks).
    """
    n = len(local)
    vector = [_MISSING if v is None else float(v) for v in local]
    vector += [-0.0 if v is None else -1.0 for v in local]
    reduced = _all_reduce_max(vector)
    return [reduced[i] if reduced[n + i] == -1.0 else None for i in range(n)]


def _merge(previous: Optional[float], was_calculated: bool, new: float) -> float:
    return max(previous, new) if was_calculated and previous is not None else new


class TimeoutsCalc:
    """Observes one rank's intervals and turns them into timeouts agreed by all ranks.

    ``now`` arguments exist so tests can feed synthetic times.

    >>> calc = TimeoutsCalc(safety_factor=2.0, start_time=0.0)
    >>> calc.update_on_heartbeat(now=3.0); calc.update_on_heartbeat(now=4.0)
    >>> calc.calculate_hb_timeouts(HeartbeatTimeouts(60.0, 30.0))
    HeartbeatTimeouts(initial=6.0, subsequent=2.0, were_calculated=True)
    """

    def __init__(
        self,
        safety_factor: float = 5.0,
        start_time: Optional[float] = None,
        num_warmup_iterations: int = 0,
        warmup_section: str = WARMUP_SECTION,
        min_timeout: float = 0.0,
    ) -> None:
        self.safety_factor = safety_factor
        self.min_timeout = min_timeout
        self.start_time = time.monotonic() if start_time is None else start_time
        self.num_warmup_iterations = num_warmup_iterations
        self.warmup_section = warmup_section
        self.first_hb_delay: Optional[float] = None
        self.max_hb_interval: Optional[float] = None
        self.last_hb_time: Optional[float] = None
        self.section_max: dict[str, float] = {}
        self.max_out_of_section: Optional[float] = None
        self._open: dict[str, float] = {}
        self._out_of_section_since: Optional[float] = self.start_time
        self._warmup_sections_seen = 0

    # -- observations -----------------------------------------------------
    def update_on_heartbeat(self, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        if self.last_hb_time is None:
            self.first_hb_delay = now - self.start_time
        else:
            gap = now - self.last_hb_time
            self.max_hb_interval = gap if self.max_hb_interval is None else max(self.max_hb_interval, gap)
        self.last_hb_time = now

    def update_on_section_start(self, name: str, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        if not self._open and self._out_of_section_since is not None:
            gap = now - self._out_of_section_since
            self.max_out_of_section = gap if self.max_out_of_section is None else max(self.max_out_of_section, gap)
            self._out_of_section_since = None
        self._open[name] = now

    def update_on_section_end(self, name: str, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        started = self._open.pop(name, None)
        if started is not None and not self._in_warmup(name):
            duration = now - started
            self.section_max[name] = max(self.section_max.get(name, 0.0), duration)
        if not self._open:
            self._out_of_section_since = now

    def _in_warmup(self, name: str) -> bool:
        if name != self.warmup_section:
            return False
        self._warmup_sections_seen += 1
        return in_warmup(self._warmup_sections_seen, self.num_warmup_iterations)

    # -- calculation ------------------------------------------------------
    def _scaled(self, observed: float) -> float:
        return max(observed * self.safety_factor, self.min_timeout)

    def calculate_hb_timeouts(
        self, current: HeartbeatTimeouts, skip_if_not_ready: bool = False
    ) -> Optional[HeartbeatTimeouts]:
        """New heartbeat timeouts, or ``None`` if not ready and ``skip_if_not_ready``.

        Collective when a process group exists: every rank must call it.
        """
        initial, subsequent = _synchronized([self.first_hb_delay, self.max_hb_interval])
        if initial is None or subsequent is None:
            if skip_if_not_ready:
                return None
            raise TimeoutsNotReadyError(
                "cannot calculate heartbeat timeouts yet: every rank needs at least two heartbeats "
                "(pass skip_if_not_ready=True to skip instead)"
            )
        return HeartbeatTimeouts(
            initial=_merge(current.initial, current.were_calculated, self._scaled(initial)),
            subsequent=_merge(current.subsequent, current.were_calculated, self._scaled(subsequent)),
            were_calculated=True,
        )

    def calculate_section_timeouts(
        self,
        current: SectionTimeouts,
        section_names: Iterable[str],
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
    ) -> Optional[SectionTimeouts]:
        """New section timeouts for ``section_names`` (sorted for a rank-independent order).

        Sections that some rank has not completed yet keep their current value
        when ``skip_if_not_ready``; otherwise :class:`TimeoutsNotReadyError`.
        Returns ``None`` when nothing could be calculated. Collective.
        """
        names = sorted(set(section_names))
        local = [self.section_max.get(name) for name in names]
        local.append(self.max_out_of_section if calc_out_of_section else None)
        synced = _synchronized(local)
        missing = [n for n, v in zip(names, synced) if v is None]
        if calc_out_of_section and synced[-1] is None:
            missing.append("<out-of-section>")
        if missing and not skip_if_not_ready:
            raise TimeoutsNotReadyError(
                f"cannot calculate section timeouts yet: no completed interval on every rank for "
                f"{', '.join(missing)} (pass skip_if_not_ready=True to skip those)"
            )
        result = SectionTimeouts.from_dict(current.to_dict())
        updated = False
        for name, observed in zip(names, synced):
            if observed is None:
                continue
            was = name in result.calculated_sections
            result.section[name] = _merge(result.section.get(name), was, self._scaled(observed))
            if not was:
                result.calculated_sections.append(name)
            updated = True
        if calc_out_of_section and synced[-1] is not None:
            result.out_of_section = _merge(
                result.out_of_section, result.is_out_of_section_calculated, self._scaled(synced[-1])
            )
            result.is_out_of_section_calculated = True
            updated = True
        return result if updated else None
