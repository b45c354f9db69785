"""The goodput report for people: durations, the exit summary's lines and the budget by cause."""

from __future__ import annotations

import pytest

from ft_core.launcher.observability.report.analysis import Report
from ft_core.launcher.observability.report.text import format_report, seconds, short_summary


def report(**changes) -> Report:
    """A report of one node's 100 s job: 80 s of training, 5 s detecting and 5 s restarting, 10 s recomputing."""
    fields = dict(files=["ft_events.jsonl"], run_ids=["42"], attempts=1, nodes=["hostA:1"], cycles=2,
                  wall_time_s=100.0, training_time_s=80.0, detection_s=5.0, restart_s=5.0, recompute_s=10.0,
                  faults=[], exit_codes=[0], exit_reasons=["all workers finished successfully"],
                  launchers=[("hostA:1", 0.0, 100.0)], cycle_spans=[], checkpoints=[], attempt_spans=[(0.0, 100.0)])
    return Report(**{**fields, **changes})


@pytest.mark.parametrize(("value", "text"), [
    (None, "n/a"), (0.04, "0.0 s"), (119.9, "119.9 s"), (120.0, "2.0 min"), (3599.0, "60.0 min"), (5400.0, "1.50 h"),
])
def test_durations_are_written_in_the_unit_a_reader_expects(value, text):
    assert seconds(value) == text


def test_the_exit_summary_is_two_lines_without_faults_and_adds_the_budget_by_cause():
    assert short_summary(report()) == [
        "goodput    : 70.0 % (training 70.0 s of 100.0 s wall time)",
        "time lost  : 20.0 s (detection 5.0 s, restart 5.0 s, recomputation 10.0 s)",
    ]
    lines = short_summary(report(restarts_by_cause={"transient": 2, "bad checkpoint": 1},
                                 stopped_by="deterministic fault: same fault 3 times",
                                 rejected_checkpoints={"/ckpt/iter_10": "non-finite weights"}))
    assert lines[2:] == [
        "restarts   : 3 by cause: 2 transient, 1 bad checkpoint",
        "stopped by : deterministic fault: same fault 3 times",
        "rejected   : 1 checkpoint(s): /ckpt/iter_10 (non-finite weights)",
    ]


def test_unknown_figures_read_n_a():
    empty = report(wall_time_s=0.0, training_time_s=0.0, recompute_s=None, exit_codes=[], exit_reasons=[],
                   run_ids=[])
    assert short_summary(empty)[0] == "goodput    : n/a (training 0.0 s of 0.0 s wall time)"
    text = format_report(empty)
    assert text.splitlines()[0] == "goodput report: 1 event log(s), 1 attempt(s), 1 node(s), 2 cycle(s)"
    assert "  exit code(s)   : n/a" in text.splitlines()


def test_the_full_report_of_a_job_without_faults():
    lines = format_report(report()).splitlines()
    assert lines[0] == "goodput report: 1 event log(s), 1 attempt(s), 1 node(s), 2 cycle(s), run 42"
    assert "  faults         : 0 (none)" in lines
    assert lines[-1] == "  exit code(s)   : 0 (all workers finished successfully)"
