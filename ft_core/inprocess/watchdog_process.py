"""The watchdog process: one per rank, outside the rank's interpreter.

It keeps working when the rank cannot (a main thread stuck in C code while
holding the GIL stops every thread of the rank). Its jobs:

* heartbeat to the in-process store, so other ranks can tell that this
  rank (with its monitor) is alive;
* notice peers whose heartbeat stopped (a lost node) and record them as
  terminated; if one of them runs the function in the current attempt,
  decide that the attempt restarts;
* notice that its own rank process is gone and record it at once, so the
  others need not wait for a heartbeat timeout;
* enforce the hard timeout: when the rank's main thread made no progress
  for ``hard_timeout`` seconds while running the function, record the rank as
  terminated and kill it (SIGTERM, then SIGKILL after
  ``termination_grace_time``).

It never outlives its rank: ``PR_SET_PDEATHSIG``, end of file on its stdin
and a parent-pid check each detect the rank's death, and an alarm bounds the
time it may spend reporting it.

The rank talks to it through stdin (a pickled ``WatchdogConfig`` at start, a
stop byte at the end; the pipe is private to the two processes) and through
``SharedState`` (progress, attempt, phase).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

from ft_core.utils.deadline import wait_until

from .exceptions import RestartAbort
from .restart_records import RestartRecords
from .shared_state import RestartPhase, SharedState
from .store_factory import StoreFactory

__all__ = ["WatchdogConfig", "RankWatchdogProcess"]

log = logging.getLogger("ft_core.inprocess")

_STOP = b"S"
_LENGTH = struct.Struct("!I")
_ENTRY = "from ft_core.inprocess.watchdog_process import main; main()"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class WatchdogConfig:
    store_factory: StoreFactory
    rank: int  # initial rank
    world_size: int  # initial world size
    parent_pid: int
    interval: float
    heartbeat_timeout: float
    hard_timeout: float
    termination_grace_time: float
    log_level: int


class RankWatchdogProcess:
    """The rank's handle on its watchdog process (the watchdog of one rank of in-process restart;
    not to be confused with ``ft_core.monitor.MonitorProcess``, the handle on a node monitor)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._proc = proc

    @classmethod
    def start(cls, config: WatchdogConfig, shared: SharedState) -> RankWatchdogProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        # The store loop logs each failure in one line; torch's C++ warnings would add a native stack per retry
        # (every heartbeat, for seconds, once the job's store is gone), burying the lines that matter.
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        proc = subprocess.Popen(
            [sys.executable, "-c", _ENTRY, str(shared.fd)],
            stdin=subprocess.PIPE,
            pass_fds=(shared.fd,),
            env=env,
        )
        assert proc.stdin is not None
        payload = pickle.dumps(config)
        proc.stdin.write(_LENGTH.pack(len(payload)) + payload)
        proc.stdin.flush()
        return cls(proc)

    def wait_ready(self, shared: SharedState, timeout: float) -> None:
        """Wait until the monitor is connected to the store, so it can report this rank's death."""

        def ready() -> bool:
            if shared.monitor_ready:
                return True
            if self._proc.poll() is not None:
                raise RestartAbort(f"the watchdog process exited with code {self._proc.returncode}")
            return False

        if not wait_until(ready, timeout, interval=0.01):
            raise RestartAbort(f"the watchdog process did not connect to the store within {timeout} s")

    def stop(self, timeout: float) -> None:
        """Ask the monitor to exit without reporting anything; kill it after ``timeout``."""
        stdin = self._proc.stdin
        assert stdin is not None
        if not stdin.closed:
            with contextlib.suppress(OSError):  # it may be gone already
                stdin.write(_STOP)
                stdin.flush()
            with contextlib.suppress(OSError):
                stdin.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


# ---------------------------------------------------------------------------------------------
# Inside the watchdog process


