"""A resume from an in-memory snapshot is guarded as one from disk, under the real ``ft_launcher``.

Workers: ``snapshot_workers/plain.py`` (2 ranks, gloo, a snapshot every 2 steps, no disk
checkpoint). A snapshot holding NaN is skipped at the resume (the finite check) for the older
one; a snapshot that is finite yet makes the next step fail twice is condemned by the fault
policy's bad-checkpoint rule, and the next cycle resumes without it instead of stopping the job
as a deterministic fault. The healthy resume beside them:
``test_node.py::test_a_restarted_rank_resumes_from_the_snapshot_every_rank_holds``. About 10 s and 20 s.
"""

from __future__ import annotations

import os

import pytest
from helpers import REPO_ROOT
from launcher_helpers import LauncherGroup

from ft_core.event_file import read_events

PLAIN = os.path.join(REPO_ROOT, "tests", "integration", "snapshot_workers", "plain.py")


def _records(path) -> list[dict]:
    return read_events(str(path))[0]


@pytest.mark.timeout(240)
def test_a_snapshot_holding_nan_is_skipped_for_the_older_one(tmp_path):
    out = tmp_path / "out.jsonl"
    with LauncherGroup(tmp_path) as group:
        # The weights turn NaN at step 6 (its snapshot holds the NaN); rank 1 dies after step 7.
        node = group.start("--max-restarts=1", script=(PLAIN,), SNAP_OUT=str(out), SNAP_STEPS="12",
                           SNAP_NAN_AT="6", SNAP_KILL_AT="7")
        assert node.wait(180) == 0, node.output()[-4000:]
    records = _records(out)
    resumed = {r["rank"]: r["resumed_step"] for r in records if r["cycle"] == 1 and "resumed_step" in r}
    assert resumed == {0: 4, 1: 4}  # not 6: its weight holds NaN
    ends = [r for r in records if "end_step" in r]
    assert {(r["rank"], r["cycle"], r["end_step"], r["weight"]) for r in ends} == {(0, 1, 12, 24.0), (1, 1, 12, 24.0)}
    (chosen,) = [e for e in node.events("resume_chosen") if e["cycle"] == 1]
    assert (chosen["source"], chosen["step"], chosen["snapshot"]) == ("snapshot", 4, "snapshot:4:0.1")
    assert "skipped the snapshot of step 6: non-finite values in weight" in chosen["reason"], chosen["reason"]


@pytest.mark.timeout(240)
def test_a_snapshot_that_fails_the_next_step_twice_is_condemned_and_the_job_resumes_without_it(tmp_path):
    out = tmp_path / "out.jsonl"
    with LauncherGroup(tmp_path) as group:
        # Rank 1 dies after step 7 of cycle 0; resumed from the snapshot of step 6, it raises at step 7.
        node = group.start("--max-restarts=3", script=(PLAIN,), SNAP_OUT=str(out), SNAP_STEPS="12",
                           SNAP_KILL_AT="7", SNAP_BAD_STEP="6")
        assert node.wait(180) == 0, node.output()[-4000:]
        events = node.events()
    records = _records(out)
    resumed = {(r["cycle"], r["rank"]): r["resumed_step"] for r in records if "resumed_step" in r}
    # Cycles 1 and 2 resume from the snapshot of 6 and fail alike at step 7; it is condemned, and cycle 3
    # starts over (no disk checkpoint; the older snapshot was discarded at cycle 1's resume).
    assert resumed == {(c, r): s for c, s in ((0, 0), (1, 6), (2, 6), (3, 0)) for r in (0, 1)}, resumed
    assert {(r["cycle"], r["end_step"], r["weight"]) for r in records if "end_step" in r} == {(3, 12, 24.0)}
    fingerprints = [e for e in events if e["event"] == "fault_fingerprint"]
    assert [f.get("resumed_from") for f in fingerprints][-2:] == ["snapshot:6:0.1"] * 2
    (marked,) = [e for e in events if e["event"] == "checkpoint_marked_bad"]
    assert marked["checkpoint"] == "snapshot:6:0.1" and "twice within 10 steps" in marked["reason"]
    (decision,) = [e for e in events if e["event"] == "fault_decision" and e["action"] == "mark_checkpoint_bad"]
    assert decision["cycle"] == 2 and decision["checkpoint"] == "snapshot:6:0.1"
    chosen = {e["cycle"]: (e["source"], e["step"]) for e in events if e["event"] == "resume_chosen"}
    assert chosen[3] == ("disk", None), chosen
    assert not any(os.path.exists(r["slots"]) for r in records if r.get("slots"))
