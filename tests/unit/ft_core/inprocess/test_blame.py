"""Telling a faulty rank from its victims: was a failure inside ``torch.distributed``?"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ft_core.inprocess.blame import main_thread_in_torch_distributed, raised_in_torch_distributed


def _torch_distributed_error() -> BaseException:
    with pytest.raises(Exception) as info:
        dist.get_world_size()  # no process group: raised inside torch.distributed
    return info.value


def test_an_error_raised_inside_torch_distributed_is_told_from_one_raised_in_training_code():
    assert raised_in_torch_distributed(_torch_distributed_error())
    with pytest.raises(ValueError) as info:
        raise ValueError("the training code's own")
    assert not raised_in_torch_distributed(info.value)


def test_an_error_raised_while_handling_a_torch_distributed_error_is_blamed_on_it_too():
    with pytest.raises(RuntimeError) as info:
        try:
            dist.get_world_size()
        except Exception:
            raise RuntimeError("wrapped by the training code")  # noqa: B904 - __context__ is what counts
    assert raised_in_torch_distributed(info.value)


def test_the_main_thread_is_seen_inside_torch_distributed_only_while_a_frame_of_it_runs():
    assert not main_thread_in_torch_distributed()  # the tests run in the main thread
    # A function of a module named as torch.distributed's, called by the main thread: its frame is on the stack.
    namespace = {"__name__": "torch.distributed.fake_collective", "check": main_thread_in_torch_distributed}
    exec("def collective():\n    return check()\n", namespace)
    assert namespace["collective"]()