class _RankMonitor:
    def __init__(self, config: WatchdogConfig, shared: SharedState) -> None:
        self.cfg = config
        self.shared = shared
        self.stopped = threading.Event()  # the rank asked us to exit
        self.rank_gone = threading.Event()  # the rank process is gone
        self.wake = threading.Event()
        self.records: Optional[RestartRecords] = None
        self._heartbeat_seen: dict[int, tuple[int, float]] = {}
        self._active: dict[int, set[int]] = {}

    # -- events from other threads and signals ----------------------------------------------

    def on_rank_gone(self) -> None:
        # Bound the time left to report the death, whatever blocks: SIGALRM's
        # default action ends the process without needing the main thread.
        signal.alarm(math.ceil(self.cfg.termination_grace_time) + 1)
        self.rank_gone.set()
        self.wake.set()

    def watch_stdin(self, stdin: BinaryIO) -> None:
        if stdin.read(1) == _STOP:
            self.stopped.set()
            self.wake.set()
        else:  # end of file: the rank died (its end of the pipe closed)
            self.on_rank_gone()

    # -- main thread: local checks, never blocked by the store ----------------------------------

    def run(self) -> None:
        threading.Thread(target=self._store_loop, name="store", daemon=True).start()
        while not self.stopped.is_set():
            if self.rank_gone.is_set() or os.getppid() != self.cfg.parent_pid:
                log.warning("rank %d: process exited; recording it as terminated", self.cfg.rank)
                self._report_termination()
                return
            if self.shared.armed and time.monotonic() - self.shared.progress > self.cfg.hard_timeout:
                self._terminate_rank()
                return
            self.wake.wait(self.cfg.interval)

    def _terminate_rank(self) -> None:
        idle = time.monotonic() - self.shared.progress
        log.error(
            "rank %d: no progress for %.1f s (hard_timeout=%s s); terminating it",
            self.cfg.rank, idle, self.cfg.hard_timeout,
        )
        self._report_termination()
        self._signal_rank(signal.SIGTERM)
        wait_until(lambda: os.getppid() != self.cfg.parent_pid, self.cfg.termination_grace_time)
        self._signal_rank(signal.SIGKILL)

    def _signal_rank(self, sig: int) -> None:
        if os.getppid() == self.cfg.parent_pid:  # else it is gone and the pid may be reused
            try:
                os.kill(self.cfg.parent_pid, sig)
            except ProcessLookupError:
                pass

    def _report_termination(self) -> None:
        """Record this rank as terminated (at most ``termination_grace_time`` s, best effort)."""
        reporter = threading.Thread(target=self._record_own_termination, daemon=True)
        reporter.start()
        reporter.join(self.cfg.termination_grace_time)

    # -- store thread ----------------------------------------------------------------------

    def _store_loop(self) -> None:
        failures = 0
        while not self.stopped.is_set():
            try:
                if self.records is None:
                    self.records = self._connect()
                    self.shared.monitor_ready = True
                self.records.heartbeat(self.cfg.rank)
                self._check_peers(self.records)
                failures = 0
            except Exception as exc:  # keep monitoring locally; the rank sees store failures itself
                failures += 1
                if failures == 1:
                    log.warning("rank %d: in-process store failed: %s", self.cfg.rank, exc)
            self.stopped.wait(self.cfg.interval)

    def _connect(self) -> RestartRecords:
        records = RestartRecords(
            self.cfg.store_factory(host=False, timeout=self.cfg.heartbeat_timeout),
            self.cfg.world_size,
            self.cfg.interval,
        )
        records.init_heartbeats()
        return records

    def _check_peers(self, records: RestartRecords) -> None:
        now = time.monotonic()
        terminated = records.terminated()
        peers = [r for r in range(self.cfg.world_size) if r != self.cfg.rank and r not in terminated]
        stale = set()
        for peer, count in zip(peers, records.heartbeats(peers)):
            seen = self._heartbeat_seen.get(peer)
            if seen is None or seen[0] != count:
                self._heartbeat_seen[peer] = (count, now)
            elif now - seen[1] > self.cfg.heartbeat_timeout:
                log.warning("rank %d: no heartbeat for %.1f s; recording it as terminated", peer, now - seen[1])
                stale.add(peer)
        for peer in stale:
            records.mark_terminated(peer)
        self._restart_if_active(records, terminated | stale)

    def _record_own_termination(self) -> None:
        records = self.records
        if records is not None:
            records.mark_terminated(self.cfg.rank)
            self._restart_if_active(records, {self.cfg.rank})

    def _restart_if_active(self, records: RestartRecords, terminated: set[int]) -> None:
        """Restart the rank's current attempt if a terminated process runs the function in it."""
        if not terminated or self.shared.phase != RestartPhase.MEMBER:
            return
        attempt = self.shared.attempt
        active = self._active.get(attempt)
        if active is None:
            active = records.active(attempt)
            if active is None:
                return
            self._active[attempt] = active
        lost = active & terminated
        if lost and records.decision(attempt) is None:
            records.report_restart(attempt, min(lost), f"rank(s) {sorted(lost)} terminated")


def _read_config(stdin: BinaryIO) -> WatchdogConfig:
    header = stdin.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        raise SystemExit(0)  # the rank died before it could configure us
    (length,) = _LENGTH.unpack(header)
    config = pickle.loads(stdin.read(length))  # our parent wrote it; the pipe is private
    if not isinstance(config, WatchdogConfig):
        raise SystemExit(f"ft_core.inprocess monitor: unexpected configuration {type(config).__name__}")
    return config


def main() -> None:
    """Entry point of the watchdog process (``python -c ...``, see ``RankWatchdogProcess.start``)."""
    from ft_core.utils.procutil import die_with_parent

    rank_gone = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: rank_gone.set())
    die_with_parent(signal.SIGUSR1)
    stdin = sys.stdin.buffer
    config = _read_config(stdin)
    logging.basicConfig(
        level=config.log_level,
        format=f"%(asctime)s ft_core.inprocess monitor[rank {config.rank}] %(levelname)s: %(message)s",
    )
    monitor = _RankMonitor(config, SharedState(int(sys.argv[1])))
    signal.signal(signal.SIGUSR1, lambda *_: monitor.on_rank_gone())
    if rank_gone.is_set():
        monitor.on_rank_gone()
    threading.Thread(target=monitor.watch_stdin, args=(stdin,), name="stdin", daemon=True).start()
    monitor.run()
    logging.shutdown()
    # Do not wait for daemon threads that may sit in a store call or a torch import.
    os._exit(0)
