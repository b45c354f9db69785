"""In-memory snapshots under the real ``ft_launcher``: the client API across a worker restart, and the
snapshot directory's lifetime (removed at the end of the job; after a SIGKILLed launcher, by the next launch).

Workers: ``snapshot_workers/plain.py`` (2 ranks, gloo). About 10 s and 15 s.
"""

from __future__ import annotations

import os

import psutil
import pytest
from helpers import REPO_ROOT, wait_for
from launcher_helpers import LauncherGroup

from ft_core.checkpoint_manifest import DIR_MANIFEST
from ft_core.event_file import read_events

PLAIN = os.path.join(REPO_ROOT, "tests", "integration", "snapshot_workers", "plain.py")


def _records(path) -> list[dict]:
    return read_events(str(path))[0] if os.path.exists(path) else []


def _job_snapshot_dir(slots: str) -> str:
    return os.path.dirname(os.path.dirname(slots))  # <shm>/ft-<uid>/job-<random>/world<W>/rank<R>


@pytest.mark.timeout(240)
def test_a_restarted_rank_resumes_from_the_snapshot_every_rank_holds(tmp_path):
    out = tmp_path / "out.jsonl"
    with LauncherGroup(tmp_path) as group:
        node = group.start("--max-restarts=1", script=(PLAIN,), SNAP_OUT=str(out), SNAP_STEPS="12",
                           SNAP_KILL_AT="7")
        assert node.wait(180) == 0, node.output()[-4000:]
    records = _records(out)
    resumed = {r["rank"]: r["resumed_step"] for r in records if r["cycle"] == 1 and "resumed_step" in r}
    assert resumed == {0: 6, 1: 6}  # rank 1 died after step 7: both hold 6, the newest whole snapshot
    ends = [r for r in records if "end_step" in r]
    assert {(r["rank"], r["cycle"], r["end_step"]) for r in ends} == {(0, 1, 12), (1, 1, 12)}
    assert {r["weight"] for r in ends} == {24.0}  # 12 steps of 2 ranks' all-reduced ones, none counted twice
    chosen = [e for e in node.events("resume_chosen") if e["cycle"] == 1]
    assert [(e["source"], e["step"]) for e in chosen] == [("snapshot", 6)]
    slot_dirs = {r["slots"] for r in records if "slots" in r}
    assert None not in slot_dirs and not any(os.path.exists(_job_snapshot_dir(s)) for s in slot_dirs)


@pytest.mark.timeout(240)
def test_the_next_launch_removes_the_snapshots_of_a_sigkilled_launcher(tmp_path):
    out = tmp_path / "out.jsonl"
    with LauncherGroup(tmp_path) as group:
        node = group.start(script=(PLAIN,), name="killed", SNAP_OUT=str(out), SNAP_STEPS="1000000")

        def snapshot_written() -> str | None:
            slot_dirs = [r["slots"] for r in _records(out) if r.get("slots")]
            return slot_dirs[0] if slot_dirs and os.path.exists(os.path.join(slot_dirs[0], "slot0", DIR_MANIFEST)) else None

        slots = wait_for(snapshot_written, 120, "a snapshot in shared memory")
        tree = [node.proc.pid, *(p.pid for p in psutil.Process(node.proc.pid).children(recursive=True))]
        node.proc.kill()  # SIGKILL: the launcher's cleanup never runs
        node.proc.wait()
        wait_for(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                                 for pid in tree), 30, "the workers to die with their launcher")
        assert os.path.exists(_job_snapshot_dir(slots))  # left behind, no owner

        again = group.start(script=(PLAIN,), name="again", SNAP_OUT=str(tmp_path / "again.jsonl"), SNAP_STEPS="2")
        assert again.wait(180) == 0, again.output()[-4000:]
    assert not os.path.exists(_job_snapshot_dir(slots))
    new_slot_dirs = {r["slots"] for r in _records(tmp_path / "again.jsonl") if r.get("slots")}
    assert new_slot_dirs and not any(os.path.exists(_job_snapshot_dir(s)) for s in new_slot_dirs)
