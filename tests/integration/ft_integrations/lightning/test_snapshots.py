"""A 2-rank Lightning job under ``ft_launcher`` with ``snapshot_every=2``, killed between two checkpoints.

Checkpoints every 10 steps, a rank SIGKILLed at a random step between the checkpoints of steps 10
and 20 (or before the first one): the restarted ranks agree on the newest snapshot both hold and
resume from it, the goodput report counts at most ``snapshot_every`` steps of recomputation (and what
a resume from disk would have cost), and no snapshot is left in shared memory after the job. About
20 s each; and a slow snapshot is not taken for a hang (about 20 s).
"""

from __future__ import annotations

import os
import random

import pytest
from lightning_scripts.harness import launch, of, reports

from ft_core.launcher.report import build_report, load_records

SNAPSHOT_EVERY = 2
MAX_STEPS = 24


@pytest.mark.timeout(480)
# A kill at least two snapshot intervals after the disk checkpoint (step 10): at step 12 the snapshot of 12 may
# still be written, and then the newest whole one is 10, no newer than the disk checkpoint (disk is right).
@pytest.mark.parametrize(("first", "last", "disk_step"), [(14, 19, 10), (5, 9, None)],
                         ids=["between-checkpoints", "before-the-first-checkpoint"])
def test_a_kill_between_checkpoints_resumes_from_the_newest_snapshot(tmp_path, first, last, disk_step):
    # With a disk checkpoint the snapshot replaces its load; before the first one, Lightning loads nothing
    # and the callback restores the snapshot in on_fit_start.
    kill_step = random.Random().randint(first, last)
    result, events = launch(tmp_path, "heartbeats", {"kind": "kill", "rank": 1, "step": kill_step},
                            f"--max-steps={MAX_STEPS}", "--every-n-steps=10", f"--snapshot-every={SNAPSHOT_EVERY}",
                            "--step-sleep=0.05", "--save-sleep=0.05")
    assert result.returncode == 0, result.output[-6000:]
    assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1], f"kill at step {kill_step}"
    first, resumed = of(events, "resume_chosen")
    assert (first["cycle"], first["source"], first["step"]) == (0, "disk", None)  # a fresh start
    assert (resumed["cycle"], resumed["source"], resumed.get("disk_step")) == (1, "snapshot", disk_step), resumed
    # The newest snapshot both ranks held whole: at most snapshot_every steps before the kill.
    assert kill_step - SNAPSHOT_EVERY <= resumed["step"] <= kill_step, (kill_step, resumed)
    assert resumed["step"] % SNAPSHOT_EVERY == 0 and resumed["world_size"] == 2
    runs = reports(tmp_path)
    assert runs[0, 1]["start_step"] == runs[1, 1]["start_step"] == resumed["step"]
    assert runs[0, 1]["end_step"] == runs[1, 1]["end_step"] == MAX_STEPS

    # The goodput report: the fault's recomputation runs from the snapshot, not from the checkpoint of step 10.
    report = build_report(load_records([str(tmp_path / "ft_events.jsonl")]))
    (fault,) = report.faults
    assert (fault.resumed_from, fault.resume_step, fault.checkpoint_iteration) == ("snapshot", resumed["step"],
                                                                                   resumed["step"])
    assert fault.recompute_s is not None and fault.recompute_without_snapshots_s is not None
    assert fault.recompute_s < fault.recompute_without_snapshots_s
    assert kill_step - fault.resume_step <= SNAPSHOT_EVERY

    # The launcher removed the job's snapshots when it ended.
    stores = {run["snapshot_store"] for run in runs.values()}
    assert None not in stores and len({os.path.dirname(os.path.dirname(s)) for s in stores}) == 1
    assert not any(os.path.exists(os.path.dirname(os.path.dirname(s))) for s in stores)


@pytest.mark.timeout(480)
def test_a_slow_snapshot_is_not_a_hang_under_timeouts_learned_from_short_steps(tmp_path):
    # Sections mode, 50 ms steps, the step timeout learned after 3 steps (x5, floor 1 s); a snapshot every
    # 6 steps whose build takes 1.5 s (the model's on_save_checkpoint, which Lightning calls for it). The
    # first step of a run takes a snapshot, so the learned step timeout has seen one: no false kill.
    result, events = launch(tmp_path, "sections", {"kind": "kill", "rank": 1, "step": 1000}, "--max-steps=14",
                            "--every-n-steps=100", "--snapshot-every=6", "--step-sleep=0.05", "--save-sleep=1.5",
                            ft_flags=("--ft-safety-factor=5",))
    assert result.returncode == 0, result.output[-6000:]
    assert of(events, "hang_detected") == [] and [e["cycle"] for e in of(events, "cycle_start")] == [0]
    assert reports(tmp_path)[0, 0]["end_step"] == 14
