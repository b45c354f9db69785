"""Straggler detection's pieces: the rolling windows, the scores, the judge, and the launchers' exchange
through a real job store (``C10dJobStore`` over a ``torch.distributed.HashStore``, and etcd)."""

from __future__ import annotations

import math

import pytest
import torch.distributed as dist

from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.config_loading import LoadedConfig, load_json
from ft_core.events import PhaseMedians
from ft_core.launcher.rendezvous.job_store import C10dJobStore
from ft_core.launcher.straggler_exchange import (
    StragglerDetector,
    exclusion_blocker,
    straggler_action_for,
)
from ft_core.straggler_scoring import (
    MAX_PHASES_PER_RANK,
    PhaseMedian,
    PhaseWindows,
    StragglerAction,
    StragglerJudge,
    check_phase_sample,
    score_phases,
)


# -- windows ----------------------------------------------------------------------------
def test_window_keeps_the_last_samples_and_reports_only_windows_with_new_ones():
    windows = PhaseWindows(size=3)
    for seconds in (9.0, 1.0, 2.0, 3.0):  # 9.0 falls out of the window
        windows.add(0, "forward", seconds)
    windows.add(1, "forward", 5.0)
    assert windows.report() == [PhaseMedian(0, "forward", 2.0, 3), PhaseMedian(1, "forward", 5.0, 1)]
    assert windows.report() == []  # nothing new: stale windows are not scored again
    windows.add(1, "forward", 7.0)
    assert windows.report() == [PhaseMedian(1, "forward", 6.0, 2)]


def test_window_bounds_the_phases_of_a_rank_and_forgets_a_rank():
    windows = PhaseWindows(size=2)
    assert all(windows.add(0, f"p{i}", 1.0) for i in range(MAX_PHASES_PER_RANK))
    assert not windows.add(0, "one-too-many", 1.0)
    assert windows.add(0, "p0", 1.0)  # known phases still count
    windows.forget(0)
    assert not windows.has_new() and windows.report() == []


@pytest.mark.parametrize(("name", "seconds"), [("", 1.0), ("x" * 65, 1.0), (3, 1.0), ("f", -1.0),
                                               ("f", math.nan), ("f", math.inf), ("f", True), ("f", "1")])
def test_invalid_phase_samples_are_named(name, seconds):
    assert check_phase_sample(name, seconds) is not None


def test_valid_phase_sample():
    assert check_phase_sample("forward", 0) is None and check_phase_sample("f", 0.25) is None


# -- scores -----------------------------------------------------------------------------
def test_relative_score_is_the_typical_median_over_the_rank_median_per_phase():
    medians = [PhaseMedian(0, "fwd", 0.1, 8), PhaseMedian(1, "fwd", 0.1, 8), PhaseMedian(2, "fwd", 0.2, 8),
               PhaseMedian(0, "data", 1.0, 8), PhaseMedian(1, "data", 4.0, 8)]
    scores = {(s.rank, s.phase): s for s in score_phases(medians)}
    assert scores[(0, "fwd")].relative == pytest.approx(1.0)
    assert scores[(2, "fwd")].relative == pytest.approx(0.5)
    assert scores[(0, "data")].relative == pytest.approx(2.5)  # median of (1, 4) = 2.5
    assert scores[(1, "data")].relative == pytest.approx(0.625)
    assert all(s.individual == 1.0 for s in scores.values())  # no history given


def test_individual_score_is_the_best_median_so_far_over_the_current_one():
    best: dict[tuple[int, str], float] = {}
    score_phases([PhaseMedian(0, "fwd", 0.1, 4)], best)
    (slower,) = score_phases([PhaseMedian(0, "fwd", 0.2, 4)], best)
    assert slower.individual == pytest.approx(0.5)
    (faster,) = score_phases([PhaseMedian(0, "fwd", 0.05, 4)], best)
    assert faster.individual == pytest.approx(1.0) and best[(0, "fwd")] == 0.05


def test_a_zero_median_gives_a_finite_score():
    scores = score_phases([PhaseMedian(0, "fwd", 0.0, 1), PhaseMedian(1, "fwd", 0.0, 1)])
    assert [s.relative for s in scores] == [1.0, 1.0]


# -- the judge ----------------------------------------------------------------------------
def medians(slow: float, ranks: int = 4) -> list[PhaseMedian]:
    return [PhaseMedian(r, "fwd", 0.1 * (slow if r == ranks - 1 else 1.0), 16) for r in range(ranks)]


