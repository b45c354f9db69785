"""Helpers for ft_launcher tests: start real launchers, read their events, and prove no process survives.

Workers run in their own sessions and outlive nothing by design, but a bug
could orphan them (reparented away from pytest), where the autouse
``no_orphan_processes`` fixture cannot see them. :class:`ProcessTracker`
therefore samples every launcher's process tree while the test runs and, at
the end, checks that none of the processes it ever saw is still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

import psutil
from helpers import REPO_ROOT, python_env, spawn_python, wait_for

from ft_core.monitor import read_events

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

    def __init__(self) -> None:
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
                roots = list(self._roots)
            for root in roots:
                try:
                    for child in psutil.Process(root).children(recursive=True):
                        self.add(child.pid)
                except psutil.NoSuchProcess:
                    pass
            self._stop.wait(0.05)

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


class Launcher:
    """One ``python -m ft_core.launcher ... worker.py`` process (one node) and its files."""

    def __init__(self, directory: str, flags: list[str], env: dict[str, str], script: Sequence[str] = (WORKER,)
                 ) -> None:
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.events_path = os.path.join(directory, "ft_events.jsonl")
        self.output_path = os.path.join(directory, "launcher.out")
        with open(self.output_path, "wb") as out:
            self.proc = spawn_python(["-m", "ft_core.launcher", f"--log-dir={directory}", *flags, *script],
                                     env=env, stdout=out, stderr=subprocess.STDOUT)

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

    def __init__(self, tmp_path: Any) -> None:
        self.tmp_path = str(tmp_path)
        self.record_path = os.path.join(self.tmp_path, "workers.jsonl")
        self.tracker = ProcessTracker()
        self.launchers: list[Launcher] = []

    def start(self, *flags: str, name: Optional[str] = None, nproc: int = 2, script: Sequence[str] = (WORKER,),
              **worker_env: str) -> Launcher:
        """Start a launcher with ``FAST_FLAGS``, ``flags`` and ``FT_TEST_*`` worker settings.

        ``script`` is the training script and its arguments (default: ``worker.py``).
        """
        env = python_env(FT_TEST_RECORD=self.record_path, **worker_env)
        directory = os.path.join(self.tmp_path, name or f"node{len(self.launchers)}")
        launcher = Launcher(directory, [f"--nproc-per-node={nproc}", *FAST_FLAGS, *flags], env, script)
        self.tracker.add_root(launcher.proc.pid)
        self.launchers.append(launcher)
        return launcher

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
