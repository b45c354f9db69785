"""End to end: bad checkpoints and deterministic faults in a 2-rank Lightning DDP job under the real ``ft_launcher``.

``lightning_scripts/bad_checkpoint.py`` (gloo, CPU, a linear model, ``ModelCheckpoint``
every 2 steps with ``save_last``). Measured on the shared, loaded 2-core machine: the first
test 32-51 s (3 cycles of about 10 s, most of it each cycle's start of Lightning and DDP),
the second 26-38 s (2 cycles of 30 steps).
"""

from __future__ import annotations

import json

import pytest
from lightning_scripts.harness import launch_script, of, reports

from ft_core.launcher.options import DEFAULT_NO_RESTART_EXIT_CODE


@pytest.mark.timeout(480)
def test_bad_checkpoints_are_skipped_or_marked_bad_and_the_job_finishes_from_the_newest_good_one(tmp_path):
    # Cycle 0 saves steps 2..8, then damages the newest three and crashes (a transient fault):
    #   step 8 (its file and last.ckpt) truncated      -> rejected at load: no restart spent on it;
    #   step 6 with a NaN weight                         -> rejected at load (finite check): none either;
    #   step 4 with a corrupt, finite momentum (1e38)    -> loads; the loss 2 steps later is infinite:
    #                                                       NonFiniteLossError, marked bad: one restart.
    # Cycle 2 skips all three and finishes from step 2. Both ranks pick the same checkpoint each time.
    ckpt = tmp_path / "ckpt"
    corrupt = {"8": "truncate", "6": "nan_weights", "4": "huge_momentum"}
    result, events = launch_script(tmp_path, "bad_checkpoint.py", f"--ckpt-dir={ckpt}", f"--out-dir={tmp_path}",
                                   f"--corrupt={json.dumps(corrupt)}", max_restarts=3)
    assert result.returncode == 0, result.output[-6000:]
    assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1, 2]
    step = {s: str(ckpt / f"epoch=0-step={s}.ckpt") for s in (2, 4, 6, 8)}
    last = str(ckpt / "last.ckpt")

    loaded = {(e["cycle"], e["rank"]): (e["checkpoint"], e["step"]) for e in of(events, "checkpoint_loaded")}
    assert loaded == {(1, 0): (step[4], 4), (1, 1): (step[4], 4), (2, 0): (step[2], 2), (2, 1): (step[2], 2)}
    rejected = {(e["cycle"], e["rank"], e["checkpoint"]): e["reason"] for e in of(events, "checkpoint_rejected")}
    for cycle in (1, 2):
        for rank in (0, 1):
            assert "torn or truncated" in rejected.pop((cycle, rank, last))
            assert "torn or truncated" in rejected.pop((cycle, rank, step[8]))
            assert rejected.pop((cycle, rank, step[6])).startswith("non-finite values in state_dict.layer.weight")
            if cycle == 2:
                reason = rejected.pop((cycle, rank, step[4]))
                assert reason.startswith("marked bad: ") and "non-finite loss" in reason, reason
    assert rejected == {}

    fingerprint = of(events, "fault_fingerprint")[-1]
    assert (fingerprint["kind"], fingerprint["resumed_from"], fingerprint["resumed_step"]) == \
        ("nonfinite_loss", step[4], 4)
    (marked,) = of(events, "checkpoint_marked_bad")
    assert marked["checkpoint"] == step[4]
    runs = reports(tmp_path)
    assert {k: r["start_step"] for k, r in runs.items()} == {(0, 0): 0, (1, 0): 0, (0, 1): 4, (1, 1): 4,
                                                             (0, 2): 2, (1, 2): 2}
    assert runs[0, 2]["end_step"] == runs[1, 2]["end_step"] == 12
    assert (tmp_path / "finished.flag").exists()