def test_a_rank_below_threshold_for_k_reports_is_named_once():
    judge = StragglerJudge(threshold=0.75, consecutive=3)
    named = [[s.rank for s in judge.judge(medians(1.6)).stragglers] for _ in range(5)]
    assert named == [[], [], [3], [], []]


def test_a_report_at_or_above_threshold_breaks_the_run():
    judge = StragglerJudge(threshold=0.75, consecutive=2)
    runs = [judge.judge(medians(slow)).stragglers for slow in (1.6, 1.2, 1.6, 1.6)]
    assert [[s.rank for s in r] for r in runs] == [[], [], [], [3]]


def test_a_missing_rank_neither_counts_nor_breaks_its_run():
    judge = StragglerJudge(threshold=0.75, consecutive=2)
    assert judge.judge(medians(1.6)).stragglers == []
    assert judge.judge(medians(1.0, ranks=3)).stragglers == []  # rank 3 absent
    assert [s.rank for s in judge.judge(medians(1.6)).stragglers] == [3]


def test_an_evenly_loaded_job_has_no_straggler_even_when_all_slow_down():
    judge = StragglerJudge(threshold=0.75, consecutive=1)
    for factor in (1.0, 1.1, 3.0, 3.0):  # a job-wide slowdown lowers individual scores only
        report = judge.judge([PhaseMedian(r, "fwd", 0.1 * factor * (1 + 0.02 * r), 16) for r in range(8)])
        assert report.stragglers == []
    assert min(s.individual for s in report.scores) < 0.75


@pytest.mark.parametrize(("threshold", "consecutive"), [(0, 1), (1.5, 1), (0.75, 0)])
def test_judge_rejects_bad_settings(threshold, consecutive):
    with pytest.raises(ValueError):
        StragglerJudge(threshold, consecutive)


# -- config -------------------------------------------------------------------------------
def test_config_defaults_and_validation():
    cfg = FaultToleranceConfig()
    assert (cfg.straggler_report_interval, cfg.straggler_threshold, cfg.straggler_consecutive_reports,
            cfg.straggler_action, cfg.metrics_port) == (60.0, 0.75, 3, StragglerAction.REPORT, None)
    cfg = FaultToleranceConfig.from_kwargs(straggler_report_interval="none", straggler_action="exclude-node",
                                           metrics_port="0")
    assert cfg.straggler_report_interval is None and cfg.straggler_action is StragglerAction.EXCLUDE_NODE
    assert cfg.metrics_port == 0 and load_json(LoadedConfig(cfg).to_json()).cfg.to_dict() == cfg.to_dict()
    for key, bad, allowed in [("straggler_threshold", "1.2", "(0, 1]"), ("straggler_action", "kill", "exclude-node"),
                              ("metrics_port", -1, "0 to 65535"), ("straggler_consecutive_reports", 0, "1"),
                              ("straggler_report_interval", 0, "positive")]:
        with pytest.raises(ConfigError) as info:
            FaultToleranceConfig.from_kwargs(**{key: bad})
        assert key in str(info.value) and repr(bad) in str(info.value) and allowed in str(info.value)


def test_medians_of_another_cycle_or_a_late_round_are_left_out():
    store = C10dJobStore(dist.HashStore())
    aggregator = StragglerDetector(1.0, 0.75, 1, StragglerAction.REPORT, "host:0", lambda: store)
    other = StragglerDetector(1.0, 0.75, 1, StragglerAction.REPORT, "host:1", lambda: store)
    aggregator.publish(PhaseMedians(round=10, medians=[PhaseMedian(0, "fwd", 0.1, 9)]), cycle=1, group_rank=0)
    other.publish(PhaseMedians(round=9, medians=[PhaseMedian(1, "fwd", 0.5, 9)]), cycle=1, group_rank=1)
    assert aggregator.poll(1, 0, 2, wall=10.5) == []  # alone in round 10: no straggler


def test_no_phase_no_store_traffic():
    calls: list[str] = []

    class CountingStore(C10dJobStore):
        def get(self, key: str):
            calls.append(key)
            return super().get(key)

    store = CountingStore(dist.HashStore())
    detector = StragglerDetector(1.0, 0.75, 1, StragglerAction.REPORT, "host:0", lambda: store)
    for wall in range(100, 110):
        assert detector.poll(0, 0, 2, wall=wall + 0.5) == []
    assert calls == []


