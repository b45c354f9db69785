"""Learning timeouts: ``TimeoutsCalc`` observes one rank's intervals and turns them into agreed timeouts.

It measures, in each rank, the delay to the first heartbeat, the largest gap
between heartbeats, the longest run of each section and the longest time
outside every section (including the stretch still running when the
calculation is made). ``_synchronized`` takes the maximum over all ranks with
one all-reduce (:func:`ft_core.all_ranks.all_ranks_max`), so every rank computes identical
timeouts; a rank without data for a phase contributes nothing to it. A new
value is ``max observed * safety_factor`` and is merged with a previously
*calculated* one as NVRx does, by an exponential average (alpha 0.5), with
floors that make a merge unable to cause a false kill:

* ``min_calculated_timeout`` (a few fast steps must not yield a deadline a GC
  pause can miss), and
* the largest interval this run observed for that phase (max over ranks): a
  merge never yields a deadline the run has already needed once. The floor is
  the observation itself, not scaled: with a safety factor >= 2 the average is
  always above it, so it only binds for smaller factors or for values loaded
  after the interval was observed; and
* ``safety_factor ×`` the largest interval the *job* has observed for that
  phase over its whole life (:class:`~ft_core.timeouts.JobLife`, carried in the
  state dict), so a resume that saw only short intervals cannot halve a timeout
  the job's earlier runs needed: learned timeouts never shrink below that floor
  across resumes, requeues and restarts.

NVRx's own ``TimeoutsCalc`` API (``update_on_section_event`` with a
:class:`SectionAction`, ``can_get_*``, ``get_*`` with an optional ``current``,
``synchronize_all``, ``maybe_bump_oos_time``) is a thin layer over the same
observations and the same merge rule, for code written against NVRx
(``nvidia_resiliency_ext.fault_tolerance.timeouts_calc`` in the import alias).

This module imports torch lazily, only for the all-reduce (in :mod:`ft_core.all_ranks`).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Collection, Iterable
from typing import Optional

from ft_core.all_ranks import all_ranks_max, process_group_exists
from ft_core.timeouts import COMPILE_SECTION, HeartbeatTimeouts, JobLife, SectionTimeouts
from ft_core.warmup import WarmupRule

__all__ = [
    "EMA_ALPHA",
    "SectionAction",
    "TimeoutsCalc",
    "TimeoutsCalcError",
    "TimeoutsNotReadyError",
]

#: Weight of the new value when merging with a previously calculated one (NVRx's).
EMA_ALPHA = 0.5

_NO_DATA = -1.0  # intervals are >= 0: a negative maximum after the all-reduce means "no rank measured it"


class TimeoutsCalcError(Exception):
    """Misuse of :class:`TimeoutsCalc`, or not enough data for the timeouts asked for (NVRx's exception)."""


class TimeoutsNotReadyError(TimeoutsCalcError, RuntimeError):
    """No rank has observed enough intervals to calculate the requested timeouts."""


class SectionAction(enum.Enum):
    """A section event for :meth:`TimeoutsCalc.update_on_section_event` (NVRx's names)."""

    OPEN = enum.auto()
    CLOSE = enum.auto()
    CLOSE_ALL = enum.auto()


def _synchronized(local: list[Optional[float]]) -> list[Optional[float]]:
    """All-reduce MAX of the values; ``None`` only where *no* rank had a measurement."""
    reduced = all_ranks_max([_NO_DATA if value is None else float(value) for value in local])
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
        if not process_group_exists():
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
