"""Snapshots of CUDA tensors: copied into reused pinned host buffers on a side stream, so the training thread only
queues the copies. Needs a CUDA device (``make test-gpu``); skipped without one. Written to run unchanged on one GPU."""

from __future__ import annotations

import time

import pytest
import torch

from ft_core.jobdir import JobDir
from ft_core.snapshots.node import NodeSnapshots
from ft_core.snapshots.slots import SnapshotSlots

pytestmark = pytest.mark.cuda  # skipped without a CUDA device (tests/conftest.py); make test-gpu runs it

GIB = 1 << 30


def _staged(node: NodeSnapshots) -> list[torch.Tensor]:
    return [node._staging["model"]["w"], node._staging["optimizer"]["exp_avg"]]


@pytest.mark.timeout(300)
def test_a_1_gib_cuda_state_blocks_the_training_thread_only_to_queue_its_copies(tmp_path):
    device = torch.device("cuda", torch.cuda.current_device())
    state = {"model": {"w": torch.randn(GIB // 8, device=device)},
             "optimizer": {"exp_avg": torch.randn(GIB // 8, device=device)}, "step": 0}  # 1 GiB of float32
    job = JobDir(str(tmp_path / "job-x")).create()
    node = NodeSnapshots(SnapshotSlots(str(tmp_path / "snapshots"), 0, 1), job.monitor_socket, every=1)
    try:
        assert node.save(1, state, wait=True)  # the first one allocates the pinned buffers
        buffers = [t.data_ptr() for t in _staged(node)]
        assert all(t.is_pinned() for t in _staged(node))

        expected = {"w": state["model"]["w"].cpu(), "exp_avg": state["optimizer"]["exp_avg"].cpu()}
        torch.cuda.synchronize()
        started = time.perf_counter()
        assert node.save(2, state)
        blocked = time.perf_counter() - started
        # The training changes its tensors at once, in place: the snapshot must still hold what was saved.
        state["model"]["w"].add_(1.0)
        assert node.writer is not None and node.writer.wait(120) and node.writer.error is None
        assert [t.data_ptr() for t in _staged(node)] == buffers  # reused, not allocated again

        # What a synchronous copy to pageable memory (the CPU path's way) costs the training thread.
        torch.cuda.synchronize()
        started = time.perf_counter()
        pageable = [t.to("cpu") for t in (state["model"]["w"], state["optimizer"]["exp_avg"])]
        synchronous = time.perf_counter() - started
        del pageable
        assert blocked < synchronous / 4, (blocked, synchronous)

        snapshot = node.slots.listed()[0]
        assert snapshot.step == 2
        loaded = node.slots.load(snapshot)
        assert torch.equal(loaded["model"]["w"], expected["w"])
        assert torch.equal(loaded["optimizer"]["exp_avg"], expected["exp_avg"])
    finally:
        node.close()
