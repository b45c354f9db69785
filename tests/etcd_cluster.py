"""A real etcd server (or a cluster of them) on loopback for tests.

Uses the ``etcd`` binary of Debian's ``etcd-server`` package (v3.4, which still
serves the v2 API that torch's ``etcd-v2`` rendezvous and python-etcd speak,
when started with ``--enable-v2``). Every member gets free loopback ports and
its own data directory, dies with the test process (``PR_SET_PDEATHSIG``) and
is stopped by :meth:`EtcdCluster.stop`.

:func:`etcd_missing` says why etcd tests cannot run here (no binary, no
python-etcd), for ``pytest.skip``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from typing import Optional

from helpers import free_port, wait_for

from ft_core.procutil import die_with_parent

#: How to get etcd where `make test` could not install it.
INSTALL_HINT = "apt-get install -y etcd-server (Debian/Ubuntu), then put `etcd` on PATH"

#: Pids of long-lived test services (session fixtures): the per-test orphan check ignores them.
SERVICE_PIDS: set[int] = set()


def etcd_missing() -> Optional[str]:
    """Why etcd tests cannot run on this machine, or None when they can."""
    if shutil.which("etcd") is None:
        return f"no `etcd` binary on PATH ({INSTALL_HINT})"
    try:
        import etcd  # noqa: F401  # type: ignore[import-untyped]
    except ImportError:
        return "python-etcd is not installed (pip install -e '.[etcd]')"
    return None


@dataclasses.dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: str
    proc: Optional[subprocess.Popen] = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        """``host:port`` as ``--rdzv-endpoint`` takes it."""
        return f"127.0.0.1:{self.client_port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1) as response:
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
    """``size`` etcd members on loopback forming one cluster (1 = a single server)."""

    def __init__(self, directory: str, size: int = 1) -> None:
        self.members = [EtcdMember(f"m{i}", free_port(), free_port(), os.path.join(directory, f"m{i}"))
                        for i in range(size)]
        self.directory = directory

    @property
    def endpoint(self) -> str:
        return self.members[0].endpoint

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
        with open(os.path.join(self.directory, f"{member.name}.log"), "ab") as log:
            member.proc = subprocess.Popen(
                ["etcd", "--name", member.name, "--data-dir", member.data_dir, "--enable-v2",
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

    def stop(self) -> None:
        for member in self.members:
            member.kill()
