"""The fault policy's rule 1 on one node: a snapshot is marked in this node's snapshot directory, a checkpoint on
its own disk, and what this node does not hold is left to the node that does."""

from __future__ import annotations

from ft_core.launcher.bad_marks import mark_bad_here
from ft_core.snapshots.condemned import condemned


def test_the_launcher_marks_a_snapshot_in_its_snapshot_directory_and_never_the_disk_checkpoint(tmp_path,
                                                                                                  monkeypatch):
    import ft_core.launcher.bad_marks as bad_marks

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(bad_marks, "snapshot_dir_for_socket", lambda socket: str(shm))
    ckpt = tmp_path / "step=20.ckpt"
    ckpt.write_bytes(b"weights")
    assert mark_bad_here("snapshot:26:1.1", "non-finite loss", "/run/job-x/monitor.sock")
    assert condemned(str(shm)) == {(26, "1.1")}
    assert not list(tmp_path.glob("*.bad.json"))
    monkeypatch.setattr(bad_marks, "snapshot_dir_for_socket", lambda socket: None)  # snapshots off on this node
    assert not mark_bad_here("snapshot:28:1.1", "non-finite loss", "/run/job-x/monitor.sock")
    assert mark_bad_here(str(ckpt), "non-finite loss", "/run/job-x/monitor.sock")
    assert (tmp_path / "step=20.ckpt.bad.json").exists()


def test_a_checkpoint_that_is_not_on_this_node_is_not_marked(tmp_path):
    assert not mark_bad_here(str(tmp_path / "on-another-node.ckpt"), "non-finite loss", "/run/job-x/monitor.sock")
    assert not mark_bad_here("relative/step=20.ckpt", "non-finite loss", "/run/job-x/monitor.sock")
    assert not list(tmp_path.rglob("*.bad.json"))
