"""``snapshot_every="auto"``: the interval rule (pure), its hysteresis, a rank's measurements, and the
interval over many resumes (rule 2); then the rule applied by real slots and a writer thread in one
process (no launcher, no process group). Under a second in all."""

from __future__ import annotations

import logging
import math
import random

import pytest
import torch

from ft_core.jobdir import MONITOR_SOCKET_ENV, JobDir
from ft_core.snapshots import interval
from ft_core.snapshots.interval import (
    AUTO,
    BUDGET,
    FIRST_EVERY,
    MAX_SECONDS,
    MAX_STEPS,
    TOLERANCE,
    AutoInterval,
    SnapshotCost,
    interval_for,
    settle,
    snapshot_every_arg,
)
from ft_core.snapshots.node import NodeSnapshots
from ft_core.snapshots.room import read_limits, refusal, state_size
from ft_core.snapshots.slots import SnapshotSlots
from ft_core.utils.validation import ValidationError

#: docs/measured.md: a 192 MB state blocks the step 22 ms, the writer spends 0.42 s of CPU in 0.28 s... per snapshot.
MEASURED = SnapshotCost(blocking_s=0.022, writer_cpu_s=0.42, writer_wall_s=0.28)


def overhead(cost: SnapshotCost, every: int, step_s: float) -> float:
    return cost.total_s / (every * step_s)


# -- the rule -------------------------------------------------------------------------------------
def test_the_measured_200_mb_state_at_200_ms_steps_snapshots_every_120_steps_within_the_budget():
    every = interval_for(MEASURED, 0.2)
    assert every == 120  # ceil(0.442 / (0.02 * 0.2)) = 111, rounded up to two significant digits
    assert overhead(MEASURED, every, 0.2) <= BUDGET


@pytest.mark.parametrize(("case", "cost", "step_s", "expected"), [
    # A tiny state: a snapshot costs a few ms, so one every step keeps within 2 % of a 200 ms step.
    ("tiny state", SnapshotCost(0.001, 0.002, 0.003), 0.2, 1),
    # Slow steps (a minute each): every step, the cost is noise beside it.
    ("slow steps", MEASURED, 60.0, 1),
    # Slow storage: little CPU but a long write; never due while the previous one is still written.
    ("slow storage", SnapshotCost(0.02, 0.05, 10.0), 0.1, 200),
    # A huge state (30 s a snapshot): the budget asks for 3000 steps (25 minutes): capped at 10 minutes.
    ("huge state", SnapshotCost(2.0, 28.0, 20.0), 0.5, int(MAX_SECONDS / 0.5)),
    # Tiny steps: the budget asks for 22,100 steps; a fault never costs more than MAX_STEPS.
    ("tiny steps", MEASURED, 0.001, MAX_STEPS),
    # A step time measured as 0 (a clock step): bounded, no division by zero.
    ("zero step time", MEASURED, 0.0, MAX_STEPS),
])
def test_bounds(case, cost, step_s, expected):
    assert interval_for(cost, step_s) == expected, case


def test_the_writer_floor_wins_over_the_seconds_cap():
    # A write of 20 minutes: a snapshot every 10 minutes would be skipped every other time.
    every = interval_for(SnapshotCost(1.0, 30.0, 1200.0), 1.0)
    assert every == 2400 and every * 1.0 > MAX_SECONDS


def test_within_the_bounds_the_interval_keeps_the_cost_within_the_budget_and_is_never_much_more_than_it_needs():
    rng = random.Random(27)
    for _ in range(2000):
        cost = SnapshotCost(rng.uniform(0, 1), rng.uniform(0, 5), rng.uniform(0, 5))
        step_s = 10 ** rng.uniform(-2, 1.5)
        every = interval_for(cost, step_s)
        assert every >= 1
        needed = math.ceil(cost.total_s / (BUDGET * step_s))
        floor = min(MAX_STEPS, math.ceil(2 * cost.writer_wall_s / step_s))
        cap = min(MAX_STEPS, math.floor(MAX_SECONDS / step_s))
        if needed <= cap:
            assert overhead(cost, every, step_s) <= BUDGET + 1e-12 or every < needed <= floor
            assert every <= max(needed * 1.1, floor, 1), (cost, step_s, every)  # rounding: < 10 % more
        else:
            assert every == max(cap, floor, 1)


