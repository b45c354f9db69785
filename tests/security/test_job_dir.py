"""Job directories on a shared host: foreign owners, planted symlinks, wide modes and predictable names.

A second Unix user is not available here. As root the tests give directories
to uid 65534 (``nobody``) with ``os.chown``, which is exactly what another
user pre-creating the directory looks like; the same check is also tested
through ``make_private_dir(..., uid=...)`` so it runs without root too.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest
from security_helpers import VICTIM_TEXT, file_mode

from ft_core import jobdir
from ft_core.jobdir import JobDir, UnsafePathError, make_private_dir, write_private_file
from ft_core.monitor import RankMonitorServer
from ft_core.monitor.standalone import standalone_socket_path

pytestmark = pytest.mark.timeout(60)

OTHER_UID = 65534  # "nobody"


def _start_monitor(directory):
    from ft_core.config import FaultToleranceConfig

    return RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), str(directory / "monitor.sock"),
                                               token="t" * 16)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root; see the injected-uid test")
def test_a_job_dir_pre_created_by_another_user_is_refused(tmp_path):
    planted = tmp_path / "myjob"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError) as err:
        make_private_dir(str(planted))
    assert str(planted) in str(err.value) and f"uid {OTHER_UID}" in str(err.value)
    # The monitor refuses it too, before writing its token there.
    with pytest.raises(UnsafePathError):
        _start_monitor(planted).stop()  # (stopped if it wrongly started)
    assert not (planted / "monitor.sock.token").exists()


def test_ownership_is_checked_against_the_given_uid(tmp_path):
    # Same function, another "current user": the directory (ours) now looks foreign.
    path = tmp_path / "job"
    path.mkdir(mode=0o700)
    with pytest.raises(UnsafePathError) as err:
        make_private_dir(str(path), uid=os.getuid() + 1)
    assert str(path) in str(err.value) and "owned by" in str(err.value)
    make_private_dir(str(path), uid=os.getuid())  # the real owner is accepted


def test_a_symlinked_job_dir_is_refused(tmp_path):
    target = tmp_path / "attacker_dir"
    target.mkdir(mode=0o700)
    link = tmp_path / "myjob"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError) as err:
        make_private_dir(str(link))
    assert "symlink" in str(err.value) and str(link) in str(err.value)
    with pytest.raises(UnsafePathError):
        _start_monitor(link).stop()
    assert os.listdir(target) == []


def test_a_wide_job_dir_of_ours_is_tightened_with_a_warning(tmp_path, caplog):
    path = tmp_path / "job"
    path.mkdir()
    os.chmod(path, 0o775)
    with caplog.at_level(logging.WARNING, logger="ft_core.jobdir"):
        make_private_dir(str(path))
    assert file_mode(path) == 0o700
    assert any(str(path) in r.getMessage() and "0o775" in r.getMessage() for r in caplog.records)


def test_a_sticky_shared_directory_is_not_a_job_dir(tmp_path):
    # e.g. `--socket /tmp/monitor.sock`: /tmp must neither be chmodded nor hold the token.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(UnsafePathError) as err:
        make_private_dir(str(shared))
    assert "shared" in str(err.value)
    assert file_mode(shared) == 0o1777


def test_a_planted_token_symlink_is_not_followed(tmp_path, victim):
    job = JobDir(str(tmp_path / "job")).create()
    token_file = jobdir.token_path(job.monitor_socket)
    os.symlink(victim, token_file)
    write_private_file(token_file, "secret-token")
    assert victim.read_text() == VICTIM_TEXT  # not overwritten
    assert not os.path.islink(token_file) and file_mode(token_file) == 0o600
    with open(token_file) as handle:
        assert handle.read() == "secret-token"


def test_the_monitor_does_not_write_through_planted_symlinks(tmp_path, victim):
    # Planted before the monitor starts: its token file and its event log.
    job = JobDir(str(tmp_path / "job")).create()
    os.symlink(victim, jobdir.token_path(job.monitor_socket))
    os.symlink(victim, job.monitor_events)
    with pytest.raises(RuntimeError):  # the event log is a symlink: the monitor refuses to start
        _start_monitor(tmp_path / "job").stop()  # (stopped if it wrongly started)
    assert victim.read_text() == VICTIM_TEXT
    assert file_mode(jobdir.token_path(job.monitor_socket)) == 0o600  # replaced by a file of ours


def test_the_standalone_path_lives_in_a_verified_per_user_directory(runtime_dir, monkeypatch):
    runtime = runtime_dir
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    path = standalone_socket_path()
    assert path == standalone_socket_path()  # every local rank derives the same path
    root = os.path.dirname(os.path.dirname(path))
    assert os.path.dirname(root) == runtime
    assert file_mode(root) == 0o700 and os.stat(root).st_uid == os.getuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_per_user_directory_pre_created_by_another_user_is_refused(runtime_dir, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", runtime_dir)
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches $TMPDIR
    planted = Path(runtime_dir) / f"ft-{os.getuid()}"
    planted.mkdir(mode=0o777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError) as err:
        standalone_socket_path()
    assert str(planted) in str(err.value)


def test_a_stack_dump_symlink_is_not_followed(tmp_path, victim, start_monitor):
    from ft_core.client import RankMonitorClient
    from ft_core.config import FaultToleranceConfig

    monitor = start_monitor(FaultToleranceConfig(rank_heartbeat_timeout=None, initial_rank_heartbeat_timeout=None), attach=True)
    job = JobDir.of_socket(monitor.socket_path)
    dump_file = job.stack_dump_file(0, os.getpid())
    os.symlink(victim, dump_file)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    try:
        os.kill(os.getpid(), client.cfg.stack_dump_signal)  # what the monitor sends on a hang
        assert victim.read_text() == VICTIM_TEXT
        assert not os.path.islink(dump_file) and file_mode(dump_file) == 0o600
        with open(dump_file) as handle:
            assert "test_a_stack_dump_symlink_is_not_followed" in handle.read()
    finally:
        client.shutdown_workload_monitoring()


def test_a_rank_does_not_read_its_token_through_a_planted_symlink(tmp_path, start_monitor, monkeypatch):
    from ft_core.client import RankMonitorClient, RankMonitorClientError
    from ft_core.config import FaultToleranceConfig

    monitor = start_monitor(FaultToleranceConfig(), attach=True)
    monkeypatch.delenv(jobdir.TOKEN_ENV)  # a rank started elsewhere: it reads <socket>.token
    token_file = jobdir.token_path(monitor.socket_path)
    planted = tmp_path / "planted_token"
    planted.write_text("attacker-token")
    os.unlink(token_file)
    os.symlink(planted, token_file)
    with pytest.raises(RankMonitorClientError, match="symlink"):
        RankMonitorClient().init_workload_monitoring()
