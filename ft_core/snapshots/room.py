"""Whether a node has room for every local rank's snapshots, decided from the state's metadata before any copy.

A snapshot costs memory twice: the rank's staging copy (host memory the tensors are
copied into on the training thread, pinned for CUDA tensors, reused by every snapshot)
and the slots in ``/dev/shm`` (a tmpfs: its pages are RAM, charged to the writing
process's memory cgroup). On a node with 8 ranks and large optimizer states, copying
first and checking afterwards could itself take the node's memory, so the state is
sized from its tensors' metadata (:func:`state_size`: no data is touched) and the room
is checked before the first byte is copied (:func:`refusal`, a pure function of the
readings :func:`read_limits` takes):

* ``/dev/shm``: ``copies`` slots of every local rank's state against :data:`ROOM_SHARE`
  of the filesystem's free space;
* the node's memory: those slots plus every local rank's staging copy against that share
  of ``MemAvailable`` (``/proc/meminfo``);
* the container's memory: the same against that share of what the process's memory
  cgroup (and its ancestors) still allows: ``memory.max - memory.current`` (cgroup v2),
  else ``memory.limit_in_bytes - memory.usage_in_bytes`` (v1); no limit, no check.

Every local rank (``LOCAL_WORLD_SIZE``) is taken to hold a state of the same size: the
ranks of a node check at about the same moment, before any of them has copied.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Optional

__all__ = ["COPIES", "ROOM_MARGIN", "ROOM_SHARE", "Limits", "Refusal", "StateSize", "cgroup_free", "memory_available",
           "read_limits", "refusal", "state_size"]

#: Copies of a state in ``/dev/shm`` per rank: the two slots, and the snapshot a resume loaded, which stays
#: mapped while the training keeps tensors of it.
COPIES = 3
#: Room asked for beyond the tensors' bytes: the pickle's framing, the manifests, the non-tensor values.
ROOM_MARGIN = 1.05
#: The share of each limit's free room snapshots may take: the rest stays for the other users of the
#: node's memory (data-loader workers pass their batches through ``/dev/shm``, NCCL its buffers).
ROOM_SHARE = 0.5
#: Bytes counted for a value that is neither a tensor, a container, nor bytes-like (a number, a small object).
_OTHER_BYTES = 64


@dataclasses.dataclass(frozen=True)
class StateSize:
    """A state's size from its metadata: the bytes a snapshot copies and writes."""

    #: Tensor bytes (``numel x element_size`` of each distinct tensor, as :func:`~.writer.copy_state` copies them).
    tensor_bytes: int
    #: An estimate of the other values' bytes (pickled beside the tensors).
    other_bytes: int
    #: True when some tensor is on a CUDA device.
    cuda: bool

    @property
    def total(self) -> int:
        return self.tensor_bytes + self.other_bytes


