"""A 2-rank Lightning job under ``ft_launcher`` with ``snapshot_every=2``, killed between two checkpoints.

Checkpoints every 10 steps, a rank SIGKILLed at a random step between the checkpoints of steps 10
and 20 (or before the first one): the restarted ranks agree on the newest snapshot both hold and
resume from it, the goodput report counts at most ``snapshot_every`` steps of recomputation (and what
a resume from disk would have cost), and no snapshot is left in shared memory after the job. About
20 s each; a slow snapshot is not taken for a hang, with ``snapshot_every=6`` and with the default
(about 20 s each); and with the default arguments (``snapshot_every="auto"``) the job takes snapshots
at the interval derived from their cost, the same steps on both ranks, resumes from one after a kill
and keeps the interval (about 25 s).
"""

from __future__ import annotations

import os
import random

import pytest
from lightning_scripts.harness import launch, of, reports

from ft_core.launcher.observability.report import build_report, load_records
from ft_core.snapshots.interval import FIRST_EVERY

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
    slot_dirs = {run["snapshot_slots"] for run in runs.values()}
    assert None not in slot_dirs and len({os.path.dirname(os.path.dirname(s)) for s in slot_dirs}) == 1
    assert not any(os.path.exists(os.path.dirname(os.path.dirname(s))) for s in slot_dirs)


@pytest.mark.timeout(480)
@pytest.mark.parametrize("every", [("--snapshot-every=6",), ()], ids=["every-6", "default-auto"])
def test_a_slow_snapshot_is_not_a_hang_under_timeouts_learned_from_short_steps(tmp_path, every):
    # Sections mode, 50 ms steps, the step timeout learned after 3 steps (x5, floor 1 s); a snapshot every
    # 6 steps (or as "auto" decides: its cost asks for one every 1500 steps) whose build takes 1.5 s (the
    # model's on_save_checkpoint, which Lightning calls for it). The step timeouts are learned at takes a
    # snapshot, so the learned step timeout has seen one: no false kill.
    result, events = launch(tmp_path, "sections", {"kind": "kill", "rank": 1, "step": 1000}, "--max-steps=14",
                            "--every-n-steps=100", *every, "--step-sleep=0.05", "--save-sleep=1.5",
                            ft_flags=("--ft-safety-factor=5",))
    assert result.returncode == 0, result.output[-6000:]
    assert of(events, "hang_detected") == [] and [e["cycle"] for e in of(events, "cycle_start")] == [0]
    assert reports(tmp_path)[0, 0]["end_step"] == 14


AUTO_MAX_STEPS = 50
AUTO_KILL_STEP = 40


@pytest.mark.timeout(480)
def test_by_default_snapshots_follow_the_interval_derived_from_their_cost_and_a_kill_resumes_from_one(tmp_path):
    # Default arguments: snapshot_every="auto". 0.2 s steps of a tiny model: a snapshot at the step timeouts
    # are learned at (3), the interval from its measured cost from step 10 on (a few steps here); rank 1
    # killed at step 40, no disk checkpoint before the end.
    result, events = launch(tmp_path, "heartbeats", {"kind": "kill", "rank": 1, "step": AUTO_KILL_STEP},
                            f"--max-steps={AUTO_MAX_STEPS}", "--every-n-steps=1000", "--step-sleep=0.2",
                            "--save-sleep=0")
    assert result.returncode == 0, result.output[-6000:]
    assert [e["cycle"] for e in of(events, "cycle_start")] == [0, 1]
    runs = reports(tmp_path)
    taken = [runs[rank, 0]["snapshots"] for rank in (0, 1)]
    # Every rank snapshots the same steps (the interval is agreed), each a multiple of the interval then in force.
    assert taken[0][:len(taken[1])] == taken[1] and len(taken[1]) >= 2, taken  # at 3, 10, then as measured
    assert taken[0][0] == [3, FIRST_EVERY]  # learn_step: before any measurement
    assert all(step % every == 0 for step, every in taken[0][1:]), taken[0]
    (resumed,) = [e for e in of(events, "resume_chosen") if e["cycle"] == 1]
    assert resumed["source"] == "snapshot", resumed
    at = dict(map(tuple, taken[1]))
    assert resumed["step"] in at and AUTO_KILL_STEP - resumed["step"] <= 2 * at[resumed["step"]], (resumed, taken)
    # The resumed run keeps the interval learned (it is in the callback's state, in the snapshot): no new probe.
    learned = at[resumed["step"]] if resumed["step"] >= FIRST_EVERY else FIRST_EVERY
    assert runs[0, 1]["start_snapshot_every"] == runs[1, 1]["start_snapshot_every"] == learned
    assert runs[0, 1]["end_step"] == runs[1, 1]["end_step"] == AUTO_MAX_STEPS
    again = runs[0, 1].get("snapshots", [])
    assert again == runs[1, 1].get("snapshots", []) and all(step % every == 0 for step, every in again)
