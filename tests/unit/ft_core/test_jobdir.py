"""The job directory's layout and permissions (ft_core.jobdir)."""

from __future__ import annotations

import os
import stat

from ft_core import jobdir
from ft_core.jobdir import JobDir


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_layout_derives_from_the_directory_or_the_socket(tmp_path):
    job = JobDir(str(tmp_path / "job"))
    assert job.monitor_socket == str(tmp_path / "job" / "monitor.sock")
    assert job.launcher_socket == str(tmp_path / "job" / "launcher.sock")
    assert job.monitor_events == str(tmp_path / "job" / "monitor_events.jsonl")
    assert job.stack_dump_file(3, 42) == str(tmp_path / "job" / "stacks" / "rank3_pid42.txt")
    assert JobDir.of_socket(job.monitor_socket) == job
    # A monitor started by hand on any socket name keeps the same layout next to it.
    custom = str(tmp_path / "elsewhere" / "my.sock")
    assert jobdir.token_path(custom) == custom + ".token"
    assert jobdir.stack_dump_dir(custom) == str(tmp_path / "elsewhere" / "stacks")
    stacks = jobdir.saved_stacks_dir(str(tmp_path / "logs" / "ft_events.jsonl"))
    assert stacks == str(tmp_path / "logs" / "ft_stacks")
    assert jobdir.saved_stack_path(stacks, 2, 1, 7) == str(tmp_path / "logs" / "ft_stacks" / "cycle2_rank1_pid7.txt")


def test_the_names_match_what_users_and_nvrx_expect():
    assert (jobdir.MONITOR_SOCKET_ENV, jobdir.LAUNCHER_SOCKET_ENV, jobdir.TOKEN_ENV, jobdir.FINISHED_FLAG_ENV) == (
        "FT_RANK_MONITOR_IPC_SOCKET", "FT_LAUNCHER_IPC_SOCKET", "FT_MONITOR_TOKEN", "FAULT_TOL_FINISHED_FLAG_FILE")
    assert jobdir.LAUNCHER_EVENTS_FILE == "ft_events.jsonl"
    from ft_core import client
    from ft_core.launcher.observability import event_log as events

    assert client.MONITOR_SOCKET_ENV is jobdir.MONITOR_SOCKET_ENV  # the old import paths still work
    assert events.EVENTS_FILE_NAME is jobdir.LAUNCHER_EVENTS_FILE


def test_create_makes_private_directories_and_tightens_wider_ones(tmp_path):
    wide = tmp_path / "job"
    wide.mkdir(mode=0o755)
    os.chmod(wide, 0o755)
    job = JobDir(str(wide)).create()
    assert _mode(job.path) == 0o700 and _mode(job.stacks) == 0o700


def test_private_files_are_0600_even_when_they_existed_wider(tmp_path):
    path = tmp_path / "monitor.sock.token"
    path.write_text("old")
    os.chmod(path, 0o644)
    jobdir.write_private_file(str(path), "secret")
    assert path.read_text() == "secret" and _mode(path) == 0o600