def state_size(state: Any) -> StateSize:
    """The size of ``state`` from its tensors' metadata (no tensor's data is read: CUDA tensors stay put).

    Tensors are counted as :func:`~ft_core.snapshots.writer.copy_state` copies them: once per
    distinct view (tied weights once). Other values: bytes-like by their length, NumPy arrays by
    ``nbytes``, anything else a few bytes.
    """
    import torch

    seen: set[tuple[Any, ...]] = set()
    tensor_bytes = other_bytes = 0
    cuda = False
    stack = [state]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            key = (value.device, value.untyped_storage().data_ptr(), value.storage_offset(), value.dtype,
                   tuple(value.shape), tuple(value.stride()))
            if key not in seen:
                seen.add(key)
                tensor_bytes += value.numel() * value.element_size()
                cuda = cuda or value.is_cuda
        elif isinstance(value, dict):
            stack.extend(value.values())
            other_bytes += _OTHER_BYTES * len(value)  # the keys
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, (bytes, bytearray, str)):
            other_bytes += len(value)
        else:
            nbytes = getattr(value, "nbytes", None)  # a NumPy array (the RNG state)
            other_bytes += nbytes if isinstance(nbytes, int) else min(sys.getsizeof(value), 1 << 20)
    return StateSize(tensor_bytes, other_bytes, cuda)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the node and the process's cgroup allow now, in bytes (None: unknown or no limit)."""

    #: Free space of the snapshot directory's filesystem (``/dev/shm``).
    shm_free: Optional[int]
    #: ``MemAvailable`` of ``/proc/meminfo``.
    memory_available: Optional[int]
    #: The least room left under a memory limit of the process's cgroup or an ancestor of it.
    cgroup_free: Optional[int]
    #: The cgroup file that limit was read from (for the message).
    cgroup_path: str = ""


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why there is no room: the limit that refused, what snapshots would need of it and what it has."""

    limit: str
    need: int
    room: int

    def describe(self, size: StateSize, ranks: int) -> str:
        mib = 1 << 20
        return (f"a state of {size.total / mib:.0f} MiB on each of {ranks} local rank(s) needs {self.need / mib:.0f} "
                f"MiB of {self.limit}, which has {self.room / mib:.0f} MiB for snapshots (half of its free room)")


def refusal(size: StateSize, ranks: int, limits: Limits, *, held: int = 0, staged: int = 0) -> Optional[Refusal]:
    """The first limit without room for the snapshots of ``ranks`` local ranks of states of ``size``; None: room.

    ``held``: what this rank's slots hold now (in ``/dev/shm`` and in memory already; every local
    rank is taken to hold as much). ``staged``: the bytes of this rank's staging copy already
    allocated (reused by the next copy: no new memory).
    """
    state = int(size.total * ROOM_MARGIN)
    shm = max(0, COPIES * state - held) * ranks
    memory = shm + max(0, state - staged) * ranks
    for limit, need, free in (("/dev/shm", shm, limits.shm_free),
                              ("the node's available memory (MemAvailable)", memory, limits.memory_available),
                              (f"the memory cgroup's limit ({limits.cgroup_path})", memory, limits.cgroup_free)):
        if free is not None and need > int(ROOM_SHARE * free):
            return Refusal(limit, need, int(ROOM_SHARE * free))
    return None


def read_limits(directory: str, *, cgroup_root: str = "/sys/fs/cgroup") -> Limits:
    """The readings :func:`refusal` decides from, for snapshots in ``directory``."""
    path = directory
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)  # the slots' directories are made at their first write
    try:
        stat = os.statvfs(path)
        shm_free: Optional[int] = stat.f_bavail * stat.f_frsize
    except OSError:
        shm_free = None
    cgroup = cgroup_free(cgroup_root)
    return Limits(shm_free, memory_available(), *(cgroup if cgroup is not None else (None, "")))


def memory_available() -> Optional[int]:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None where there is none.

    A tmpfs's size is a limit, not memory: ``/dev/shm`` is often as large as the RAM, or larger.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2): no limit


def _inactive_file(level: str, key: str) -> int:
    """The cgroup's inactive page cache (``memory.stat``): counted in its usage, yet reclaimed before it hits its limit."""
    try:
        with open(os.path.join(level, "memory.stat"), encoding="ascii") as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_free(root: str = "/sys/fs/cgroup") -> Optional[tuple[int, str]]:
    """The least room under a memory limit of this process's cgroup and its ancestors, and the limit's file.

    cgroup v2 (``0::<path>`` in ``/proc/self/cgroup``): ``memory.max - memory.current`` at each
    level; else v1's memory controller: ``memory.limit_in_bytes - memory.usage_in_bytes``; the
    inactive page cache counts as room (as ``docker stats`` counts it out of the usage). None
    when no level has a limit, or the files cannot be read.
    """
    try:
        with open("/proc/self/cgroup", encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    v2 = v1 = None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        # A v2 hierarchy mounted at ``root`` (not the hybrid layout's ``root/unified``, without memory).
        if controllers == "" and os.path.exists(os.path.join(root, "cgroup.controllers")):
            v2 = (root, path, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            v1 = (os.path.join(root, "memory"), path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                  "total_inactive_file")
    found = None
    for base, path, limit_file, usage_file, cache_key in (v for v in (v2, v1) if v is not None):
        level = os.path.join(base, path.strip("/"))
        while True:
            limit, usage = _read_int(os.path.join(level, limit_file)), _read_int(os.path.join(level, usage_file))
            # v1 writes "no limit" as a huge number (the page-rounded LONG_MAX): above the RAM, no limit.
            if limit is not None and usage is not None and limit < (1 << 62):
                free = max(0, limit - usage + _inactive_file(level, cache_key))
                if found is None or free < found[0]:
                    found = (free, os.path.join(level, limit_file))
            if os.path.normpath(level) == os.path.normpath(base):
                break
            level = os.path.dirname(level)
        if found is not None:
            return found
    return None
