"""The etcd-v3 rendezvous backend, store and client (ft_core.launcher.rendezvous.etcd_v3) against a real etcd server.

The session's ``etcd_server`` (Debian's etcd 3.4) serves the v3 API; skipped with
the reason when etcd or etcd3gw is not installed. The launchers' use of the same
pieces is tested in tests/integration (test_launcher_multi_node.py, test_node_loss.py).
"""

from __future__ import annotations

import pytest
from helpers import free_port
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousParameters

from ft_core.launcher.rendezvous.etcd_v3 import (
    EtcdV3RendezvousBackend,
    EtcdV3Settings,
    JobLease,
)
from ft_core.launcher.rendezvous.job_store import JobStoreUnavailable
from ft_core.utils.validation import ValidationError

pytest.importorskip("etcd3gw", reason="etcd-v3 tests need etcd3gw (pip install -e '.[etcd]')")


def test_an_unreachable_etcd_is_a_clear_error_after_the_retry_window():
    dead = ",".join(f"127.0.0.1:{free_port()}" for _ in range(2))
    from ft_core.launcher.rendezvous.etcd_v3 import EtcdV3Client

    params = RendezvousParameters("etcd-v3", dead, "job", 1, 1, unavailable_timeout="0.5")
    backend = EtcdV3RendezvousBackend(EtcdV3Client(EtcdV3Settings.from_params(params)), "/k", JobLease(None, "", 2))
    with pytest.raises(RendezvousConnectionError, match=rf"etcd did not answer for 0.5 s: no member of {dead}"):
        backend.get_state()
    with pytest.raises(JobStoreUnavailable, match="majority of the etcd cluster"):
        backend.client.get("/k")


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
