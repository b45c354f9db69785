"""``snapshot_every="auto"`` under real limits: a state without room is never copied, one with room is snapshotted.

Real limits the tests create: a 64 MiB tmpfs mounted as the snapshot directory, and a
memory cgroup (v2, else v1) whose limit a rank's process sets to its use plus a budget;
skipped, with the reason, where the machine permits neither. The rank is a real process
(``snapshot_workers/room.py``) running the default ``auto`` interval, at the step
timeouts are learned at (``learn``) and at the interval's first snapshot (``probe``); its
peak RSS (``ru_maxrss``) shows whether the state was copied. A few seconds per case.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from helpers import REPO_ROOT, free_port, kill_group, python_env, spawn_python, wait_for

ROOM = os.path.join(REPO_ROOT, "tests", "integration", "snapshot_workers", "room.py")
MIB = 1 << 20
#: A state three copies of which do not fit in half of a 64 MiB /dev/shm (nor four in half of a 96 MiB budget).
BIG_MB = 48
#: A state whose snapshots fit in both.
SMALL_MB = 2


def _env(tmp_path, state_mb: int, path: str, snapshot_dir: str, **extra: str) -> dict[str, str]:
    env = python_env(SNAP_MB=str(state_mb), SNAP_PATH=path, SNAP_DIR=snapshot_dir,
                     SNAP_JOB_DIR=str(tmp_path / f"job-{uuid.uuid4().hex[:8]}"), **extra)
    env.pop("LOCAL_WORLD_SIZE", None)  # one rank on the node: the default outside a launcher's worker
    return env


def _finish(procs: list[subprocess.Popen]) -> list[tuple[dict, str]]:
    try:
        done = [proc.communicate(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            kill_group(proc)
    for proc, (_, err) in zip(procs, done):
        assert proc.returncode == 0, err[-4000:]
    return [(json.loads(out.strip().splitlines()[-1]), err) for out, err in done]


def _start(env: dict[str, str]) -> subprocess.Popen:
    return spawn_python([ROOM], env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run(tmp_path, state_mb: int, path: str, snapshot_dir: str, **extra: str) -> tuple[dict, str]:
    return _finish([_start(_env(tmp_path, state_mb, path, snapshot_dir, **extra))])[0]


def _state_files(directory: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(directory) for f in files if f == "state.pt"]


def _off_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "in-memory snapshots are off" in line]


@pytest.fixture
def small_shm(tmp_path):
    """A 64 MiB tmpfs at ``tmp_path/shm``, unmounted on every path."""
    mount = tmp_path / "shm"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield str(mount)
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


@pytest.fixture
def memory_cgroup():
    """A new memory cgroup (v2 where the root delegates memory, else v1): its directory and file names."""
    name = f"ft-test-{uuid.uuid4().hex[:12]}"
    v2 = "/sys/fs/cgroup"
    try:
        with open(os.path.join(v2, "cgroup.subtree_control"), encoding="ascii") as control:
            delegated = "memory" in control.read().split()
    except OSError:
        delegated = False
    if delegated:
        base, limit, usage = v2, "memory.max", "memory.current"
    elif os.path.exists("/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        base, limit, usage = "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
    else:
        pytest.skip("no memory cgroup controller to make a budget with (neither v2 delegated at the root nor v1)")
    directory = os.path.join(base, name)
    try:
        os.mkdir(directory)
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup here: {exc}")
    try:
        yield {"SNAP_CGROUP": directory, "SNAP_LIMIT_FILE": limit, "SNAP_USAGE_FILE": usage}
    finally:
        def removed() -> bool:  # once the rank's process is gone (it has exited: the cgroup empties)
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                return True
            except OSError:
                return False
            return True

        wait_for(removed, 30, f"the test's cgroup {directory} removed")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", ["learn", "probe"])
def test_a_state_without_room_in_a_small_dev_shm_is_never_copied(tmp_path, small_shm, path):
    result, err = _run(tmp_path, BIG_MB, path, small_shm)
    assert result["taken"] == [] and result["off"]
    # No copy: the peak RSS did not grow by the state's size (a copy would add all of it).
    assert (result["after_kib"] - result["before_kib"]) * 1024 < BIG_MB * MIB / 2, result
    (line,) = _off_lines(err)
    assert line.startswith("INFO ") and "no copy was made" in line and "/dev/shm" in line, line
    assert _state_files(small_shm) == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", ["learn", "probe"])
def test_with_room_in_the_small_dev_shm_snapshots_are_taken(tmp_path, small_shm, path):
    result, err = _run(tmp_path, SMALL_MB, path, small_shm)
    assert not result["off"] and _off_lines(err) == []
    assert result["taken"][:2] == ([3, 10] if path == "learn" else [10, 20]), result
    assert len(_state_files(small_shm)) == 2  # both slots


@pytest.mark.timeout(240)
def test_a_state_over_the_memory_cgroup_budget_is_never_copied(tmp_path, memory_cgroup):
    # The snapshot directory is on the test's own filesystem and the node has GBs available: the cgroup refuses.
    result, err = _run(tmp_path, BIG_MB, "learn", str(tmp_path / "snapshots"), SNAP_BUDGET_MB="96", **memory_cgroup)
    assert result["taken"] == [] and result["off"]
    assert (result["after_kib"] - result["before_kib"]) * 1024 < BIG_MB * MIB / 2, result
    (line,) = _off_lines(err)
    assert "no copy was made" in line and "memory cgroup" in line and memory_cgroup["SNAP_CGROUP"] in line, line
    assert _state_files(str(tmp_path / "snapshots")) == []


@pytest.mark.timeout(240)
def test_within_the_memory_cgroup_budget_snapshots_are_taken(tmp_path, memory_cgroup):
    result, err = _run(tmp_path, SMALL_MB, "learn", str(tmp_path / "snapshots"), SNAP_BUDGET_MB="96",
                       **memory_cgroup)
    assert not result["off"] and _off_lines(err) == []
    assert result["taken"][:2] == [3, 10], result


@pytest.mark.timeout(240)
def test_one_rank_without_room_and_no_rank_copies(tmp_path, small_shm):
    # Rank 0's snapshot directory has room (the test's filesystem); rank 1's is the 64 MiB tmpfs.
    roomy = str(tmp_path / "snapshots")
    port = str(free_port())
    procs = []
    for rank, directory in enumerate((roomy, small_shm)):
        procs.append(_start(_env(tmp_path, BIG_MB, "learn", directory, RANK=str(rank), WORLD_SIZE="2",
                                 MASTER_ADDR="127.0.0.1", MASTER_PORT=port)))
    (first, first_err), (second, second_err) = _finish(procs)
    for result in (first, second):
        assert result["taken"] == [] and result["off"]
        assert (result["after_kib"] - result["before_kib"]) * 1024 < BIG_MB * MIB / 2, result
    assert _off_lines(first_err) == [] and len(_off_lines(second_err)) == 1  # one line, from the rank without room
    assert _state_files(roomy) == [] and _state_files(small_shm) == []