@pytest.mark.parametrize("kwargs, words", [
    ({"dynamic": False, "hosts_store": False, "nodes": 2, "min_nodes": 1, "spares": 1}, "static"),
    ({"dynamic": True, "hosts_store": True, "nodes": 3, "min_nodes": 1, "spares": 1}, "hosts the c10d"),
    ({"dynamic": True, "hosts_store": False, "nodes": 1, "min_nodes": 1, "spares": 0}, "no hot spare"),
    ({"dynamic": True, "hosts_store": False, "nodes": 2, "min_nodes": 2, "spares": 0}, "needs 2 node(s)"),
    ({"dynamic": True, "hosts_store": False, "nodes": 2, "min_nodes": 2, "spares": 1}, None),  # the spare steps in
    ({"dynamic": True, "hosts_store": False, "nodes": 3, "min_nodes": 2, "spares": 0}, None),  # enough nodes left
])
def test_a_node_is_excluded_only_when_the_job_can_go_on_without_it(kwargs, words):
    blocker = exclusion_blocker(**kwargs)
    assert blocker is None if words is None else words in blocker


def test_straggler_restart_is_made_once_per_node_then_reported():
    assert straggler_action_for(StragglerAction.RESTART, "a:1", set()) is StragglerAction.RESTART
    assert straggler_action_for(StragglerAction.RESTART, "a:1", {"a:1"}) is StragglerAction.REPORT
    assert straggler_action_for(StragglerAction.RESTART, "b:2", {"a:1"}) is StragglerAction.RESTART
    assert straggler_action_for(StragglerAction.EXCLUDE_NODE, "a:1", {"a:1"}) is StragglerAction.EXCLUDE_NODE


def test_a_phase_below_the_floor_is_never_scored_a_longer_one_is():
    # Rank 0 also draws the progress bar: its "data" phase is 253 us against 102 us elsewhere (relative
    # score 0.4), a difference of microseconds no rank should be blamed for. 1 ms floor: not scored.
    judge = StragglerJudge(0.75, 1)
    tiny = [PhaseMedian(0, "data", 253e-6, 9), PhaseMedian(1, "data", 102e-6, 9), PhaseMedian(2, "data", 102e-6, 9)]
    report = judge.judge(tiny)
    assert report.scores == [] and report.stragglers == []
    # A real straggler in a phase above the floor is still named, in the same round.
    slow = [PhaseMedian(0, "forward", 0.1, 9), PhaseMedian(1, "forward", 0.1, 9), PhaseMedian(2, "forward", 0.2, 9)]
    assert [(s.rank, s.phase) for s in judge.judge([*tiny, *slow]).stragglers] == [(2, "forward")]
    # Configurable: 0 scores every phase while the step is unknown (no 5 %-of-the-step floor yet).
    assert [s.rank for s in StragglerJudge(0.75, 1, min_phase_seconds=0).judge(tiny).stragglers] == [0]


def test_a_phase_under_five_percent_of_the_step_is_never_scored_a_sizeable_one_is():
    # Steps of 200 ms: rank 0's data phase of 6 ms against 2 ms elsewhere (score 0.33) is above the 1 ms
    # floor but under 5 % of the step (10 ms): not scored. The step itself (every rank waits in it) never is.
    judge = StragglerJudge(0.75, 1)
    step = [PhaseMedian(r, "step", 0.2 + 0.1 * (r == 2), 9) for r in range(3)]
    data = [PhaseMedian(0, "data", 6e-3, 9), PhaseMedian(1, "data", 2e-3, 9), PhaseMedian(2, "data", 2e-3, 9)]
    slow = [PhaseMedian(0, "forward", 0.1, 9), PhaseMedian(1, "forward", 0.1, 9), PhaseMedian(2, "forward", 0.2, 9)]
    report = judge.judge([*step, *data, *slow])
    assert judge.step_seconds == 0.2 and judge.min_phase == pytest.approx(0.01)
    assert {s.phase for s in report.scores} == {"forward"}
    assert [(s.rank, s.phase) for s in report.stragglers] == [(2, "forward")]  # a real straggler still named
    # A later round without step medians keeps the known step.
    assert judge.judge(data).scores == []
    # Twin: with 20 ms steps the same data phase is a sizeable part of the step: scored, rank 0 named.
    short = StragglerJudge(0.75, 1)
    fast_step = [PhaseMedian(r, "step", 0.02, 9) for r in range(3)]
    assert [(s.rank, s.phase) for s in short.judge([*fast_step, *data]).stragglers] == [(0, "data")]
    # Unknown step (no rank marks it): only straggler_min_phase_seconds applies.
    assert [s.rank for s in StragglerJudge(0.75, 1).judge(data).stragglers] == [0]
