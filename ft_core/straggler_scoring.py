"""Straggler detection: rolling windows of rank-local phase durations, and job-wide scores.

Step durations cannot single out a straggler in synchronous data-parallel
training: the fast ranks wait for the slow one inside the gradient all-reduce,
so every rank's ``step`` lasts as long as the slowest one. Ranks are therefore
scored on *phases* that contain no collective (the data fetch, the forward
pass; see :meth:`ft_core.client.RankMonitorClient.timed`).

Where each piece runs:

* the node monitor keeps a :class:`PhaseWindows` (one rolling window per rank
  and phase, O(1) work per sample) and, once per report interval, emits the
  median of each window that got new samples (:meth:`PhaseWindows.report`);
* one launcher gathers the medians of every node and feeds them to a
  :class:`StragglerJudge`, which computes the scores (:func:`score_phases`)
  and names the stragglers.

Scores (1.0 is typical, lower is slower):

* *relative* = median over all ranks of their window medians / this rank's
  median, per phase;
* *individual* = this rank's best window median so far / its current median.

Phases too short to judge are not scored: a phase whose job-wide median is
below ``max(min_phase_seconds, MIN_PHASE_STEP_FRACTION x the step)`` -- the
step being the job-wide median of the ``step`` section's durations, which the
monitor keeps in the same windows under :data:`STEP_PHASE` when ranks mark
that section -- gets no score: at that scale work that one rank does alone
(rank 0's progress bar, a log line) outweighs any difference in speed, and it
costs the job little. The ``step`` itself is only this reference, never scored
(every rank waits for the slowest inside it).

Only the relative score judges: a job-wide slowdown (a slow file system, a
busy data source, a loaded host) lowers every rank's individual score and is
not a straggler -- restarting would not help. The individual score is
reported alongside. A rank whose relative score stays below the threshold for
``consecutive`` reports in a row is a straggler, reported once until it
recovers.

Example::

    >>> judge = StragglerJudge(threshold=0.75, consecutive=2)
    >>> medians = [PhaseMedian(0, "forward", 0.10, 20), PhaseMedian(1, "forward", 0.10, 20),
    ...            PhaseMedian(2, "forward", 0.16, 20)]
    >>> judge.judge(medians).stragglers
    []
    >>> [(s.rank, s.phase, round(s.relative, 3)) for s in judge.judge(medians).stragglers]
    [(2, 'forward', 0.625)]

This module must not import torch: the monitor imports it.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
import statistics
from collections.abc import Iterable
from typing import Optional

from ft_core.timeouts import STEP_SECTION

__all__ = [
    "DEFAULT_MIN_PHASE_SECONDS",
    "DEFAULT_WINDOW",
    "MAX_PHASE_NAME",
    "MAX_PHASES_PER_RANK",
    "MIN_PHASE_STEP_FRACTION",
    "Phase",
    "PhaseMedian",
    "PhaseScore",
    "PhaseWindows",
    "StragglerAction",
    "StragglerJudge",
    "STEP_PHASE",
    "StragglerReport",
    "check_phase_sample",
    "score_phases",
]

#: Samples kept per rank and phase.
DEFAULT_WINDOW = 64
#: Phases whose job-wide median is below this are not scored (``straggler_min_phase_seconds``).
DEFAULT_MIN_PHASE_SECONDS = 0.001
#: ... and below this fraction of the job-wide median of the ``step`` section, when ranks mark it.
MIN_PHASE_STEP_FRACTION = 0.05
#: The phase under which the monitor keeps each rank's ``step`` section durations: the reference of
#: the relative floor, never scored itself.
STEP_PHASE = STEP_SECTION
#: Distinct phases the monitor keeps per rank; more are ignored (a hostile or buggy client cannot grow
#: the monitor without bound).
MAX_PHASES_PER_RANK = 16
#: Longest phase name accepted.
MAX_PHASE_NAME = 64
#: Durations below this count as this much: a phase of 0 s would give an infinite score.
_FLOOR = 1e-6


class Phase(str, enum.Enum):
    """The phases the integrations mark (any other name works with ``client.timed``)."""

    #: From the end of the previous batch to the start of this one (Lightning: fetching the batch).
    DATA = "data"
    #: From the start of the batch to the backward pass (Lightning: ``training_step``).
    FORWARD = "forward"


class StragglerAction(str, enum.Enum):
    """What the launchers do about a straggler (``straggler_action``)."""

    #: A ``straggler`` event and one log line on every node; training goes on.
    REPORT = "report"
    #: Also end the cycle and restart every worker, through the same decision as a fault.
    RESTART = "restart"
    #: Also exclude the straggler's node (as its rank asking ``ExcludeThisNode`` would).
    EXCLUDE_NODE = "exclude-node"


def check_phase_sample(name: object, seconds: object) -> Optional[str]:
    """Why a phase sample is invalid, or None: a name of 1..MAX_PHASE_NAME characters and a finite duration >= 0."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_PHASE_NAME:
        return f"phase name {name!r}: a non-empty string of at most {MAX_PHASE_NAME} characters is allowed"
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        return f"phase {name!r} duration {seconds!r}: a finite number of seconds >= 0 is allowed"
    return None


@dataclasses.dataclass(frozen=True)
class PhaseMedian:
    """The median of one rank's window for one phase, over ``samples`` samples."""

    rank: int
    phase: str
    median: float
    samples: int


class _Window:
    __slots__ = ("samples", "new")

    def __init__(self, size: int) -> None:
        self.samples: collections.deque[float] = collections.deque(maxlen=size)
        #: Samples added since the last report.
        self.new = 0


