"""The warm-up rule: which timeout times a ``step`` section in the first iterations of a cycle.

The monitor times with it and the client learns with it (:class:`WarmupRule`);
:func:`warmup_step_timeout` is the generous but finite timeout of a warm-up step.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Optional

from ft_core.timeouts import SETUP_SECTION, STEP_SECTION, WARMUP_SECTION, SectionTimeouts

__all__ = ["WarmupRule", "warmup_step_timeout"]


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
