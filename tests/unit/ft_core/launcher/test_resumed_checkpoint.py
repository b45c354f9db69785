"""What a cycle resumed from, and condemning it (:mod:`ft_core.launcher.resumed_checkpoint`): the ranks' word
first, a snapshot over the disk checkpoint it replaced, Megatron-LM's tracker when the ranks said nothing."""

from __future__ import annotations

import os

from ft_core.checkpoint_manifest import has_bad_mark
from ft_core.events import CheckpointLoaded, RankException, ResumeChosen, ResumeSource
from ft_core.launcher.cycle_observations import CycleObservations
from ft_core.launcher.resumed_checkpoint import mark_checkpoint_bad, megatron_load_at_start, resumed_from

TRACKER = "latest_checkpointed_iteration.txt"


def _megatron_dir(tmp_path, *iterations: int, tracker: int) -> str:
    for iteration in iterations:
        os.makedirs(tmp_path / f"iter_{iteration:07d}")
    (tmp_path / TRACKER).write_text(f"{tracker}\n")
    return str(tmp_path)


def _reported(first_iteration: int) -> RankException:
    return RankException(rank=0, pid=100, exception_type="RuntimeError", frames=["pretrain.py:1 train"],
                         iteration=first_iteration, first_iteration=first_iteration)


def test_the_ranks_word_wins_a_snapshot_names_itself_and_megatrons_tracker_is_the_last_resort(tmp_path):
    directory = _megatron_dir(tmp_path, 30, 40, tracker=40)
    seen = CycleObservations(cycle=2)
    seen.load_dir, seen.tracker_at_start = megatron_load_at_start(["pretrain_gpt.py", f"--load={directory}"])
    assert (seen.load_dir, seen.tracker_at_start) == (directory, 40)
    assert resumed_from(seen) is None  # no rank reported an iteration yet: nothing confirms the tracker
    seen.exceptions.append(_reported(40))
    assert resumed_from(seen) == (os.path.join(directory, "iter_0000040"), 40)
    seen.loaded = CheckpointLoaded(rank=0, cycle=2, checkpoint="/ckpt/step=30.ckpt", step=30, time=1.0)
    assert resumed_from(seen) == ("/ckpt/step=30.ckpt", 30)  # what the ranks said they loaded
    seen.resumed_snapshot = ResumeChosen(cycle=2, source=ResumeSource.SNAPSHOT, step=35, disk_step=30, world_size=2,
                                         reason="newer", snapshot="snapshot:35:ab12")
    assert resumed_from(seen) == ("snapshot:35:ab12", 35)  # never the disk checkpoint the snapshot replaced


def test_a_condemned_megatron_checkpoint_is_marked_and_the_tracker_moved_back_to_the_older_one(tmp_path):
    directory = _megatron_dir(tmp_path, 30, 40, tracker=40)
    seen = CycleObservations(cycle=3)  # the ranks never said what they loaded: unmodified Megatron-LM
    bad = os.path.join(directory, "iter_0000040")
    record = mark_checkpoint_bad(seen, 3, bad, "the same fault twice after resuming from it", "/nonexistent.sock")
    assert record is not None and record.checkpoint == bad and "now names iteration 30" in record.reason
    assert has_bad_mark(bad)
    assert (tmp_path / TRACKER).read_text().strip() == "30"
    assert (tmp_path / f"{TRACKER}.bad-40").read_text().strip() == "40"  # the tracker as it was


def test_a_checkpoint_the_ranks_named_is_marked_and_its_tracker_left_alone(tmp_path):
    directory = _megatron_dir(tmp_path, 30, 40, tracker=40)
    seen = CycleObservations(cycle=3)
    bad = os.path.join(directory, "iter_0000040")
    seen.loaded = CheckpointLoaded(rank=0, cycle=3, checkpoint=bad, step=40, time=1.0)  # an integration said so
    record = mark_checkpoint_bad(seen, 3, bad, "bad", "/nonexistent.sock")
    assert record is not None and has_bad_mark(bad)
    assert (tmp_path / TRACKER).read_text().strip() == "40"  # the integration skips marked checkpoints itself
    # A checkpoint on another node's disk is that node's to mark: nothing here, no record.
    assert mark_checkpoint_bad(seen, 3, str(tmp_path / "elsewhere" / "iter_0000050"), "bad", "/x.sock") is None
