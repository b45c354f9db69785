"""How often to take snapshots when the job does not say: ``snapshot_every="auto"``, from their measured cost.

One snapshot costs the training thread the time to build and copy the state (it blocks
the step), and the node the writer thread's CPU time (``torch.save`` and the CRC-32,
about three passes over the state), which competes with training for busy cores. Its
share of the step time is that cost over the steps between two snapshots, so the
interval that keeps snapshots within a budget is ``cost / (budget x step time)``
(:func:`interval_for`, a pure function of the measurements), bounded:

* at least ``MIN_STEPS`` steps, and at least :data:`WRITE_MARGIN` times the writer's wall
  time, so a snapshot is never due while the previous one is still being written (this
  wins over ``MAX_SECONDS``, not over ``MAX_STEPS``);
* at most ``MAX_STEPS`` steps and ``MAX_SECONDS`` of steps, so a job whose snapshots are
  expensive against its steps still takes one every ten minutes (it then pays more than
  the budget: a snapshot of ``c`` seconds costs ``c / 600`` of the time, above 2 % only
  for snapshots longer than 12 s, a state of several GB on 2 cores).

:class:`AutoInterval` applies it to a running job: a fresh run starts with
``FIRST_EVERY`` steps, so its early snapshots measure the cost (a worker's first one is
not measured: it copies into fresh memory and pays for first uses, several times the
cost of the next ones on a small state); at each due step every
rank proposes the interval its measurements ask for (the median cost of its last three
snapshots, the median of its recent step times), the job takes the largest (one all-reduce, done by
:class:`~ft_core.snapshots.node.NodeSnapshots`: every rank must snapshot the same steps,
or no snapshot is whole on all of them), and the running interval changes only when the
proposal is more than ``TOLERANCE`` away from it (:func:`settle`), so measurement noise,
and the dearer first snapshot of a new worker (fresh memory), do not move it. The
interval is part of the integration's checkpointed state, so a resumed job keeps it: over
any number of resumes it moves only when the cost or the step time really changed.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import time
from typing import Any, Final, Literal, Optional, Union

from ft_core.utils.validation import ValidationError

__all__ = ["AUTO", "BUDGET", "FIRST_EVERY", "MAX_SECONDS", "MAX_STEPS", "MIN_STEPS", "TOLERANCE", "WRITE_MARGIN",
           "AutoInterval", "SnapshotCost", "SnapshotEvery", "interval_for", "settle", "snapshot_every_arg"]

#: ``snapshot_every="auto"``: the interval derived from the measured cost (the default under ``ft_launcher``).
AUTO: Final = "auto"
SnapshotEvery = Union[int, Literal["auto"]]

#: The share of the step time snapshots may cost. The target is 3 % (issue 27); 2 % leaves a third of it
#: for the estimate's error (one snapshot's cost, measured on a busy node) and for :data:`TOLERANCE`, while
#: a fault costs at most the interval's steps, so a smaller budget would make every fault dearer.
BUDGET = 0.02
#: A running interval is kept while the newest proposal is within this factor of it: snapshots then cost
#: between ``BUDGET / TOLERANCE`` and ``BUDGET * TOLERANCE`` (1.6 % to 2.5 %) of the step time.
TOLERANCE = 1.25
MIN_STEPS = 1
#: A fault never costs more than this many steps, whatever the measurements (only reached by steps shorter
#: than ``cost / (BUDGET x MAX_STEPS)``: 2 ms for a 200 MB state on 2 cores).
MAX_STEPS = 10_000
#: A snapshot at least every 10 minutes of steps, whatever it costs: bounds what a fault costs a job with
#: expensive snapshots (see the module docstring).
MAX_SECONDS = 600.0
#: An interval of at least twice the writer's wall time: a snapshot due while the previous one is still
#: written is skipped, so a shorter interval would only cost the copies.
WRITE_MARGIN = 2.0
#: The interval of a fresh run until a snapshot has been measured: the one at step 10 (or the second of the
#: worker, when one was taken at the step timeouts are learned at), and the first due step after it (20)
#: sets the interval from it.
FIRST_EVERY = 10
#: Step times kept for the median (the step time is their median: validation, checkpoint saves and the
#: snapshots themselves are rare long steps, not the step time).
STEP_WINDOW = 32


def snapshot_every_arg(name: str, value: Any) -> SnapshotEvery:
    """``snapshot_every`` checked: ``"auto"``, or a number of steps (0: off; None is 0).

    Raises :class:`~ft_core.utils.validation.ValidationError` naming the argument, the value and what is allowed.
    """
    if value is None:
        return 0
    if value == AUTO and isinstance(value, str):
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(name, value, f"'{AUTO}' (from the measured cost of the job's snapshots), None or 0 "
                                           "(snapshots off), or a whole number of training steps >= 1")
    return value


@dataclasses.dataclass(frozen=True)
class SnapshotCost:
    """What one snapshot cost."""

    #: The training thread's time: building the state and copying its tensors (the step waits for it).
    blocking_s: float
    #: The writer thread's CPU time: pickling and writing the state, and its CRC-32.
    writer_cpu_s: float
    #: The writer's wall time, from the hand-over to the manifest written.
    writer_wall_s: float

    @property
    def total_s(self) -> float:
        """What the snapshot takes from training when the node's cores are busy: both threads' time."""
        return self.blocking_s + self.writer_cpu_s


def _round_up(steps: int) -> int:
    """``steps`` rounded up to two significant digits (47, 120, 1300): intervals a person can read."""
    if steps < 100:
        return steps
    unit = 10 ** (len(str(steps)) - 2)
    return -(-steps // unit) * unit


def interval_for(cost: SnapshotCost, step_s: float, *, budget: float = BUDGET, min_steps: int = MIN_STEPS,
                 max_steps: int = MAX_STEPS, max_seconds: float = MAX_SECONDS) -> int:
    """The steps between two snapshots that keep their cost within ``budget`` of steps of ``step_s`` seconds.

    ``ceil(cost / (budget x step_s))`` rounded up to two significant digits, at most ``max_steps``
    and ``max_seconds`` of steps, at least ``min_steps`` and :data:`WRITE_MARGIN` writes (the
    writes win over ``max_seconds``: a snapshot due during the previous write would be skipped;
    nothing wins over ``max_steps``).
    """
    step_s = max(step_s, 1e-6)
    wanted = _round_up(max(1, math.ceil(cost.total_s / (budget * step_s))))
    upper = max(1, min(max_steps, math.floor(max_seconds / step_s)))
    lower = max(min_steps, min(max_steps, math.ceil(WRITE_MARGIN * cost.writer_wall_s / step_s)))
    return max(lower, min(wanted, upper))


def settle(current: Optional[int], proposed: int, tolerance: float = TOLERANCE) -> int:
    """The interval to run with: ``current`` unless ``proposed`` is more than ``tolerance`` times away from it."""
    if not current or proposed > current * tolerance or proposed * tolerance < current:
        return proposed
    return current


class AutoInterval:
    """One rank's ``snapshot_every="auto"``: its step times, and the interval the job agreed on.

    ``every``: an interval learned by an earlier run of the job (restored from its state), else
    :data:`FIRST_EVERY` until the first snapshot is measured.
    """

    def __init__(self, every: Optional[int] = None) -> None:
        self.every = every if every else FIRST_EVERY
        #: True once ``every`` was set from a measurement (by this run or, restored, an earlier one).
        self.learned = bool(every)
        self._durations: collections.deque[float] = collections.deque(maxlen=STEP_WINDOW)
        self._last: Optional[tuple[int, float]] = None

    def step_ended(self, step: int, now: Optional[float] = None) -> None:
        """Global step ``step`` ended (called once or more per step: only a new step counts)."""
        now = time.monotonic() if now is None else now
        if self._last is not None:
            if step == self._last[0]:
                return
            if step > self._last[0]:
                self._durations.append((now - self._last[1]) / (step - self._last[0]))
        self._last = (step, now)

    @property
    def step_s(self) -> Optional[float]:
        """The median of the recent step times; None before two steps were seen."""
        return statistics.median(self._durations) if self._durations else None

    def propose(self, cost: Optional[SnapshotCost]) -> int:
        """The interval this rank's measurements ask for; 0 when it has none yet."""
        step_s = self.step_s
        return 0 if cost is None or step_s is None else interval_for(cost, step_s)

    def agree(self, proposed: int) -> bool:
        """Apply the job's proposal (the largest of the ranks'; 0: none); True when the interval was set or changed."""
        if proposed <= 0:
            return False
        before, first = self.every, not self.learned
        self.every, self.learned = settle(None if first else self.every, proposed), True
        return first or self.every != before

    def restore(self, every: Any) -> None:
        """Take the interval an earlier run of the job learned (from its checkpointed state; ignored when invalid)."""
        if isinstance(every, int) and not isinstance(every, bool) and every >= 1:
            self.every, self.learned = every, True
