"""Fixtures shared by the integration tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
import torch.distributed as dist
from launcher_helpers import LauncherGroup

from ft_core.launcher.rendezvous.job_store import C10dJobStore, EtcdJobStore, JobStore


@pytest.fixture(params=["c10d", "etcd", "etcd-v3"])
def new_job_store(request) -> Callable[[], JobStore]:
    """``new_job_store()``: one more connection to the same (fresh) job store, as another node has."""
    if request.param == "c10d":
        shared = dist.HashStore()
        return lambda: C10dJobStore(dist.PrefixStore("ft_launcher/test", shared))
    if request.param == "etcd-v3":
        new, run_id = request.getfixturevalue("etcd_v3_job_store"), uuid.uuid4().hex
        return lambda: new(run_id)
    cluster = request.getfixturevalue("etcd_server")
    prefix = f"/ft_launcher/{uuid.uuid4().hex}"
    return lambda: EtcdJobStore(cluster.client(), prefix)


@pytest.fixture
def launchers(tmp_path):
    """Launchers started by the test (``launchers.start(...)``), killed with their process trees at its end."""
    with LauncherGroup(tmp_path) as group:
        yield group
