"""The one rule for where the ranks' agreements run, and the answers without a process group."""

from __future__ import annotations

import pytest

from ft_core.all_ranks import all_ranks_max, all_ranks_ok, distributed, every_rank, reduction_device


@pytest.mark.parametrize(("backend_config", "device"), [
    ("cpu:gloo,cuda:gloo", "cpu"),  # init_process_group("gloo")
    ("cuda:nccl", "cuda"),  # NCCL alone reduces device tensors: the current CUDA device
    ("cpu:gloo,cuda:nccl", "cpu"),  # a multi-backend group serves CPU tensors through gloo: no copy
    ("xpu:xccl", "xpu"),
])
def test_values_are_reduced_on_the_device_the_default_group_serves(backend_config, device):
    assert reduction_device(backend_config) == device


def test_without_a_process_group_the_local_values_are_the_answer():
    assert not distributed()
    assert all_ranks_ok(True) and not all_ranks_ok(False)
    assert all_ranks_max([3, -1]) == [3, -1]
    assert all_ranks_max([0.5]) == [0.5]
    assert every_rank({"a": 1}) == [{"a": 1}]

