"""Checkpoint manifests: written beside a checkpoint, checked before a resume; the fallback choice (no processes)."""

from __future__ import annotations

import json
import os

import pytest

from ft_core.checkpoint_manifest import (
    DIR_MANIFEST,
    Rejection,
    first_accepted,
    manifest_path,
    mark_bad,
    read_manifest,
    save_file_atomically,
    verified_version,
    verify,
    write_dir_manifest,
)


def _save(path, data: bytes, step: int = 1) -> None:
    def write(temp: str) -> None:
        with open(temp, "wb") as handle:
            handle.write(data)

    save_file_atomically(str(path), write, global_step=step, run="run-1")


def test_a_saved_file_verifies_and_its_manifest_says_what_was_written(tmp_path):
    path = tmp_path / "last.ckpt"
    _save(path, b"x" * 1000, step=40)
    assert path.read_bytes() == b"x" * 1000 and verify(str(path)) is None
    manifest = read_manifest(str(path))
    assert manifest is not None and manifest.global_step == 40 and manifest.versions[0].run == "run-1"
    assert [[(e.name, e.size) for e in v.files] for v in manifest.versions] == [[("last.ckpt", 1000)]]
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "last.ckpt.manifest.json"]  # no temp file left


def test_truncated_corrupt_missing_and_unmanifested_checkpoints_are_rejected_with_the_reason(tmp_path):
    path = tmp_path / "a.ckpt"
    _save(path, b"0123456789" * 100)
    with open(path, "r+b") as handle:
        handle.truncate(500)
    assert "has 500 bytes, the manifest says 1000 (torn or truncated)" in verify(str(path)).reason
    _save(path, b"0123456789" * 100)
    with open(path, "r+b") as handle:
        handle.seek(10)
        handle.write(b"X")
    assert "does not match its checksum" in verify(str(path)).reason
    assert verify(str(tmp_path / "nope.ckpt")) == Rejection(str(tmp_path / "nope.ckpt"), "missing")
    legacy = tmp_path / "legacy.ckpt"
    legacy.write_bytes(b"old")
    assert verify(str(legacy)).reason.startswith("no manifest")
    assert verify(str(legacy), require_manifest=False) is None
    manifest_path(str(path))
    with open(manifest_path(str(path)), "w") as handle:
        handle.write("{not json")
    assert "malformed checkpoint manifest" in verify(str(path)).reason


def test_a_failed_write_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "last.ckpt"
    _save(path, b"old" * 100, step=10)

    def dies_halfway(temp: str) -> None:
        with open(temp, "wb") as handle:
            handle.write(b"new")
        raise KeyboardInterrupt  # a signal in the middle of the write

    with pytest.raises(KeyboardInterrupt):
        save_file_atomically(str(path), dies_halfway, global_step=20)
    assert path.read_bytes() == b"old" * 100 and verify(str(path)) is None
    assert read_manifest(str(path)).global_step == 10
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_the_instant_between_manifest_and_rename_accepts_either_content_with_its_own_step(tmp_path):
    """Killed after the manifest lists both contents and before (or after) the rename: whatever is on disk passes."""
    path = tmp_path / "last.ckpt"
    _save(path, b"old" * 100, step=10)
    old = read_manifest(str(path)).versions[0]
    _save(tmp_path / "scratch.ckpt", b"new" * 100, step=20)
    new = read_manifest(str(tmp_path / "scratch.ckpt")).versions[0]
    both = {"format": 1, "versions": [{**v.to_dict(), "files": [{"name": "last.ckpt", "size": v.files[0].size,
                                                                  "crc32": v.files[0].crc32}]} for v in (new, old)]}
    with open(manifest_path(str(path)), "w") as handle:
        json.dump(both, handle)
    assert verified_version(str(path)).global_step == 10  # old content, before the rename: step 10, not 20
    path.write_bytes(b"new" * 100)
    assert verified_version(str(path)).global_step == 20  # new content, after it
    path.write_bytes(b"new" * 99)
    assert verify(str(path)) is not None  # neither


