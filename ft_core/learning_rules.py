"""What a timeout calculation may learn: the rules the plain client and the integrations share.

A learned timeout replaces the one set at launch, so it must come from observations that
can stand for the phase over the job's life, or a healthy run is killed later:

* **Start-up** (the ``setup`` section, the ``initial`` heartbeat timeout) is learned only in
  a run that resumed from a checkpoint (:func:`learns_startup`): a fresh start loads
  nothing, a resume loads a checkpoint the first run did not, and the learned value must
  hold for the next restart's start-up.
* **Out of section** is learned only where the monitor watches it
  (:func:`out_of_section_watched`): learning must not switch on a timeout the launcher
  disabled.
* **Out of section, by default, never below the value set at launch**
  (:func:`floor_out_of_section`). The gaps between steps that a plain loop shows before
  its first evaluation, save or log upload are microseconds; learned from them, the
  out-of-section timeout would fall to ``min_calculated_timeout`` and kill the first
  evaluation. The client cannot know whether a loop has already run its longest
  out-of-section work (it sees no evaluation), so by default the launch value stays the
  floor; a learned value only raises it. A caller that knows its run has seen that work
  (the integrations after an epoch boundary or a save, or a user passing
  ``calc_out_of_section=True``) may lower it; so may a lower value set at launch.

The plain client applies these to the calls made with its defaults
(:meth:`~ft_core.client.RankMonitorClient.calculate_and_set_section_timeouts`); the
integrations apply the first two with what they know of the run
(:class:`~ft_integrations.session.FaultToleranceSession`) and pass their decision explicitly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import Optional

from ft_core.timeouts import SETUP_SECTION, SectionTimeouts

__all__ = [
    "SectionLearning",
    "floor_out_of_section",
    "learnable_sections",
    "learns_startup",
    "out_of_section_watched",
    "section_learning",
]


def learns_startup(resumed: bool) -> bool:
    """Whether start-up (``setup``, the ``initial`` heartbeat) may be learned: only in a resumed run."""
    return resumed


def learnable_sections(sections: Iterable[str], *, resumed: bool, excluded: Collection[str] = ()) -> list[str]:
    """The sections a calculation may learn, sorted: all but ``excluded``, and ``setup`` only when ``resumed``."""
    skip = set(excluded) if learns_startup(resumed) else {*excluded, SETUP_SECTION}
    return sorted(name for name in sections if name not in skip)


def out_of_section_watched(launch_value: Optional[float], current: SectionTimeouts) -> bool:
    """Whether the monitor watches the out-of-section time: set at launch, or already learned (and loaded)."""
    return launch_value is not None or current.is_out_of_section_calculated


def floor_out_of_section(learned: SectionTimeouts, launch_value: Optional[float]) -> SectionTimeouts:
    """``learned`` with its out-of-section timeout raised to ``launch_value`` where it fell below it."""
    if launch_value is None or learned.out_of_section is None or learned.out_of_section >= launch_value:
        return learned
    return dataclasses.replace(learned, out_of_section=launch_value)


@dataclasses.dataclass(frozen=True)
class SectionLearning:
    """What one section calculation learns: ``sections``, the out-of-section time, and its floor."""

    sections: list[str]
    out_of_section: bool
    #: The lowest out-of-section timeout it may set (:func:`floor_out_of_section`); None: no floor.
    out_of_section_floor: Optional[float]


def section_learning(tracked: Collection[str], selected: Optional[Collection[str]],
                     calc_out_of_section: Optional[bool], *, resumed: bool,
                     launch_value: Optional[float]) -> SectionLearning:
    """The plain client's decision: what the caller chose, and the rules above for what it left to the defaults.

    ``selected`` None: every ``tracked`` section, ``setup`` only when ``resumed``.
    ``calc_out_of_section`` None: learned only where a value was set at launch, and never below it.
    An explicit choice is the caller's (NVRx's meaning): it may learn ``setup`` on a fresh start
    or lower the out-of-section timeout.
    """
    sections = learnable_sections(tracked, resumed=resumed) if selected is None else sorted(set(selected))
    if calc_out_of_section is not None:
        return SectionLearning(sections, calc_out_of_section, None)
    return SectionLearning(sections, launch_value is not None, launch_value)