@pytest.mark.timeout(480)
def test_a_deterministic_value_error_stops_after_two_cycles_with_the_do_not_requeue_code(tmp_path):
    # Checkpoints every 16 steps: cycle 1 resumes from step 16 and fails at 30, 14 steps later, past
    # the 10 steps (suspect_checkpoint_steps) in which a fault counts against the checkpoint first;
    # so the identical fault twice, with no new checkpoint in between, is the deterministic-fault rule's.
    result, events = launch_script(tmp_path, "bad_checkpoint.py", f"--ckpt-dir={tmp_path / 'ckpt'}",
                                   f"--out-dir={tmp_path}", "--max-steps=40", "--every=16", "--raise-at=30",
                                   "--raise-rank=1", max_restarts=5)
    assert result.returncode == DEFAULT_NO_RESTART_EXIT_CODE, result.output[-6000:]
    assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1]
    fingerprints = of(events, "fault_fingerprint")
    assert [(f["kind"], f["exception_type"], f["culprits"], f["iteration"]) for f in fingerprints] == \
        [("exception", "ValueError", [1], 30)] * 2
    headline = next(line for line in result.output.splitlines() if "stopping the job" in line)
    assert "ValueError" in headline and "rank 1" in headline and "iteration 30" in headline, headline
    assert not of(events, "checkpoint_marked_bad")
    runs = reports(tmp_path)
    # Cycle 1 resumed from the disk checkpoint of 16 or, with the default in-memory snapshots, from a newer
    # snapshot: both ranks from the same step, and the fingerprint then names the snapshot, not the disk
    # checkpoint (a fault after a snapshot's resume is no evidence against the disk checkpoint).
    assert runs[(0, 0)]["start_step"] == runs[(1, 0)]["start_step"] == 0
    resumed = runs[(0, 1)]["start_step"]
    assert runs[(1, 1)]["start_step"] == resumed and 16 <= resumed < 30, runs
    chosen = [e for e in of(events, "resume_chosen") if e["cycle"] == 1]
    if chosen and chosen[0]["source"] == "snapshot":
        assert chosen[0]["step"] == resumed and fingerprints[1]["resumed_from"] == chosen[0]["snapshot"]
    assert not (tmp_path / "finished.flag").exists()


@pytest.mark.timeout(480)
@pytest.mark.parametrize("kind", ["nan_weights", "huge_momentum"])
def test_a_bad_snapshot_is_skipped_or_condemned_and_the_job_finishes_without_it(tmp_path, kind):
    # Disk checkpoints at step 7 (and 14), a snapshot every 2 steps. Cycle 0 damages its live state at the
    # end of step 10, so the snapshot of 10 holds the damage (not the older ones, nor the disk checkpoint),
    # and crashes before it trains on it.
    #   nan_weights   -> cycle 1's finite check skips the snapshot of 10: resumes from the snapshot of 8.
    #   huge_momentum -> finite: cycle 1 resumes from it, the loss 2 steps later is infinite, the NaN watch
    #                    raises; the snapshot is condemned (not the disk checkpoint): cycle 2 resumes from
    #                    disk (step 7), the older snapshot having been discarded at cycle 1's resume.
    ckpt = tmp_path / "ckpt"
    result, events = launch_script(tmp_path, "bad_checkpoint.py", f"--ckpt-dir={ckpt}", f"--out-dir={tmp_path}",
                                   "--max-steps=16", "--every=7", "--snapshot-every=2",
                                   f"--damage-state=10:{kind}", max_restarts=3)
    assert result.returncode == 0, result.output[-6000:]
    chosen = {e["cycle"]: e for e in of(events, "resume_chosen")}
    runs = reports(tmp_path)
    if kind == "nan_weights":
        assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1]
        assert (chosen[1]["source"], chosen[1]["step"]) == ("snapshot", 8), chosen[1]
        assert chosen[1]["snapshot"] == "snapshot:8:0.1"
        assert "skipped the snapshot of step 10: non-finite values in state_dict.layer.weight" in chosen[1]["reason"]
        assert not of(events, "checkpoint_marked_bad")
        starts = {0: 0, 1: 8}
    else:
        assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1, 2]
        assert (chosen[1]["source"], chosen[1]["step"], chosen[1]["snapshot"]) == ("snapshot", 10, "snapshot:10:0.1")
        fingerprint = of(events, "fault_fingerprint")[-1]
        assert (fingerprint["kind"], fingerprint["resumed_from"], fingerprint["resumed_step"]) == \
            ("nonfinite_loss", "snapshot:10:0.1", 10)
        (marked,) = of(events, "checkpoint_marked_bad")
        assert marked["checkpoint"] == "snapshot:10:0.1" and "non-finite loss" in marked["reason"], marked
        assert (chosen[2]["source"], chosen[2]["step"]) == ("disk", 7), chosen[2]
        starts = {0: 0, 1: 10, 2: 7}
    assert {k: r["start_step"] for k, r in runs.items()} == {(rank, c): s for c, s in starts.items() for rank in (0, 1)}
    last = max(starts)
    assert runs[0, last]["end_step"] == runs[1, last]["end_step"] == 16
    assert not list(ckpt.glob("*.bad.json"))  # a snapshot's fault never marks the disk checkpoint
    assert (tmp_path / "finished.flag").exists()
