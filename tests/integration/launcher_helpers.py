"""Helpers for ft_launcher tests: start real launchers, read their events, and prove no process survives.

Workers run in their own sessions and outlive nothing by design, but a bug
could orphan them (reparented away from pytest), where the autouse
``no_orphan_processes`` fixture cannot see them. :class:`ProcessTracker`
therefore samples every launcher's process tree while the test runs and, at
the end, checks that none of the processes it ever saw is still alive.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import psutil
from etcd_cluster import EtcdCluster
from helpers import REPO_ROOT, free_port, python_env, spawn_python, wait_for

from ft_core.event_file import read_events

WORKER = os.path.join(REPO_ROOT, "tests", "integration", "launcher_workers", "worker.py")

#: Small timeouts so faults are found and handled quickly. The initial
#: heartbeat timeout must cover `import torch` and gloo init on a loaded machine.
FAST_FLAGS = (
    "--monitor-interval=0.05",
    "--ft-initial-rank-heartbeat-timeout=90",
    "--ft-rank-heartbeat-timeout=3",
    "--ft-stack-dump-timeout=0.5",
    "--workers-stop-timeout=5",
)
#: Processes may need a moment to be reaped after their launcher exits.
GONE_TIMEOUT = 20.0


class ProcessTracker:
    """Remembers every process in the trees of the registered roots (pid + start time)."""

    def __init__(self, interval: float = 0.05) -> None:
        self._interval = interval
        self._roots: list[int] = []
        self._seen: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_forever, daemon=True)
        self._thread.start()

    def add_root(self, pid: int) -> None:
        with self._lock:
            self._roots.append(pid)
        self.add(pid)

    def add(self, pid: int) -> None:
        try:
            proc = psutil.Process(pid)
            with self._lock:
                self._seen.setdefault(pid, proc.create_time())
        except psutil.NoSuchProcess:
            pass

    def _sample_forever(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                roots = set(self._roots)
            # One pass over the process table for all roots (a scan per root costs a core with many nodes).
            children: dict[int, list[psutil.Process]] = {}
            for proc in psutil.process_iter(["ppid"]):
                children.setdefault(proc.info["ppid"], []).append(proc)
            pending = list(roots)
            while pending:
                for child in children.get(pending.pop(), ()):
                    try:
                        with self._lock:
                            self._seen.setdefault(child.pid, child.create_time())
                    except psutil.NoSuchProcess:
                        continue
                    pending.append(child.pid)
            self._stop.wait(self._interval)

    def alive(self) -> list[psutil.Process]:
        """Tracked processes still running (zombies are dead: only their parent can reap them)."""
        alive = []
        with self._lock:
            seen = dict(self._seen)
        for pid, created in seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        return alive

    def finish(self) -> list[str]:
        """Stop sampling, wait for the tree to die, kill what is left; returns descriptions of leftovers."""
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + GONE_TIMEOUT
        leftovers = self.alive()
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.1)
            leftovers = self.alive()
        described = []
        for proc in leftovers:
            try:
                described.append(f"{proc.pid} {' '.join(proc.cmdline())[:150]}")
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        return described

    @property
    def count(self) -> int:
        return len(self._seen)


@dataclasses.dataclass
class JobResult:
    returncode: Optional[int]
    output: str
    timed_out: bool


def run_job(cmd: list[str], env: dict[str, str], timeout: float, log_path: Path,
            cwd: Optional[Path] = None) -> JobResult:
    """Run ``cmd`` in its own session (in ``cwd``, default the repository); kill what is left, fail on orphans.

    Descendants are sampled while the job runs, so a process that was re-parented to
    init (an orphan) is still noticed at the end.
    """
    tracker = ProcessTracker()
    timed_out = False
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd or REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        tracker.add_root(proc.pid)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            leftovers = tracker.finish()
    output = log_path.read_text(encoding="utf-8", errors="replace")
    assert not leftovers, f"processes outlived the job: {leftovers}\n{output[-4000:]}"
    return JobResult(proc.returncode, output, timed_out)


class Launcher:
    """One ``python -m ft_core.launcher ... worker.py`` process (one node) and its files."""

    def __init__(self, directory: str, flags: list[str], env: dict[str, str],
                 script: Sequence[str] = (WORKER,), cwd: Optional[str] = None,
                 python_options: Sequence[str] = ()) -> None:
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.events_path = os.path.join(directory, "ft_events.jsonl")
        self.output_path = os.path.join(directory, "launcher.out")
        with open(self.output_path, "wb") as out:
            self.proc = spawn_python([*python_options, "-m", "ft_core.launcher", f"--log-dir={directory}", *flags,
                                      *script],
                                     env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)

    def events(self, name: Optional[str] = None) -> list[dict[str, Any]]:
        events = read_events(self.events_path)[0]
        return [e for e in events if name is None or e["event"] == name]

    def wait_event(self, name: str, timeout: float, count: int = 1, **match: Any) -> list[dict[str, Any]]:
        """Wait until ``count`` events named ``name`` with fields ``match`` are logged; fail early on exit."""

        def found() -> Optional[list[dict[str, Any]]]:
            hits = [e for e in self.events(name) if all(e.get(k) == v for k, v in match.items())]
            if len(hits) >= count:
                return hits
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited ({self.proc.returncode}) before {count} {name} "
                                     f"{match}:\n{self.output()[-4000:]}")
            return None

        return wait_for(found, timeout, f"{count} {name} event(s) {match}", interval=0.1)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"launcher still running after {timeout:.0f} s:\n{self.output()[-4000:]}") from None

    def output(self) -> str:
        with open(self.output_path, errors="replace") as handle:
            return handle.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)


class LauncherGroup:
    """Starts launchers for one test; on exit kills whatever is left and fails if anything survived."""

    def __init__(self, tmp_path: Any, sample_interval: float = 0.05) -> None:
        """``sample_interval``: how often the process trees are sampled (a scan of the process table)."""
        self.tmp_path = str(tmp_path)
        self.record_path = os.path.join(self.tmp_path, "workers.jsonl")
        self.tracker = ProcessTracker(sample_interval)
        self.launchers: list[Launcher] = []

    def start(self, *flags: str, name: Optional[str] = None, nproc: int = 2, script: Sequence[str] = (WORKER,),
              base_flags: tuple[str, ...] = FAST_FLAGS, python_options: Sequence[str] = (),
              **worker_env: str) -> Launcher:
        """Start a launcher with ``base_flags`` (``FAST_FLAGS``), ``flags`` and ``FT_TEST_*`` worker settings.

        ``script`` is the training script and its arguments (default: ``worker.py``); ``python_options``: the
        interpreter's options before ``-m ft_core.launcher``.
        """
        env = python_env(FT_TEST_RECORD=self.record_path, **worker_env)
        directory = os.path.join(self.tmp_path, name or f"node{len(self.launchers)}")
        launcher = Launcher(directory, [f"--nproc-per-node={nproc}", *base_flags, *flags], env, script,
                            python_options=python_options)
        self.tracker.add_root(launcher.proc.pid)
        self.launchers.append(launcher)
        return launcher

    def start_nodes(self, script: Sequence[str], nnodes: int = 2, *flags: str, **env: str) -> list[Launcher]:
        """``nnodes`` launchers of one job running ``script`` (no test worker, no fast flags): loopback
        c10d rendezvous, one process per node, in ``tmp_path`` as working directory."""
        rdzv = Rendezvous("c10d")
        nodes = []
        for index in range(nnodes):
            launcher = Launcher(os.path.join(self.tmp_path, f"node{index}"),
                                [*rdzv.flags(str(nnodes)), "--nproc-per-node=1", *flags], python_env(**env),
                                script=script, cwd=self.tmp_path)
            self.tracker.add_root(launcher.proc.pid)
            self.launchers.append(launcher)
            nodes.append(launcher)
            if index == 0:
                rdzv.wait_ready()
        return nodes

    def alive_now(self) -> list[str]:
        """Processes of the launcher trees alive at this instant (call once the launchers have exited:
        none of their job may be left then, not even for a moment)."""
        for record in self.worker_records():
            self.tracker.add(record["pid"])
            if "child" in record:
                self.tracker.add(record["child"])
        return [f"{proc.pid} {proc.name()}" for proc in self.tracker.alive()]

    def worker_records(self, event: Optional[str] = None) -> list[dict[str, Any]]:
        records = read_events(self.record_path)[0]
        return [r for r in records if event is None or r.get("event") == event]

    def __enter__(self) -> LauncherGroup:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        for launcher in self.launchers:
            launcher.kill()
        # Workers known from the logs too, in case one lived shorter than a sampling period.
        for record in self.worker_records():
            self.tracker.add(record["pid"])
        leftovers = self.tracker.finish()
        if leftovers and exc_type is None:
            raise AssertionError(f"processes of the launcher trees survived: {leftovers}")


def exit_event(launcher: Launcher) -> dict[str, Any]:
    (event,) = launcher.events("exit")
    return event


class Rendezvous:
    """One job's rendezvous on loopback: c10d (the first launcher hosts the store), etcd-v2 or etcd-v3 (``etcd``).

    etcd-v3 is given every member of ``etcd`` (``--rdzv-endpoint=h:p,h:p,...``); ``conf``: more ``--rdzv-conf``
    keys (``key=value``).
    """

    def __init__(self, backend: str, etcd: Optional[EtcdCluster] = None, keep_alive: Optional[int] = None,
                 conf: Sequence[str] = ()) -> None:
        if backend not in ("c10d", "etcd-v2", "etcd-v3") or (backend != "c10d") != (etcd is not None):
            raise ValueError(f"backend {backend!r} with etcd={etcd!r}")
        self.backend = backend
        self.etcd = etcd
        # A fresh id per job: the etcd server is shared by the test session.
        self.run_id = f"ft-test-{uuid.uuid4().hex[:12]}"
        self.port = free_port() if etcd is None else etcd.members[0].client_port
        #: torch's keep-alive interval (s); a dead node leaves the rendezvous after 3 missed ones.
        self.keep_alive = keep_alive
        self.conf = list(conf)

    @property
    def endpoint(self) -> str:
        if self.backend == "etcd-v3":
            assert self.etcd is not None
            return self.etcd.endpoints
        return f"127.0.0.1:{self.port}"

    def flags(self, nnodes: str, max_restarts: int = 3) -> list[str]:
        conf = ([f"keep_alive_interval={self.keep_alive}"] if self.keep_alive else []) + self.conf
        return [f"--nnodes={nnodes}", f"--rdzv-backend={self.backend}", f"--rdzv-endpoint={self.endpoint}",
                f"--rdzv-id={self.run_id}", "--local-addr=127.0.0.1", f"--max-restarts={max_restarts}",
                *([f"--rdzv-conf={','.join(conf)}"] if conf else [])]

    def wait_ready(self) -> None:
        """c10d: the first launcher hosts the rendezvous store; start the others once it serves."""
        if self.etcd is not None:
            return

        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(listening, 60, f"the rendezvous store on port {self.port}")

    def state(self) -> Any:
        """Torch's rendezvous state as its backend holds it (None before the first node joined)."""
        if self.etcd is None:
            from torch.distributed import TCPStore
            from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

            store = TCPStore("127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=10))
            backend: Any = C10dRendezvousBackend(store, self.run_id)
        elif self.backend == "etcd-v2":
            from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import EtcdRendezvousBackend

            backend = EtcdRendezvousBackend(self.etcd.client(), self.run_id, key_prefix="/torch/elastic/rendezvous")
        else:
            from ft_core.launcher.rendezvous.etcd_v3 import EtcdV3RendezvousBackend, JobLease, job_prefix

            client = self.etcd.v3_client()  # get_state only: the lease is never used
            backend = EtcdV3RendezvousBackend(client, f"{job_prefix(self.run_id)}/rdzv",
                                              JobLease(client, "", 60))
        state = backend.get_state()
        return pickle.loads(state[0]) if state is not None else None

    def spares_waiting(self) -> int:
        """How many nodes wait in the redundancy list of torch's rendezvous state (read from its backend)."""
        state = self.state()
        return len(state.redundancy_list) if state is not None else 0


def rendezvous_for(request: Any, backend: str, conf: tuple[str, ...] = ()) -> Rendezvous:
    """A rendezvous on ``backend`` (``c10d``, or ``etcd-v3`` on the test's ``etcd_server``; skipped without etcd3gw)."""
    if backend == "c10d":
        return Rendezvous("c10d", conf=conf)
    import pytest

    pytest.importorskip("etcd3gw", reason="etcd-v3 needs etcd3gw (pip install -e '.[etcd]')")
    return Rendezvous(backend, request.getfixturevalue("etcd_server"), conf=conf)
