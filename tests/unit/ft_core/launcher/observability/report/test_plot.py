"""The job's timeline as a picture: its rows, its time axis without the queue time, and without matplotlib.

A timeline drawn from real event logs is in ``test_analysis.py`` (``--plot``).
"""

from __future__ import annotations

import sys

import pytest

from ft_core.launcher.observability.report.plot import _rows, _TimeAxis, plot_timeline


def test_one_row_per_host_and_one_more_for_launchers_that_overlap_on_it():
    launchers = [("hostA:1", 0.0, 50.0), ("hostB:2", 0.0, 50.0), ("hostA:3", 60.0, 90.0), ("hostA:4", 70.0, 90.0)]
    assert _rows(launchers) == [("hostA", ["hostA:1", "hostA:3"]), ("hostB", ["hostB:2"]), ("hostA #2", ["hostA:4"])]


def test_the_time_between_attempts_is_cut_down_to_a_small_gap():
    axis = _TimeAxis([(0.0, 100.0), (1000.0, 1100.0)])  # requeued after 900 s in the queue
    assert axis.gap == pytest.approx(6.0)  # 3 % of the 200 s that ran
    assert [axis(t) for t in (0.0, 100.0, 1000.0, 1100.0)] == pytest.approx([0.0, 100.0, 106.0, 206.0])
    ((x, queued),) = axis.breaks()
    assert (x, queued) == (pytest.approx(103.0), 900.0)
    assert axis.total == pytest.approx(206.0) and axis.unit == "s"
    assert _TimeAxis([(0.0, 4 * 3600.0)]).unit == "h" and _TimeAxis([]).breaks() == []


def test_without_matplotlib_the_error_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(RuntimeError, match=r"--plot needs matplotlib: pip install 'ft-suite-pytorch\[report\]'"):
        plot_timeline(None, str(tmp_path / "t.png"))  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
