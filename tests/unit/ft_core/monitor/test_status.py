"""The monitor's status file: replaced whole, private, and unreadable means "no status", never an error."""

from __future__ import annotations

import os
import stat

from ft_core.monitor.status import MonitorStatus, RankStatus, read_status, write_status


def test_a_written_status_reads_back_and_the_file_is_private(tmp_path):
    path = str(tmp_path / "monitor_status.json")
    status = MonitorStatus(time=1.7e9, ranks=[RankStatus(rank=0, pid=11, last_activity=None),
                                              RankStatus(rank=1, pid=12, last_activity=1.7e9 - 2.0, steps=3,
                                                         step_seconds=1.5, last_step_seconds=0.5)])
    write_status(path, status)
    assert read_status(path) == status
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    newer = MonitorStatus(time=1.7e9 + 1.0, ranks=[])
    write_status(path, newer)  # replaced: no temp file left beside it
    assert read_status(path) == newer and os.listdir(tmp_path) == ["monitor_status.json"]


def test_a_missing_or_torn_status_file_reads_as_none(tmp_path):
    path = tmp_path / "monitor_status.json"
    assert read_status(str(path)) is None
    path.write_bytes(b'{"time": 1.0, "ranks": [{"rank"')
    assert read_status(str(path)) is None