def test_a_directory_checkpoint_lists_every_file(tmp_path):
    ckpt = tmp_path / "iter_0000020"
    (ckpt / "shards").mkdir(parents=True)
    (ckpt / "common.pt").write_bytes(b"c" * 10)
    (ckpt / "shards" / "0.distcp").write_bytes(b"s" * 20)
    manifest = write_dir_manifest(str(ckpt), global_step=20)
    assert [e.name for e in manifest.versions[0].files] == ["common.pt", "shards/0.distcp"]
    assert (ckpt / DIR_MANIFEST).exists() and verify(str(ckpt)) is None
    (ckpt / "shards" / "0.distcp").unlink()
    assert verify(str(ckpt)).reason == "shards/0.distcp is missing"


def test_a_checkpoint_marked_bad_is_rejected_and_the_newest_older_good_one_chosen(tmp_path):
    paths = [tmp_path / f"step={s}.ckpt" for s in (30, 20, 10)]
    for step, path in zip((30, 20, 10), paths):
        _save(path, bytes([step]) * 64, step=step)
    mark_bad(str(paths[0]), "the same ValueError twice right after resuming from it")
    with open(paths[1], "r+b") as handle:
        handle.truncate(3)
    chosen, rejected = first_accepted(map(str, paths))
    assert chosen == str(paths[2])
    assert [r.path for r in rejected] == [str(paths[0]), str(paths[1])]
    assert rejected[0].reason == "marked bad: the same ValueError twice right after resuming from it"
    assert first_accepted([str(paths[0])]) == (None, [rejected[0]])


def test_a_mark_condemns_the_content_it_saw_not_a_later_save_under_the_same_name(tmp_path):
    last = tmp_path / "last.ckpt"
    _save(last, b"a" * 64, step=20)
    mark_bad(str(last), "non-finite loss 1 step(s) after resuming from it")
    assert verify(str(last)).reason.startswith("marked bad: non-finite loss")
    _save(last, b"b" * 64, step=28)  # the job went on from an older checkpoint and saved last.ckpt again
    assert verify(str(last)) is None
    _save(last, b"a" * 64, step=20)  # the condemned content itself, written again: still bad
    assert verify(str(last)) is not None


def test_a_mark_without_a_manifest_or_unreadable_condemns_whatever_is_there(tmp_path):
    bare = tmp_path / "old.pt"
    bare.write_bytes(b"x" * 8)
    mark_bad(str(bare), "bad")
    assert verify(str(bare), require_manifest=False).reason == "marked bad: bad"
    (tmp_path / "old.pt.bad.json").write_text("{not json")
    assert verify(str(bare), require_manifest=False).reason == "marked bad (unreadable mark)"


def test_ranks_sharing_the_check_of_a_directory_read_each_checksum_once_between_them(tmp_path):
    ckpt = tmp_path / "iter_0000010"
    ckpt.mkdir()
    for name in ("a.distcp", "b.distcp", "c.distcp"):
        (ckpt / name).write_bytes(name.encode() * 100)
    write_dir_manifest(str(ckpt), global_step=10)
    (ckpt / "b.distcp").write_bytes(b"x" * len(b"b.distcp" * 100))  # same size, other content
    # Rank 0 of 2 checks the checksums of files 0 and 2, rank 1 of file 1: only rank 1 sees it.
    assert verified_version(str(ckpt), share=(0, 2)).global_step == 10
    assert verified_version(str(ckpt), share=(1, 2)).reason == "b.distcp does not match its checksum (changed or corrupt)"
    os.truncate(ckpt / "a.distcp", 5)  # sizes: every rank checks every file
    assert all("a.distcp has 5 bytes" in verified_version(str(ckpt), share=(i, 2)).reason for i in (0, 1))
    # A file checkpoint is never split: every rank must tell its versions apart by content.
    path = str(tmp_path / "last.ckpt")
    save_file_atomically(path, lambda temp: open(temp, "wb").write(b"1" * 64), global_step=1)
    with open(path, "r+b") as handle:
        handle.write(b"2")
    assert "does not match its checksum" in verified_version(path, share=(1, 2)).reason
