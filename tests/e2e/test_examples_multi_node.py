"""The examples run as a 2-node job: two ft_launcher processes on loopback (c10d rendezvous), one rank each."""

from __future__ import annotations

import os

import pytest
from helpers import REPO_ROOT
from integration.launcher_helpers import LauncherGroup

pytestmark = pytest.mark.timeout(420)


@pytest.fixture
def launchers(tmp_path):
    with LauncherGroup(tmp_path) as group:
        yield group


def test_lightning_example_on_two_nodes_restarts_after_a_hang(launchers, tmp_path):
    # num_nodes comes from the launcher's environment: without it Lightning rejects world size 2.
    flag = tmp_path / "finished.flag"
    nodes = launchers.start_nodes(
        [os.path.join(REPO_ROOT, "examples", "lightning_train.py"), "--max-steps=60", "--simulate-hang-at=45",
         f"--ckpt-dir={tmp_path / 'ckpt'}"],
        2, "--max-restarts=2", "--ft-rank-section-timeouts=setup:600,step:180,validation:600,checkpointing:600",
        FAULT_TOL_FINISHED_FLAG_FILE=str(flag))
    for node in nodes:
        assert node.wait(360) == 0, node.output()[-4000:]
    for node in nodes:
        assert [e["cycle"] for e in node.events("cycle_start")] == [0, 1]
        assert {e["group_world_size"] for e in node.events("cycle_start")} == {2}
    hangs = [e for node in nodes for e in node.events("hang_detected")]
    assert {e["iteration"] for e in hangs} == {45}  # caught by the learned step timeout, on both nodes' ranks
    assert flag.exists() and (tmp_path / "ckpt" / "last.ckpt").exists()


def test_megatron_example_on_two_nodes(launchers, tmp_path):
    # Tensor parallelism across the two nodes (TP size = world size 2), dist_checkpointing saves.
    save = tmp_path / "ckpt"
    nodes = launchers.start_nodes(
        [os.path.join(REPO_ROOT, "examples", "megatron", "train.py"), "--enable-ft", "--train-iters=8",
         f"--save={save}", f"--load={save}", "--save-interval=4", "--log-interval=4"],
        2, "--ft-rank-section-timeouts=setup:600,step:120,eval:120,checkpointing:120",
        f"--ft-checkpoint-iteration-file={save / 'latest_checkpointed_iteration.txt'}",
        FAULT_TOL_FINISHED_FLAG_FILE=str(tmp_path / "finished.flag"))
    for node in nodes:
        assert node.wait(360) == 0, node.output()[-4000:]
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "8"
    assert (tmp_path / "finished.flag").exists()
    ranks = sorted(e["rank"] for node in nodes for e in node.events("rank_connected"))
    assert ranks == [0, 1]
