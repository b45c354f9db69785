"""Megatron-LM's tracker as the launcher reads and moves it (real files in a per-test directory)."""

from __future__ import annotations

import os

from ft_core.checkpoint_manifest import mark_bad
from ft_core.megatron_tracker import (
    TRACKER_FILENAME,
    checkpoint_dir,
    inferred_resume,
    load_dir,
    roll_back,
    tracker_iteration,
)


def megatron_save_dir(path, iterations, tracker):
    for iteration in iterations:
        os.makedirs(checkpoint_dir(str(path), iteration))
    (path / TRACKER_FILENAME).write_text(f"{tracker}\n")
    return str(path)


def test_the_load_directory_is_megatrons_load_argument_in_either_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_dir(["-u", "pretrain_gpt.py", "--save", "/s", "--load", "/ckpt"]) == "/ckpt"
    assert load_dir(["pretrain_gpt.py", "--load=ckpt"]) == str(tmp_path / "ckpt")  # the workers' cwd is ours
    assert load_dir(["pretrain_gpt.py", "--save=/s", "--load"]) is None  # no value
    assert load_dir(["train.py", "--loader=x"]) is None


def test_a_resume_is_inferred_only_when_the_first_reported_iteration_confirms_the_tracker(tmp_path):
    save = megatron_save_dir(tmp_path, (30, 40), tracker=40)
    assert tracker_iteration(save) == 40
    assert inferred_resume(save, 40, [40, 40]) == (checkpoint_dir(save, 40), 40)
    assert inferred_resume(save, 40, [None, 43]) == (checkpoint_dir(save, 40), 40)  # after Megatron-LM's warm-up
    # A rank that reported an earlier iteration did not resume from 40 (a fresh start, --finetune, --ckpt-step 30).
    assert inferred_resume(save, 40, [0, 40]) is None
    assert inferred_resume(save, 40, [30]) is None
    assert inferred_resume(save, 40, [None]) is None  # nothing confirms it
    assert inferred_resume(save, None, [40]) is None  # no tracker when the cycle started: a fresh start
    assert inferred_resume(save, 50, [50]) is None  # the tracker names a checkpoint that is not there
    assert inferred_resume(None, 40, [40]) is None


def test_rolling_back_points_the_tracker_at_the_newest_older_checkpoint_not_marked_bad(tmp_path):
    save = megatron_save_dir(tmp_path, (10, 20, 30, 40), tracker=40)
    mark_bad(checkpoint_dir(save, 30), "bad before")
    mark_bad(checkpoint_dir(save, 40), "NaN at the first step, twice")
    assert roll_back(checkpoint_dir(save, 40)) == 20
    assert (tmp_path / TRACKER_FILENAME).read_text() == "20\n"
    assert (tmp_path / f"{TRACKER_FILENAME}.bad-40").read_text() == "40\n"  # as it was
    # Another node of the job, acting on the same decision, finds the tracker moved already: nothing changes.
    assert roll_back(checkpoint_dir(save, 40)) is None
    assert (tmp_path / TRACKER_FILENAME).read_text() == "20\n"


def test_without_an_older_checkpoint_the_tracker_is_left_alone(tmp_path):
    save = megatron_save_dir(tmp_path, (40,), tracker=40)
    assert roll_back(checkpoint_dir(save, 40)) is None
    assert (tmp_path / TRACKER_FILENAME).read_text() == "40\n"
    assert not (tmp_path / f"{TRACKER_FILENAME}.bad-40").exists()
    (tmp_path / TRACKER_FILENAME).write_text("release\n")  # Megatron's release checkpoints: not an iteration
    assert roll_back(checkpoint_dir(save, 40)) is None and tracker_iteration(save) is None


def test_the_names_of_megatron_checkpoints_have_one_home():
    # TRACKER_FILENAME, checkpoint_dir and iteration_of are defined here and imported from here only:
    # no module defines the tracker's name again or hands these names on (the hooks took it from their state).
    import re

    from helpers import REPO_ROOT

    names = ("TRACKER_FILENAME", "checkpoint_dir", "iteration_of")
    found = []
    for package in ("ft_core", "ft_integrations"):
        for directory, _, files in os.walk(os.path.join(REPO_ROOT, package)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(directory, name)
                text = open(path, encoding="utf-8").read()
                home = os.path.join(directory, name) == os.path.join(REPO_ROOT, "ft_core", "megatron_tracker.py")
                if not home and re.search(r"""=\s*["']latest_checkpointed_iteration\.txt["']""", text):
                    found.append(f"{os.path.relpath(path, REPO_ROOT)} defines the tracker's name")
                for module, imported in re.findall(r"^\s*from ([\w.]+) import \(?([^)\n]*(?:\n[^)\n]*)*?)\)?$",
                                                   text, re.M):
                    if module != "ft_core.megatron_tracker" and set(re.findall(r"\w+", imported)) & set(names):
                        found.append(f"{os.path.relpath(path, REPO_ROOT)} imports them from {module}")
                if "__all__" in text and not home:
                    exported = re.search(r"__all__ = \[([^\]]*)\]", text)
                    if exported and set(re.findall(r'"(\w+)"', exported.group(1))) & set(names):
                        found.append(f"{os.path.relpath(path, REPO_ROOT)} exports them")
    assert found == []