def test_rounding_to_two_significant_digits():
    assert [interval._round_up(n) for n in (1, 47, 99, 100, 101, 111, 999, 1001, 12_345)] == \
        [1, 47, 99, 100, 110, 120, 1000, 1100, 13_000]


# -- hysteresis -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("current", "proposed", "expected"), [
    (None, 120, 120), (0, 7, 7),
    (120, 120, 120), (120, 140, 120), (120, 150, 120), (120, 151, 151),  # within x1.25: kept
    (120, 100, 120), (120, 96, 120), (120, 95, 95),  # within /1.25: kept
    (10, 120, 120),  # the first interval, from the first measurement
])
def test_settle(current, proposed, expected):
    assert settle(current, proposed) == expected


def test_a_kept_interval_costs_between_budget_over_tolerance_and_budget_times_tolerance():
    cost, step_s = MEASURED, 0.2
    every = interval_for(cost, step_s)
    for factor in (0.87, 0.9, 1.0, 1.1, 1.2):  # the cost measured again, within the tolerance
        kept = settle(every, interval_for(SnapshotCost(cost.blocking_s * factor, cost.writer_cpu_s * factor,
                                                       cost.writer_wall_s), step_s))
        assert kept == every
        assert BUDGET / TOLERANCE / 1.1 <= overhead(SnapshotCost(cost.blocking_s * factor, cost.writer_cpu_s * factor,
                                                                 0), kept, step_s) <= BUDGET * TOLERANCE


# -- a rank's measurements ------------------------------------------------------------------------
def test_step_time_is_the_median_of_new_steps_only():
    auto = AutoInterval()
    assert auto.every == FIRST_EVERY and not auto.learned and auto.step_s is None
    assert auto.propose(MEASURED) == 0  # no step time yet
    now = 0.0
    for step in range(1, 12):
        auto.step_ended(step, now)
        auto.step_ended(step, now + 0.05)  # gradient accumulation: the same step again
        now += 30.0 if step == 5 else 0.2  # one long step (validation, a checkpoint save)
    assert auto.step_s == pytest.approx(0.2)
    assert auto.propose(None) == 0 and auto.propose(MEASURED) == 120


def test_agree_learns_then_keeps_within_the_tolerance():
    auto = AutoInterval()
    assert auto.agree(0) is False and auto.every == FIRST_EVERY  # nobody measured anything yet
    assert auto.agree(120) is True and (auto.every, auto.learned) == (120, True)
    assert auto.agree(140) is False and auto.every == 120
    assert auto.agree(300) is True and auto.every == 300


@pytest.mark.parametrize("bad", [None, 0, -5, 2.5, True, "120"])
def test_restore_ignores_what_is_not_an_interval(bad):
    auto = AutoInterval()
    auto.restore(bad)
    assert (auto.every, auto.learned) == (FIRST_EVERY, False)
    auto.restore(120)
    assert (auto.every, auto.learned) == (120, True)


def _life(rng: random.Random, every: int | None, cost: SnapshotCost, step_s: float, steps: int = 1000
          ) -> tuple[AutoInterval, list[int]]:
    """One run of the job: steps with +-10 % noise, a snapshot's cost re-measured (+-10 %) at every due step,
    the first snapshot of the run dearer (fresh memory: 2.5x the blocking time)."""
    auto = AutoInterval()
    auto.restore(every)
    taken: list[int] = []
    now, measured = 0.0, None
    for step in range(1, steps + 1):
        now += step_s * rng.uniform(0.9, 1.1)
        auto.step_ended(step, now)
        if step % auto.every == 0:
            auto.agree(auto.propose(measured))
            if step % auto.every == 0:
                taken.append(step)
                noise = rng.uniform(0.9, 1.1)
                measured = SnapshotCost(cost.blocking_s * (2.5 if len(taken) == 1 else noise),
                                        cost.writer_cpu_s * noise, cost.writer_wall_s * noise)
    return auto, taken


def test_over_ten_resumes_the_learned_interval_does_not_drift():
    rng = random.Random(2)
    auto, taken = _life(rng, None, MEASURED, 0.2)
    learned = auto.every
    assert taken[0] == FIRST_EVERY and learned == 120
    for resume in range(10):
        auto, taken = _life(rng, auto.every, MEASURED, 0.2)
        assert auto.every == learned, resume
        assert all(step % learned == 0 for step in taken)  # no probe again: the interval was kept


