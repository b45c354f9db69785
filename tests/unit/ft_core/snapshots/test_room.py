"""The room rule (pure): a state sized from its metadata, and the first limit without room for every local rank's
snapshots. The readings themselves, under real limits, are in ``tests/integration/ft_core/snapshots/test_room.py``."""

from __future__ import annotations

import collections

import numpy
import pytest
import torch

from ft_core.snapshots.room import (
    COPIES,
    ROOM_MARGIN,
    ROOM_SHARE,
    Limits,
    cgroup_free,
    read_limits,
    refusal,
    state_size,
)

GIB = 1 << 30
ROOMY = Limits(shm_free=1 << 50, memory_available=1 << 50, cgroup_free=None)


def test_a_state_is_sized_from_metadata_without_touching_its_data():
    # 4 TB on the meta device: no data at all, so sizing can only have read the shapes and dtypes.
    huge = torch.empty(10 ** 12, dtype=torch.float32, device="meta")
    size = state_size({"model": {"w": huge}, "optimizer": [huge[: 10 ** 6]]})
    assert size.tensor_bytes == 4 * 10 ** 12 + 4 * 10 ** 6 and not size.cuda


def test_tensors_count_as_copy_state_copies_them_tied_once_views_by_their_elements():
    weight = torch.zeros(1000)
    size = state_size(collections.OrderedDict(w=weight, tied=weight, half=weight[:500], step=7))
    assert size.tensor_bytes == 4 * 1000 + 4 * 500


def test_other_values_are_estimated_cheaply():
    rng = numpy.random.get_state()  # a tuple holding a 624-word array
    size = state_size({"numpy": rng, "name": "x" * 1000, "blob": b"y" * 2000})
    assert size.tensor_bytes == 0 and size.other_bytes >= 624 * 4 + 3000


def test_the_shm_need_is_three_copies_of_every_local_ranks_state_in_half_the_free_space():
    size = state_size({"w": torch.empty(GIB // 4, device="meta")})  # 1 GiB
    need = COPIES * int(size.total * ROOM_MARGIN) * 8
    enough = Limits(shm_free=int(need / ROOM_SHARE) + 1, memory_available=1 << 50, cgroup_free=None)
    assert refusal(size, 8, enough) is None
    short = Limits(shm_free=int(need / ROOM_SHARE) - 4096, memory_available=1 << 50, cgroup_free=None)
    found = refusal(size, 8, short)
    assert found is not None and found.limit == "/dev/shm" and found.need == need
    assert refusal(size, 1, short) is None  # one rank on the node fits where eight do not


def test_memory_counts_the_staging_copy_too_and_what_is_held_or_staged_already():
    size = state_size({"w": torch.empty(GIB // 4, device="meta")})
    state = int(size.total * ROOM_MARGIN)
    need = (COPIES + 1) * state * 8
    tight = Limits(shm_free=1 << 50, memory_available=int(need / ROOM_SHARE) - 4096, cgroup_free=None)
    found = refusal(size, 8, tight)
    assert found is not None and "MemAvailable" in found.limit and found.need == need
    # The staging copy allocated already, or a slot held already, is memory in use: not asked for again.
    assert refusal(size, 8, tight, staged=state) is None
    assert refusal(size, 8, tight, held=state) is None


def test_the_cgroup_limit_refuses_when_the_node_has_room():
    size = state_size({"w": torch.empty(GIB // 4, device="meta")})
    found = refusal(size, 8, Limits(shm_free=1 << 50, memory_available=1 << 50, cgroup_free=4 * GIB,
                                    cgroup_path="/sys/fs/cgroup/job/memory.max"))
    assert found is not None and "/sys/fs/cgroup/job/memory.max" in found.limit and found.room == 2 * GIB
    assert "1024 MiB on each of 8 local rank(s)" in found.describe(size, 8)


@pytest.mark.parametrize("unknown", ["shm_free", "memory_available"])
def test_an_unknown_reading_refuses_nothing(unknown):
    size = state_size({"w": torch.empty(GIB, device="meta")})
    limits = Limits(**{**ROOMY.__dict__, unknown: None})
    assert refusal(size, 8, limits) is None


def test_the_readings_of_this_machine(tmp_path):
    limits = read_limits(str(tmp_path / "not" / "made" / "yet"))  # the slots' directories come at their first write
    assert limits.shm_free is not None and limits.shm_free > 0
    assert limits.memory_available is not None and limits.memory_available > 0


def _own_cgroup_v1_path() -> str | None:
    with open("/proc/self/cgroup", encoding="ascii") as handle:
        for line in handle.read().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                return path
    return None


def test_the_least_room_of_the_cgroup_and_its_ancestors_counts_and_inactive_cache_is_room(tmp_path):
    # A copy of this process's v1 memory hierarchy path with files the test writes: the walk, not the kernel.
    path = _own_cgroup_v1_path()
    if path is None or path.strip("/").count("/") < 1:
        pytest.skip("this process is in no v1 memory cgroup two levels below the root")
    own = tmp_path / "memory" / path.strip("/")
    own.mkdir(parents=True)
    parent = own.parent
    (own / "memory.limit_in_bytes").write_text(str(8 * GIB))
    (own / "memory.usage_in_bytes").write_text(str(1 * GIB))
    (parent / "memory.limit_in_bytes").write_text(str(4 * GIB))  # the pod's limit, under the container's
    (parent / "memory.usage_in_bytes").write_text(str(3 * GIB))
    (parent / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {GIB // 2}\n")
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(str(9223372036854771712))  # the root: no limit
    free, where = cgroup_free(str(tmp_path))
    assert free == GIB + GIB // 2 and where == str(parent / "memory.limit_in_bytes")