class PhaseWindows:
    """One rolling window of durations per (rank, phase): what the node monitor keeps.

    :meth:`add` is O(1) (a dict lookup and a bounded append); medians are
    computed only by :meth:`report`, once per report interval.
    """

    def __init__(self, size: int = DEFAULT_WINDOW) -> None:
        if size < 1:
            raise ValueError(f"size: {size!r}; allowed: an integer >= 1")
        self.size = size
        self._windows: dict[int, dict[str, _Window]] = {}

    def add(self, rank: int, phase: str, seconds: float) -> bool:
        """Record one duration; False (nothing kept) when the rank already has MAX_PHASES_PER_RANK phases."""
        phases = self._windows.get(rank)
        if phases is None:
            phases = self._windows[rank] = {}
        window = phases.get(phase)
        if window is None:
            if len(phases) >= MAX_PHASES_PER_RANK:
                return False
            window = phases[phase] = _Window(self.size)
        window.samples.append(seconds)
        window.new += 1
        return True

    def forget(self, rank: int) -> None:
        """Drop a rank's windows (it disconnected: the next cycle's rank starts afresh)."""
        self._windows.pop(rank, None)

    def has_new(self) -> bool:
        return any(w.new for phases in self._windows.values() for w in phases.values())

    def report(self) -> list[PhaseMedian]:
        """The median of every window that got samples since the last report (others are stale: a rank that
        stopped marking phases -- finished, hung, between cycles -- is not scored on old data)."""
        medians = []
        for rank, phases in sorted(self._windows.items()):
            for phase, window in sorted(phases.items()):
                if window.new:
                    medians.append(PhaseMedian(rank, phase, statistics.median(window.samples), len(window.samples)))
                    window.new = 0
        return medians


@dataclasses.dataclass(frozen=True)
class PhaseScore:
    """One rank's scores for one phase in one report."""

    rank: int
    phase: str
    median: float
    samples: int
    #: Median over all ranks of their medians / this rank's median.
    relative: float
    #: This rank's best median so far / its current median.
    individual: float


def score_phases(medians: Iterable[PhaseMedian], best: Optional[dict[tuple[int, str], float]] = None
                 ) -> list[PhaseScore]:
    """Relative and individual scores of every (rank, phase) in ``medians``.

    ``best`` maps (rank, phase) to the rank's best (lowest) median so far; it
    is updated in place with the current medians. Without it the individual
    score is 1.0.
    """
    medians = list(medians)
    by_phase: dict[str, list[float]] = collections.defaultdict(list)
    for m in medians:
        by_phase[m.phase].append(max(m.median, _FLOOR))
    typical = {phase: statistics.median(values) for phase, values in by_phase.items()}
    scores = []
    for m in medians:
        current = max(m.median, _FLOOR)
        individual = 1.0
        if best is not None:
            key = (m.rank, m.phase)
            best[key] = min(best.get(key, current), current)
            individual = best[key] / current
        scores.append(PhaseScore(m.rank, m.phase, m.median, m.samples, typical[m.phase] / current, individual))
    return scores


@dataclasses.dataclass(frozen=True)
class StragglerReport:
    """The outcome of one report interval: every score, and the ranks that just became stragglers."""

    scores: list[PhaseScore]
    stragglers: list[PhaseScore]


class StragglerJudge:
    """Names the ranks whose relative score stays below ``threshold`` for ``consecutive`` reports in a row.

    A rank missing from a report (no new samples: finished, hung, or its node's
    medians arrived late) neither counts nor breaks its run. A straggler is
    named once; it is named again only after a report at or above the
    threshold broke its run. One judge per cycle: a restart starts afresh.
    """

    def __init__(self, threshold: float, consecutive: int,
                 min_phase_seconds: float = DEFAULT_MIN_PHASE_SECONDS) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold: {threshold!r}; allowed: a number in (0, 1]")
        if consecutive < 1:
            raise ValueError(f"consecutive: {consecutive!r}; allowed: an integer >= 1")
        if not min_phase_seconds >= 0:
            raise ValueError(f"min_phase_seconds: {min_phase_seconds!r}; allowed: a number of seconds >= 0")
        self.threshold = threshold
        self.consecutive = consecutive
        #: A phase whose job-wide median is below this is not scored: no score, never a straggler.
        self.min_phase_seconds = min_phase_seconds
        #: The job-wide median of the ``step`` durations in the latest report that had them; None: unknown.
        self.step_seconds: Optional[float] = None
        self._best: dict[tuple[int, str], float] = {}
        self._below: dict[tuple[int, str], int] = {}

    @property
    def min_phase(self) -> float:
        """The shortest job-wide median a phase needs to be scored: ``min_phase_seconds``, or
        :data:`MIN_PHASE_STEP_FRACTION` of the step when the step is known and that is longer."""
        if self.step_seconds is None:
            return self.min_phase_seconds
        return max(self.min_phase_seconds, MIN_PHASE_STEP_FRACTION * self.step_seconds)

    def judge(self, medians: Iterable[PhaseMedian]) -> StragglerReport:
        medians = list(medians)
        by_phase: dict[str, list[float]] = collections.defaultdict(list)
        for m in medians:
            by_phase[m.phase].append(m.median)
        steps = by_phase.pop(STEP_PHASE, None)
        if steps:
            self.step_seconds = statistics.median(steps)
        floor = self.min_phase
        scored = {phase for phase, values in by_phase.items() if statistics.median(values) >= floor}
        scores = score_phases([m for m in medians if m.phase in scored], self._best)
        stragglers = []
        for score in scores:
            key = (score.rank, score.phase)
            if score.relative < self.threshold:
                self._below[key] = self._below.get(key, 0) + 1
                if self._below[key] == self.consecutive:
                    stragglers.append(score)
            else:
                self._below.pop(key, None)
        return StragglerReport(scores, stragglers)
