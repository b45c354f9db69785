"""What every rank agrees on: small collectives over the job's default process group.

The integrations and the timeouts calculation decide some things on every rank
alike: whether a checkpoint candidate passed everywhere (:func:`all_ranks_ok`),
the largest interval any rank observed or the largest of a few counters
(:func:`all_ranks_max`), and which snapshots each rank holds (:func:`every_rank`).
Each is one small collective, called by every rank at the same point of the
program; without a process group of more than one rank the local value is the
answer.

One rule decides where these collectives run: **the default process group, with
the values on the device its backend reduces**: the CPU when the group serves
CPU tensors (gloo, or a ``cpu:gloo,cuda:nccl`` group), else the current device
of the only backend (``cuda`` for NCCL: the device the training already set).
This is torch's own rule for object collectives
(``distributed_c10d._get_object_coll_device``), read from the public
:func:`torch.distributed.get_backend_config`. No extra group is made: a gloo
group beside an NCCL one connects every pair of ranks when it is created (a
full mesh: 16k ranks hold 16k sockets each, why Megatron-LM can disable its gloo
groups), and ``new_group`` is itself a collective every rank must enter in the
same order, which a lazily made group would impose on the training code; the
default group exists on every rank that can agree at all, and is replaced
together with ours by an in-process restart.

Torch-free at import: torch is imported inside the collectives, and a process
that never imported ``torch.distributed`` has no process group to ask.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TypeVar, cast

__all__ = ["all_ranks_max", "all_ranks_ok", "distributed", "every_rank", "process_group_exists",
           "reduction_device"]

_Number = TypeVar("_Number", int, float)


def process_group_exists() -> bool:
    """Whether this process has a default ``torch.distributed`` process group (of any size)."""
    dist = sys.modules.get("torch.distributed")  # not imported: there is no process group
    return dist is not None and dist.is_available() and dist.is_initialized()


def distributed() -> bool:
    """Whether a default process group of more than one rank exists (then the functions here are collectives)."""
    return process_group_exists() and sys.modules["torch.distributed"].get_world_size() > 1


def reduction_device(backend_config: str) -> str:
    """The device type whose tensors a group of ``backend_config`` reduces, for values held in CPU memory.

    ``backend_config`` is :func:`torch.distributed.get_backend_config`'s ``device:backend`` list;
    the CPU when it is among them (no copy), else the first device (``cuda`` for NCCL).

    >>> reduction_device("cpu:gloo,cuda:gloo"), reduction_device("cuda:nccl"), reduction_device("cpu:gloo,cuda:nccl")
    ('cpu', 'cuda', 'cpu')
    """
    devices = [pair.partition(":")[0].strip() for pair in backend_config.split(",") if pair.strip()]
    return "cpu" if "cpu" in devices or not devices else devices[0]


def all_ranks_ok(ok: bool) -> bool:
    """True when ``ok`` on every rank (one all-reduce; ``ok`` itself without a process group)."""
    return all_ranks_max([0 if ok else 1])[0] == 0


def all_ranks_max(values: Sequence[_Number]) -> list[_Number]:
    """The largest of every rank's ``values``, element-wise (one all-reduce; the values without a process group).

    Every rank passes as many values, all ints (reduced as 64-bit integers, exact) or
    all floats (64-bit floats).
    """
    if not distributed():
        return list(values)
    import torch
    import torch.distributed as dist

    integers = all(isinstance(value, int) for value in values)
    device = reduction_device(dist.get_backend_config())
    reduced = torch.tensor(list(values), dtype=torch.int64 if integers else torch.float64, device=device)
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX)
    return cast("list[_Number]", reduced.cpu().tolist())


def every_rank(value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order (one all-gather; ``[value]`` without a process group)."""
    if not distributed():
        return [value]
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)  # torch places the bytes by the rule above
    return gathered
