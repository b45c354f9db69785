"""The etcd-v3 rendezvous backend, store and client (ft_core.launcher.etcd_v3) against a real etcd server.

The session's ``etcd_server`` (Debian's etcd 3.4) serves the v3 API; skipped with
the reason when etcd or etcd3gw is not installed. The launchers' use of the same
pieces is tested in tests/integration (test_launcher_multi_node.py, test_node_loss.py).
"""

from __future__ import annotations

import datetime
import time
import uuid

import pytest
import torch.distributed as dist
from helpers import free_port, wait_for
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousParameters

from ft_core.launcher.etcd_v3 import (
    EtcdV3RendezvousBackend,
    EtcdV3Settings,
    EtcdV3Store,
    JobLease,
    job_prefix,
)
from ft_core.launcher.job_store import JobStoreUnavailable
from ft_core.utils.validation import ValidationError

pytest.importorskip("etcd3gw", reason="etcd-v3 tests need etcd3gw (pip install -e '.[etcd]')")


@pytest.fixture
def job(etcd_server):
    """``job(**conf)``: (client, lease) of one more launcher of a fresh job; lease threads end with the test."""
    run_id, leases = uuid.uuid4().hex, []

    def new(**conf):
        client = etcd_server.v3_client(**conf)
        leases.append(JobLease(client, f"{job_prefix(run_id)}/lease", client.settings.lease_ttl))
        return client, leases[-1]

    new.prefix = job_prefix(run_id)
    yield new
    for lease in leases:
        lease.close()


def test_set_state_writes_only_over_the_token_it_was_given(job):
    def backend():
        client, lease = job()
        return EtcdV3RendezvousBackend(client, f"{job.prefix}/rdzv", lease)

    a, b = backend(), backend()
    assert a.get_state() is None
    state, token, won = a.set_state(b"round0")  # no token: create
    assert (state, won) == (b"round0", True) and a.get_state() == (b"round0", token)
    assert b.set_state(b"other") == (b"round0", token, False)  # exists already: the state in force
    state, newer, won = b.set_state(b"round1", token)
    assert (state, won) == (b"round1", True) and newer > token
    assert a.set_state(b"stale", token) == (b"round1", newer, False)  # fenced out by the old token
    assert a.set_state(b"junk", "not-a-token") == (b"round1", newer, False)
    assert a.name == "etcd-v3"


def test_the_store_torch_sees(job):
    client, lease = job()
    store = EtcdV3Store(client, f"{job.prefix}/store", lease, timeout=datetime.timedelta(seconds=0.3))
    rounds = dist.PrefixStore("torch.rendezvous.x.0", store)  # as the rendezvous hands it out (via pybind)
    rounds.set("MASTER_ADDR", "127.0.0.1")
    assert rounds.get("MASTER_ADDR") == b"127.0.0.1" and rounds.check(["MASTER_ADDR"])
    assert not rounds.check(["MASTER_PORT"])
    started = time.monotonic()
    with pytest.raises(Exception, match="MASTER_PORT"):  # a missing key is waited for, then reported
        rounds.get("MASTER_PORT")
    assert time.monotonic() - started >= 0.3
    assert rounds.add("n", 2) == 2 and rounds.add("n", 3) == 5
    assert rounds.compare_set("cas", "", "a") == b"a"  # c10d: an empty expected value means absent
    assert rounds.compare_set("cas", "x", "b") == b"a"
    assert rounds.compare_set("absent", "x", "y") == b"x"
    assert rounds.compare_set("cas", "a", "b") == b"b"


def test_the_job_keys_live_as_long_as_a_launcher_refreshes_their_lease(job, etcd_server):
    client, lease = job(lease_ttl="2")
    other_client, other_lease = job(lease_ttl="2")
    client.put(f"{job.prefix}/job/state", b"x", lease.id)
    assert other_lease.id == lease.id  # one lease per job, found by the second launcher
    lease.close()  # the first launcher is gone; the other keeps the lease alive
    time.sleep(3)  # > the TTL: its keys would have expired without the other launcher
    assert client.get(f"{job.prefix}/job/state") is not None
    other_lease.close()
    wait_for(lambda: client.get(f"{job.prefix}/job/state") is None, 10, "the job's keys to expire")
    assert client.get(f"{job.prefix}/lease") is None


def test_an_unreachable_etcd_is_a_clear_error_after_the_retry_window():
    dead = ",".join(f"127.0.0.1:{free_port()}" for _ in range(2))
    from ft_core.launcher.etcd_v3 import EtcdV3Client

    params = RendezvousParameters("etcd-v3", dead, "job", 1, 1, unavailable_timeout="0.5")
    backend = EtcdV3RendezvousBackend(EtcdV3Client(EtcdV3Settings.from_params(params)), "/k", JobLease(None, "", 2))
    with pytest.raises(RendezvousConnectionError, match=rf"etcd did not answer for 0.5 s: no member of {dead}"):
        backend.get_state()
    with pytest.raises(JobStoreUnavailable, match="majority of the etcd cluster"):
        backend._client.get("/k")


def test_a_member_that_does_not_answer_is_skipped(etcd_server):
    # The first endpoint is dead: the request goes on to the next one at once.
    params = RendezvousParameters("etcd-v3", f"127.0.0.1:{free_port()},{etcd_server.endpoint}", "job", 1, 1,
                                  unavailable_timeout="5")
    from ft_core.launcher.etcd_v3 import EtcdV3Client

    client = EtcdV3Client(EtcdV3Settings.from_params(params))
    client.put(f"/ft_launcher/{uuid.uuid4().hex}/k", b"v", 0)


@pytest.mark.parametrize("conf, key", [
    ({"protocol": "gopher"}, "protocol"),
    ({"ca_cert": "/ca.pem", "protocol": "http"}, "protocol"),
    ({"ssl_cert": "/c.pem"}, "ssl_cert"),
    ({"user": "root"}, "user/password"),
    ({"password_file": "/nonexistent/pw"}, "password_file"),
    ({"read_timeout": "0"}, "read_timeout"),
    ({"lease_ttl": "1"}, "lease_ttl"),
])
def test_bad_settings_name_the_key(conf, key):
    with pytest.raises(ValidationError, match=f"--rdzv-conf {key}"):
        EtcdV3Settings.from_params(RendezvousParameters("etcd-v3", "h:2379", "job", 1, 1, **conf))


def test_endpoints():
    params = RendezvousParameters("etcd-v3", "a:1, b ,[::1]:3", "job", 1, 1)
    settings = EtcdV3Settings.from_params(params)
    assert settings.endpoints == (("a", 1), ("b", 2379), ("::1", 3)) and settings.protocol == "http"
    for bad in ("", "a:b", "a:70000"):
        with pytest.raises(ValidationError, match="--rdzv-endpoint"):
            EtcdV3Settings.from_params(RendezvousParameters("etcd-v3", bad, "job", 1, 1))


def test_an_outage_shorter_than_the_retry_window_is_ridden_out(tmp_path, caplog):
    """No false failure: a write issued while etcd is down completes once it is back, within the window."""
    from etcd_cluster import EtcdCluster, assert_rides_out_an_outage

    from ft_core.launcher.job_store import EtcdV3JobStore

    cluster = EtcdCluster(str(tmp_path), size=1, enable_v2=False).start()
    client = cluster.v3_client(unavailable_timeout="60")
    lease = JobLease(client, "/ft_launcher/outage/lease", 60)
    try:
        store = EtcdV3JobStore(client, "/ft_launcher/outage/job", lease)
        assert_rides_out_an_outage(cluster, store, caplog.records, "did not answer")
    finally:
        lease.close()
        cluster.stop()