def test_the_interval_follows_a_real_change_of_the_state_or_the_step_time():
    rng = random.Random(3)
    auto, _ = _life(rng, None, MEASURED, 0.2)
    doubled = SnapshotCost(MEASURED.blocking_s * 2, MEASURED.writer_cpu_s * 2, MEASURED.writer_wall_s * 2)
    auto, _ = _life(rng, auto.every, doubled, 0.2, steps=2000)
    wanted = interval_for(doubled, 0.2)
    assert wanted == 230 and wanted / TOLERANCE <= auto.every <= wanted * TOLERANCE
    auto, _ = _life(rng, auto.every, doubled, 1.0, steps=500)  # five times slower steps: five times fewer
    wanted = interval_for(doubled, 1.0)
    assert wanted == 45 and wanted / TOLERANCE <= auto.every <= wanted * TOLERANCE


# -- the argument ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [(AUTO, AUTO), (None, 0), (0, 0), (1, 1), (500, 500)])
def test_snapshot_every_arg(value, expected):
    assert snapshot_every_arg("X.snapshot_every", value) == expected


@pytest.mark.parametrize("bad", [-1, 2.5, True, "Auto", "10", [10]])
def test_snapshot_every_arg_names_the_argument_the_value_and_what_is_allowed(bad):
    with pytest.raises(ValidationError) as info:
        snapshot_every_arg("X.snapshot_every", bad)
    message = str(info.value)
    assert message.startswith("X.snapshot_every: invalid value " + repr(bad))
    assert "'auto'" in message and "None or 0" in message and ">= 1" in message


# -- applied by real slots and a writer thread ----------------------------------------------------
def _auto_node(tmp_path) -> NodeSnapshots:
    job = JobDir(str(tmp_path / "job-x")).create()
    return NodeSnapshots(SnapshotSlots(str(tmp_path / "shm"), 0, 1), job.monitor_socket, 0, AutoInterval())


def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((1024,), float(step))}


def test_auto_probes_at_step_10_then_snapshots_at_the_interval_measured(tmp_path):
    node = _auto_node(tmp_path)
    node.resume(None)
    taken = []
    for step in range(1, 80):
        if node.maybe_save(step, lambda step=step: _state(step)):
            taken.append(step)
            assert node.writer is not None and node.writer.wait(30)
            assert node.auto is not None and node.auto.learned is (step > 2 * FIRST_EVERY)
    node.close()
    # The first snapshot (step 10) is not measured (a worker's first); the second (20) is; step 30 decides.
    assert node.auto is not None and node.auto.learned
    every = node.auto.every
    assert taken[:2] == [FIRST_EVERY, 2 * FIRST_EVERY]
    assert all(step % every == 0 for step in taken[2:])
    assert node.writer is None and [s.step for s in node.slots.verified()[0]][0] == taken[-1]


def test_auto_turns_snapshots_off_when_shared_memory_has_no_room_for_the_double_buffers(tmp_path, monkeypatch,
                                                                                         caplog):
    # Real free space of tmp_path's filesystem; as many ranks on the node as no filesystem holds two snapshots of.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(10 ** 12))
    assert refusal(state_size(_state(1)), 10 ** 12, read_limits(str(tmp_path))) is not None
    node = _auto_node(tmp_path)
    node.resume(None)
    with caplog.at_level(logging.INFO, logger="ft_core.snapshots"):
        taken = [step for step in range(1, 40) if node.maybe_save(step, lambda step=step: _state(step))]
    assert taken == [] and node.every == 0 and node.auto is None and node.off
    assert node.slots.verified() == ([], [])  # nothing in shared memory
    (record,) = [r for r in caplog.records if "snapshots are off" in r.getMessage()]
    assert record.levelno == logging.INFO and "no copy was made" in record.getMessage()
    assert not node.due(50, every=1)  # not even the one at the step timeouts are learned at
    assert not node.save(50, _state(50))  # nor one saved directly


def test_auto_means_off_without_ft_launcher(monkeypatch):
    monkeypatch.delenv(MONITOR_SOCKET_ENV, raising=False)  # no launcher: no one owns the segments
    assert NodeSnapshots.for_rank(0, 1, AUTO) is None
