"""Shared fixtures: every test must leave no child process behind; real etcd servers on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time

import psutil
import pytest
from etcd_cluster import SERVICE_PIDS, EtcdCluster, etcd_missing


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``cuda`` where no CUDA device is visible (``make test-gpu`` runs them on a GPU)."""
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (make test-gpu on a GPU machine)")
    for item in cuda_items:
        item.add_marker(skip)


#: Children may take a moment to be reaped after a test's own cleanup.
ORPHAN_GRACE_S = 15.0


def _live_descendants() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in SERVICE_PIDS and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(autouse=True)
def no_orphan_processes():
    """Fail a test that leaves any process of its tree alive (and kill what it left)."""
    yield
    deadline = time.monotonic() + ORPHAN_GRACE_S
    leftovers = _live_descendants()
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.1)
        leftovers = _live_descendants()
    if leftovers:
        described = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in leftovers if p.is_running()]
        for proc in leftovers:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"test left processes alive: {described}")


MONITOR_TOKEN = "test-token-0123456789"


@pytest.fixture
def start_monitor(tmp_path, monkeypatch):
    """The one monitor fixture: ``start_monitor(cfg=None, *, token=..., attach=False, **cfg_kwargs)``.

    Starts a monitor subprocess (``RankMonitorServer.run_in_subprocess``) in a job directory of its
    own, from ``cfg`` (every key set at launch) or else from ``cfg_kwargs`` (the keys set at launch; the
    defaults users get for the others). With ``attach=True`` this process becomes its rank: the
    test's ``FT_MONITOR_TOKEN`` and ``FT_RANK_MONITOR_IPC_SOCKET`` point at it (restored afterwards).
    Every monitor started is stopped at the end of the test.
    """
    from ft_core.config_loading import load_mapping
    from ft_core.monitor import RankMonitorServer

    monitors = []

    def start(cfg=None, *, token: str = MONITOR_TOKEN, attach: bool = False, **cfg_kwargs):
        if cfg is None:
            # The keys given are set at launch: a rank's fallback values fill in the others. A config given
            # whole is taken as it is: every key counts as set at launch.
            cfg = load_mapping(cfg_kwargs)
        elif cfg_kwargs:
            raise TypeError("start_monitor: pass either a config or its keywords, not both")
        socket_path = str(tmp_path / f"job{len(monitors)}" / "monitor.sock")
        monitor = RankMonitorServer.run_in_subprocess(cfg, socket_path, token=token)
        monitors.append(monitor)
        if attach:
            monkeypatch.setenv("FT_MONITOR_TOKEN", token)
            monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", monitor.socket_path)
        return monitor

    yield start
    for monitor in monitors:
        monitor.stop()


def _etcd_cluster(tmp_path_factory, size: int):
    """Start a real etcd cluster of ``size`` members on loopback, or skip the test naming why not."""
    reason = etcd_missing()
    if reason:
        pytest.skip(f"etcd tests need a real etcd server: {reason}")
    cluster = EtcdCluster(str(tmp_path_factory.mktemp(f"etcd{size}")), size=size).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory):
    """One etcd server (v2 API on) for the whole test session; tests use their own run ids."""
    yield from _etcd_cluster(tmp_path_factory, 1)


@pytest.fixture
def etcd_v3_job_store(etcd_server):
    """``etcd_v3_job_store(run_id)``: one more launcher's ``EtcdV3JobStore`` of job ``run_id`` on the session's
    etcd (its own client and lease handle, as another node has); lease threads end with the test."""
    pytest.importorskip("etcd3gw", reason="etcd-v3 tests need etcd3gw (pip install -e '.[etcd]')")
    from ft_core.launcher.rendezvous.etcd_v3 import JobLease, job_prefix
    from ft_core.launcher.rendezvous.job_store import EtcdV3JobStore

    leases: list[JobLease] = []

    def new(run_id: str) -> EtcdV3JobStore:
        client = etcd_server.v3_client()
        leases.append(JobLease(client, f"{job_prefix(run_id)}/lease", ttl=60))
        return EtcdV3JobStore(client, f"{job_prefix(run_id)}/job", leases[-1])

    yield new
    for lease in leases:
        lease.close()


@pytest.fixture
def etcd_cluster3(tmp_path_factory):
    """A fresh 3-member etcd cluster on loopback (the test may kill members)."""
    yield from _etcd_cluster(tmp_path_factory, 3)


@pytest.fixture
def runtime_dir():
    """A private directory to stand for ``$XDG_RUNTIME_DIR`` (job dirs go in ``<it>/ft-<uid>/``).

    Made in /tmp: pytest's ``tmp_path`` is too long for socket paths below it, and
    ``ft_core.jobdir.runtime_root`` would skip it for ``/tmp``.
    """
    path = tempfile.mkdtemp(prefix="ftrun-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)
