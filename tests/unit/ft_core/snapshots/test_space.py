"""Where a job's snapshots live in /dev/shm: a private, locked directory named as the job directory, or none.

A claimed directory's life (created, found from the socket, swept after a SIGKILL, released) is tested in
``test_store.py``; here: the owner record, the lock, and each way the space is refused with a warning.
"""

from __future__ import annotations

import fcntl
import logging
import os

import pytest

from ft_core.jobdir import OWNER_FILE, JobDir
from ft_core.snapshots.space import claim_snapshot_dir, shm_root, snapshot_dir_for_socket


@pytest.fixture
def job(tmp_path) -> JobDir:
    return JobDir(str(tmp_path / "runtime" / "job-abc")).create()


def test_a_claimed_directory_records_its_owner_and_is_locked_by_it(tmp_path, job):
    (tmp_path / "shm").mkdir()
    claim = claim_snapshot_dir(job, base=str(tmp_path / "shm"))
    assert claim is not None
    try:
        assert shm_root(base=str(tmp_path / "shm")) == str(tmp_path / "shm" / f"ft-{os.geteuid()}")
        with open(os.path.join(claim.job_dir.path, OWNER_FILE)) as handle:
            assert handle.read() == f"{os.getpid()}\n"
        other = os.open(claim.job_dir.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(BlockingIOError):  # another launcher's sweep sees a live owner
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    finally:
        claim.release()


def test_without_the_shared_memory_filesystem_there_are_no_snapshots_and_one_warning(tmp_path, job, caplog):
    missing = str(tmp_path / "no-shm")
    assert shm_root(base=missing) is None
    with caplog.at_level(logging.WARNING, logger="ft_core.snapshots"):
        assert claim_snapshot_dir(job, base=missing) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"{missing} does not exist: in-memory snapshots are off for this job"]
    assert snapshot_dir_for_socket(job.monitor_socket, base=missing) is None


def test_a_planted_root_turns_snapshots_off_instead_of_writing_through_it(tmp_path, job, caplog):
    base = tmp_path / "shm"
    base.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, base / f"ft-{os.geteuid()}")
    with caplog.at_level(logging.WARNING, logger="ft_core.snapshots"):
        assert claim_snapshot_dir(job, base=str(base)) is None
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"cannot create the snapshot directory in {base}") and "symlink" in message
    assert os.listdir(elsewhere) == []


def test_a_rank_finding_a_planted_snapshot_dir_turns_snapshots_off(tmp_path, job, caplog):
    base = tmp_path / "shm"
    root = base / f"ft-{os.geteuid()}"
    root.mkdir(parents=True, mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / OWNER_FILE).write_text("1\n")
    os.symlink(elsewhere, root / "job-abc")
    with caplog.at_level(logging.WARNING, logger="ft_core.snapshots"):
        assert snapshot_dir_for_socket(job.monitor_socket, base=str(base)) is None
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("in-memory snapshots are off: ") and "symlink" in message
