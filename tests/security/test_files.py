"""Files that outlive a crash: private modes, no torn event lines, no stale temp files or job dirs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import kill_group, python_env, spawn_python, wait_for
from security_helpers import VICTIM_TEXT, file_mode

from ft_core import jobdir
from ft_core.event_file import EventWriter, read_records
from ft_core.events import Progress, RankConnected
from ft_core.launcher.observability.event_log import EventLog
from ft_core.utils import fileutil

pytestmark = pytest.mark.timeout(120)



# -- event logs -------------------------------------------------------------------
def test_the_launcher_event_log_and_saved_stacks_are_private(tmp_path):
    log = EventLog(str(tmp_path / "logs" / "ft_events.jsonl"))
    try:
        log.write(Progress(iteration=1, source="rank 0", cycle=0))
        stacks = jobdir.saved_stacks_dir(log.path)
        saved = jobdir.keep_stack(stacks, 0, 1, 7, "Thread 0x1 (most recent call first):\n")
    finally:
        log.close()
    assert file_mode(log.path) == 0o600
    assert saved == jobdir.saved_stack_path(stacks, 0, 1, 7)
    assert file_mode(saved) == 0o600 and file_mode(os.path.dirname(saved)) == 0o700


def test_the_launcher_does_not_write_through_planted_symlinks(tmp_path, victim):
    logs = tmp_path / "logs"
    logs.mkdir()
    os.symlink(victim, logs / "ft_events.jsonl")
    with pytest.raises(jobdir.UnsafePathError) as err:
        EventLog(str(logs / "ft_events.jsonl"))
    assert str(logs / "ft_events.jsonl") in str(err.value)
    os.unlink(logs / "ft_events.jsonl")
    log = EventLog(str(logs / "ft_events.jsonl"))
    try:
        stacks = jobdir.saved_stacks_dir(log.path)
        planted = jobdir.saved_stack_path(stacks, 0, 1, 7)
        os.makedirs(stacks, mode=0o700)
        os.symlink(victim, planted)
        assert jobdir.keep_stack(stacks, 0, 1, 7, "the stack\n") == planted
    finally:
        log.close()
    assert victim.read_text() == VICTIM_TEXT
    assert not os.path.islink(planted) and open(planted).read() == "the stack\n"


def test_a_new_writer_terminates_a_torn_last_line_instead_of_gluing_its_record_to_it(tmp_path):
    path = str(tmp_path / "events.jsonl")
    with EventWriter(path) as out:
        out.write(Progress(iteration=1, source="rank 0", cycle=0))
    with open(path, "ab") as handle:  # what a writer killed in the middle of a line would leave
        handle.write(b'{"event":"progress","iterat')
    assert [r.iteration for r in read_records(path)[0]] == [1]  # the reader waits for the partial line
    with EventWriter(path) as out:  # the next writer (a restarted monitor or launcher)
        out.write(Progress(iteration=2, source="rank 0", cycle=1))
    assert [r.iteration for r in read_records(path)[0]] == [1, 2]


def test_records_of_a_sigkilled_writer_are_whole_lines(tmp_path):
    path = str(tmp_path / "events.jsonl")
    code = textwrap.dedent(f"""
        from ft_core.events import RankConnected
        from ft_core.event_file import EventWriter
        with EventWriter({path!r}) as out:
            i = 0
            while True:
                out.write(RankConnected(rank=i, local_rank=0, pid=i, restart_count=i))
                i += 1
    """)
    proc = spawn_python(["-c", code], env=python_env())
    try:
        wait_for(lambda: os.path.exists(path) and os.path.getsize(path) > 200_000, 30, "records")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    records, _ = read_records(path)
    complete = [line for line in lines[:-1] if line]
    assert len(records) == len(complete) > 1000  # every complete line is a record
    assert all(isinstance(r, RankConnected) for r in records)
    assert [r.rank for r in records] == list(range(len(records)))


# -- state files (atomic writes) ------------------------------------------------------
def test_a_state_file_write_replaces_a_planted_symlink_without_following_it(tmp_path, victim):
    target = tmp_path / "ft_state.json"
    os.symlink(victim, target)
    fileutil.atomic_write_json(target, {"current_timeouts": {}})
    assert victim.read_text() == VICTIM_TEXT
    assert not os.path.islink(target) and file_mode(target) == 0o600
    assert fileutil.read_json(target) == {"current_timeouts": {}}


def test_temp_files_of_a_killed_atomic_write_are_removed_by_the_next_write(tmp_path):
    target = tmp_path / "ft_state.json"
    # A writer killed between creating its temp file and the rename (fsync blocks forever here).
    code = textwrap.dedent(f"""
        import os, time
        from ft_core.utils import fileutil
        os.fsync = lambda fd: time.sleep(3600)
        fileutil.atomic_write_text({str(target)!r}, "never renamed")
    """)
    proc = spawn_python(["-c", code], env=python_env())
    try:
        wait_for(lambda: [p for p in os.listdir(tmp_path) if p.endswith(".tmp")], 30, "the writer's temp file")
    finally:
        kill_group(proc)
    other = tmp_path / "other.json"
    fileutil.atomic_write_text(other, "{}")
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # another target's temp files are kept
    fileutil.atomic_write_text(target, "new")
    assert sorted(os.listdir(tmp_path)) == ["ft_state.json", "other.json"]
    assert target.read_text() == "new"


# -- job directories of dead launchers ----------------------------------------------
CLAIM_AND_WAIT = """
import sys, time
from ft_core.jobdir import claim_job_dir
claim = claim_job_dir(sys.argv[1])
print(claim.job_dir.path, flush=True)
time.sleep(3600)
"""


def _claim_in_child(root) -> tuple[subprocess.Popen, str]:
    proc = spawn_python(["-c", CLAIM_AND_WAIT, str(root)], env=python_env(), stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def test_a_dead_owners_job_dir_is_removed_and_a_live_ones_is_kept(tmp_path):
    root = tmp_path / "root"
    dead, dead_dir = _claim_in_child(root)
    live, live_dir = _claim_in_child(root)
    try:
        assert os.path.isdir(dead_dir) and os.path.isdir(live_dir)
        assert file_mode(root) == 0o700 and file_mode(dead_dir) == 0o700
        kill_group(dead)  # SIGKILL: no cleanup ran
        claim = jobdir.claim_job_dir(str(root))
        try:
            assert not os.path.exists(dead_dir)
            assert os.path.isdir(live_dir)  # its owner still holds the lock
            assert sorted(os.listdir(root)) == sorted([os.path.basename(live_dir),
                                                       os.path.basename(claim.job_dir.path)])
        finally:
            claim.release()
        assert not os.path.exists(claim.job_dir.path)
    finally:
        kill_group(live)
        dead.stdout.close()
        live.stdout.close()


SLEEPER = "import time; time.sleep(3600)\n"
QUICK = "print('done')\n"


def _launcher(tmp_path, name: str, script: str, env: dict) -> subprocess.Popen:
    path = tmp_path / f"{name}.py"
    path.write_text(script)
    out = open(tmp_path / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
    try:
        return spawn_python(["-m", "ft_core.launcher", "--nproc-per-node=1", "--monitor-interval=0.05",
                             f"--log-dir={tmp_path / name}", str(path)], env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    finally:
        out.close()


def test_the_next_launcher_removes_the_job_dir_of_a_sigkilled_one(tmp_path, runtime_dir):
    runtime = Path(runtime_dir)
    env = python_env(XDG_RUNTIME_DIR=runtime_dir)
    first = _launcher(tmp_path, "first", SLEEPER, env)
    try:
        def job_dirs() -> list[str]:
            return [os.path.join(d, n) for d, _, names in os.walk(runtime) for n in names if n == "launcher.sock"]

        [sock] = wait_for(job_dirs, 60, "the first launcher's control socket")
        first_dir = os.path.dirname(sock)
    finally:
        kill_group(first)  # SIGKILL to the launcher, its monitor and its worker
    assert os.path.isdir(first_dir)
    second = _launcher(tmp_path, "second", QUICK, env)
    try:
        assert second.wait(120) == 0, (tmp_path / "second.out").read_text()[-3000:]
    finally:
        kill_group(second)
    assert not os.path.exists(first_dir)
    # Only the per-user directory is left; the second launcher removed its own job dir at exit.
    [root] = os.listdir(runtime)
    assert os.listdir(runtime / root) == []


def test_claims_held_at_the_same_time_never_remove_each_other(tmp_path):
    root = tmp_path / "root"
    claims = [jobdir.claim_job_dir(str(root)) for _ in range(3)]
    try:
        assert all(os.path.isdir(c.job_dir.path) for c in claims)
    finally:
        for claim in claims:
            claim.release()
    assert os.listdir(root) == []


@pytest.mark.skipif(sys.platform != "linux", reason="flock on directories is Linux behaviour")
def test_the_sweep_skips_what_is_not_a_job_dir_of_ours(tmp_path):
    root = tmp_path / "root"
    claim = jobdir.claim_job_dir(str(root))
    claim.release()
    keep = root / "standalone-abc"  # a standalone monitor's directory: not the launcher's to remove
    keep.mkdir()
    (root / "notes.txt").write_text("x")
    link = root / "job-planted"
    link.symlink_to(tmp_path)
    claim = jobdir.claim_job_dir(str(root))
    claim.release()
    assert keep.is_dir() and (root / "notes.txt").exists() and link.is_symlink()
