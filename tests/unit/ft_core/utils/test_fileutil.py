"""Crash-safe file writes: a reader sees the old file or the new one; temp files of dead writers are removed.

The writes through planted symlinks and a real killed writer are in ``tests/security/test_files.py``.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from ft_core.utils.fileutil import (
    STALE_TEMP_AGE,
    atomic_replace,
    atomic_write_json,
    atomic_write_text,
    read_json,
    remove_stale_temp_files,
)


def _pid_that_does_not_exist() -> int:
    with open("/proc/sys/kernel/pid_max") as handle:
        return int(handle.read()) + 1  # above pid_max: no process has it


def test_a_write_replaces_the_file_whole_and_private(tmp_path):
    target = tmp_path / "sub" / "state.json"
    atomic_write_json(target, {"b": 1, "a": [2]})
    assert read_json(target) == {"a": [2], "b": 1}
    assert target.read_text() == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'  # sorted keys: diffable
    assert os.stat(target).st_mode & 0o777 == 0o600
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and os.listdir(target.parent) == ["state.json"]


def test_a_write_interrupted_before_the_rename_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_replace(target) as tmp_path_name:
            with open(tmp_path_name, "w") as handle:
                handle.write("half")
            raise KeyboardInterrupt  # a signal in the middle of the write
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["state.json"]


def test_only_temp_files_of_dead_or_long_gone_writers_of_the_same_target_are_removed(tmp_path):
    target = tmp_path / "state.json"
    host = socket.gethostname()
    dead = tmp_path / f".state.json.{host}.{_pid_that_does_not_exist()}.abcd1234.tmp"
    live = tmp_path / f".state.json.{host}.{os.getpid()}.abcd1234.tmp"
    other_host_fresh = tmp_path / ".state.json.elsewhere.example.12.abcd1234.tmp"
    other_host_old = tmp_path / ".state.json.faraway.13.abcd1234.tmp"
    other_target = tmp_path / f".other.json.{host}.{_pid_that_does_not_exist()}.abcd1234.tmp"
    for temp in (dead, live, other_host_fresh, other_host_old, other_target):
        temp.write_text("torn")
    old = time.time() - STALE_TEMP_AGE - 60
    os.utime(other_host_old, (old, old))
    assert sorted(remove_stale_temp_files(target)) == sorted([str(dead), str(other_host_old)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, other_host_fresh.name, other_target.name])
    assert remove_stale_temp_files(tmp_path / "missing" / "state.json") == []
