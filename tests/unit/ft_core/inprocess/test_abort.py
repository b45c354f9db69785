"""The built-in ``abort`` hook: every process group of this rank is aborted and forgotten."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ft_core.inprocess import AbortTorchDistributed, State

STATE = State(iteration=0, initial_rank=0, initial_world_size=1, rank=0, world_size=1)


@pytest.fixture
def gloo_group(tmp_path):
    """A real gloo process group of one rank (this process), on a file store."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_abort_forgets_every_process_group(gloo_group):
    dist.new_group([0])
    assert dist.is_initialized()
    AbortTorchDistributed()(STATE)
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)  # a new attempt can start


def test_abort_without_a_process_group_does_nothing():
    assert not dist.is_initialized()
    AbortTorchDistributed()(STATE)
    assert not dist.is_initialized()
