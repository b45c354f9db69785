"""The node monitor's loop and its actions: read every rank, judge deadlines, act on hangs, live-rank evidence, status.

It serves all local ranks over one ``AF_UNIX`` socket from a single-threaded
event loop. Each connected rank has deadlines (first heartbeat, next heartbeat,
every open tracked section, time out of any section: the rules of one rank are
in :mod:`.watched_rank`); the loop sleeps exactly until the earliest one, so a
hang is detected within milliseconds of its deadline, not on a polling
interval. On a hang (see :mod:`.hang`) it logs what and where, asks the rank
for a faulthandler stack dump, then sends ``SIGCONT`` and the termination
signal, and records every step as a JSON line the launcher reads. Each message
goes to its handler (see :mod:`.handlers`: one per message type, the heartbeat
first and inline).

No false kills from a late monitor. Frames already sent count before any
deadline is judged: each pass reads every readable connection first, and a
rank's connection is read once more just before its expiry is acted on. The
monitor also judges only time it was itself awake for: while anything is
timed it wakes at least every :data:`AWAKE_TICK`, and a wake-up later than
planned by more than :data:`LATE_THRESHOLD` (a stopped process, VM steal, an
overloaded node) is granted to every rank as grace -- the monitor's clock
(:meth:`RankMonitorServer._now`) skips it, which moves every running deadline
by the same amount -- and recorded as a ``monitor_late`` event. A rank past
its deadline that is runnable but not getting a CPU is starved, not hung: it
is judged once it is asleep or blocked, or has run (see
:func:`~ft_core.monitor.watched_rank.cpu_probe`); one whose saves progress on
slow storage gets more time (see :mod:`.slow_storage`).

Hostile or broken peers cost the other ranks nothing (see :mod:`.defences`:
accept, shed, caps, rejection, the descriptor reserve).

This module must not import torch: one monitor per node should cost a few MB.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from typing import Optional

from ft_core.config import FaultToleranceConfig
from ft_core.config_loading import LoadedConfig
from ft_core.event_file import EventWriter
from ft_core.events import Event, MonitorLate, MonitorStarted, PhaseMedians, RankDisconnected, RankTerminated
from ft_core.jobdir import PRIVATE_FILE_MODE, JobDir, saved_stack_path
from ft_core.monitor.defences import HANDSHAKE_TIMEOUT, Connection, Defences
from ft_core.monitor.handlers import MessageHandlers
from ft_core.monitor.hang import DumpWait, Expiry, Hang
from ft_core.monitor.live_ranks import LiveRanksEvidence
from ft_core.monitor.slow_storage import SlowStorage
from ft_core.monitor.spawn import run_in_subprocess
from ft_core.monitor.stack_copy import STACK_COPY_CLOSE_TIMEOUT, StackCopier
from ft_core.monitor.status import STATUS_INTERVAL, MonitorStatus, RankStatus, status_path, write_status
from ft_core.monitor.watched_rank import WatchedRank, cpu_probe
from ft_core.protocol import ProtocolError, check_max_frame_bytes
from ft_core.straggler_scoring import PhaseWindows
from ft_core.utils import procutil
from ft_core.utils.ratelimit import LogThrottle

__all__ = ["AWAKE_TICK", "LATE_THRESHOLD", "RankMonitorServer"]

log = logging.getLogger("ft_core.monitor")

#: While any deadline runs, the loop sleeps at most this long, so a stall of the
#: monitor itself is measured to within this much (it cannot see a stall that
#: begins and ends inside one planned sleep).
AWAKE_TICK = 0.1
#: A wake-up later than planned by more than this was the monitor's fault, not the
#: ranks': it is granted to every rank as grace and recorded as ``monitor_late``.
LATE_THRESHOLD = 0.1
#: At most this many "woke late" warnings per window (an overloaded node is late at every tick); every late
#: wake-up is still recorded (``monitor_late``), and the next warning says how many were not logged.
LATE_WARNINGS_PER_WINDOW, LATE_WARNING_WINDOW = 3, 60.0
#: One ``recv`` per readable connection and loop pass: a flooding rank cannot starve the others.
READ_CHUNK = 1 << 15
#: Before acting on an expiry the rank's connection is read until empty, at most this many
#: chunks; a rank with more still waiting is alive and sending, and is judged on a later pass.
REFRESH_CHUNKS = 8


class RankMonitorServer:
    """Watches the ranks of one node; see the module docstring.

    Args:
        cfg: timeouts and behaviour; ranks receive it in the handshake. A config as loaded
            (:class:`~ft_core.config_loading.LoadedConfig`): a rank's fallback values fill in the keys
            not set at launch (:func:`~ft_core.config_fallback.with_fallback`); a config alone: every key was set.
        socket_path: where to listen. Its directory is created with mode 0700.
        token: the job secret every connection must present first.
        events_path: JSON-lines event log (default: the socket's :class:`~ft_core.jobdir.JobDir` ``monitor_events``).
        stacks_dir: keep each hung rank's stack there as :func:`ft_core.jobdir.saved_stack_path` names it
            (by the cycle it hung in: the rank's ``TORCHELASTIC_RESTART_COUNT``) and report that path;
            default: the rank's own dump file.
    """

    def __init__(
        self,
        cfg: FaultToleranceConfig | LoadedConfig,
        socket_path: str,
        token: str,
        events_path: Optional[str] = None,
        stacks_dir: Optional[str] = None,
        launcher_reports_hangs: bool = False,
    ) -> None:
        if not token:
            raise ValueError("token: a non-empty job token is required")
        launched = LoadedConfig.of(cfg)
        cfg = launched.cfg
        check_max_frame_bytes(cfg.max_frame_bytes)  # fail at start, not at the first connection
        self.cfg = cfg
        self.socket_path = os.path.abspath(socket_path)
        self.job_dir = JobDir.of_socket(self.socket_path)
        self.events_path = events_path or self.job_dir.monitor_events
        self.dump_dir = self.job_dir.stacks
        self.stacks_dir = stacks_dir
        #: ft_launcher tells each hang in one line (its diagnosis: the culprit, its stack): this monitor's line
        #: per hung rank, often a rank that only waited, then goes to DEBUG. Alone, the monitor's line is the report.
        self._hang_log_level = logging.DEBUG if launcher_reports_hangs else logging.ERROR
        self._selector = selectors.DefaultSelector()
        self._connections: dict[int, Connection] = {}
        #: Accept, shed, cap and reject connections (see :mod:`.defences`); it fills ``_connections``.
        self._defences = Defences(cfg, self.socket_path, self._selector, self._connections, self._now, self._record,
                                  self._drop)
        self._listener: Optional[socket.socket] = None
        self._events: Optional[EventWriter] = None
        self._running = False
        self._parent_pid = os.getppid()
        #: Seconds of monitor lateness granted to the ranks so far; see :meth:`_now`.
        self._grace = 0.0
        self._late_warnings = LogThrottle(LATE_WARNINGS_PER_WINDOW, LATE_WARNING_WINDOW)
        #: Set by :meth:`request_live_ranks` (a signal handler); the socket pair wakes the loop for it.
        self._live_ranks_requested = False
        self._live_ranks: Optional[LiveRanksEvidence] = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        #: Straggler detection: phase durations per rank, and the report round last closed (see :meth:`_periodic`).
        self._phases = PhaseWindows(cfg.straggler_window)
        self._phase_round: Optional[int] = None
        #: One handler per message type (see :mod:`.handlers`).
        self._messages = MessageHandlers(launched, token.encode(), self.dump_dir, self._phases, self._record, self._drop,
                                         self._record_disconnect)
        #: The live status file for the launcher's metrics endpoint, and when it is due; None: metrics off.
        self._status_path = status_path(self.job_dir) if cfg.metrics_port is not None else None
        self._status_due = 0.0
        #: Copies hung ranks' stacks to ``stacks_dir`` in a thread: a stalled filesystem never delays a kill.
        self._stack_copies = StackCopier()
        #: Extends the deadline of a section whose rank moves bytes (see :mod:`.slow_storage`).
        self._slow_storage = SlowStorage(cfg, self._record)

    # -- setup / teardown -------------------------------------------------
    def _listen(self) -> None:
        self.job_dir.create()
        _remove_stale_socket(self.socket_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.socket_path)
        os.chmod(self.socket_path, PRIVATE_FILE_MODE)
        listener.listen(256)
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._listener = listener
        self._events = EventWriter(self.events_path)
        self._defences.open(listener)

    def close(self) -> None:
        self._stack_copies.close(STACK_COPY_CLOSE_TIMEOUT)
        for conn in list(self._connections.values()):
            self._drop(conn, log_it=False)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        if self._events is not None:
            self._events.close()
            self._events = None
        self._defences.close()
        for sock in (self._wake_r, self._wake_w):
            if sock.fileno() >= 0:
                try:
                    self._selector.unregister(sock)
                except (KeyError, ValueError):
                    pass  # only the read end is registered, and only while serving
                sock.close()

    def request_live_ranks(self) -> None:
        """Write a ``ranks_snapshot`` of the live ranks soon (safe from a signal handler; see :mod:`.live_ranks`)."""
        self._live_ranks_requested = True
        try:
            self._wake_w.send(b"s")
        except OSError:
            pass  # already woken (the pair's buffer is full), or closing

    def stop(self) -> None:
        """Make :meth:`serve_forever` return (safe from a signal handler)."""
        self._running = False

    # -- event log --------------------------------------------------------
    def _record(self, record: Event) -> None:
        if self._events is not None:
            self._events.write(record)

    # -- main loop --------------------------------------------------------
    def _now(self) -> float:
        """The monitor's clock: monotonic time minus the grace granted for its own lateness.

        Every deadline and sign of life is kept on this clock, so granting grace
        moves every running deadline at once.
        """
        return time.monotonic() - self._grace

    def serve_forever(self, ready_callback: Optional[Callable[[], None]] = None) -> None:
        self._listen()
        self._record(MonitorStarted(pid=os.getpid(), socket=self.socket_path))
        log.debug("rank monitor serving on %s (pid %d)", self.socket_path, os.getpid())
        if ready_callback is not None:
            ready_callback()
        self._running = True
        try:
            while self._running:
                # Judge only after the previous pass read every readable connection.
                timeout = min(self._check_deadlines(self._now()), self._periodic())
                planned_wake = time.monotonic() + timeout
                ready = self._selector.select(timeout)
                self._grant_lateness(time.monotonic() - planned_wake)
                for key, _mask in ready:
                    if key.data is None:
                        self._defences.accept()
                    elif key.data is self._wake_r:
                        _drain(self._wake_r)
                    elif key.data.sock.fileno() >= 0:
                        self._read(key.data)
                if os.getppid() != self._parent_pid:
                    log.warning("parent process exited; monitor stops")
                    break
        finally:
            self.close()

    def _periodic(self) -> float:
        """Close a straggler report round and write the status file when due; returns seconds until next due.

        Rounds are wall-clock aligned (round ``k`` ends at ``k * interval`` unix seconds) so that the rounds of
        every node of the job end together and the launcher can judge them side by side. Nothing is written,
        and the loop does not wake for rounds, while no rank marks phases.
        """
        wall = time.time()
        sleep = math.inf
        interval = self.cfg.straggler_report_interval
        if interval is not None:
            current = math.floor(wall / interval)
            if self._phase_round is None or current < self._phase_round:
                self._phase_round = current  # first pass, or the wall clock stepped back
            elif current > self._phase_round:
                self._phase_round = current
                medians = self._phases.report()
                if medians:
                    self._record(PhaseMedians(round=current, medians=medians))
            if self._phases.has_new():
                sleep = (current + 1) * interval - wall
        if self._status_path is not None:
            now = time.monotonic()
            if now >= self._status_due:
                self._write_status(wall)
                self._status_due = now + STATUS_INTERVAL
            sleep = min(sleep, self._status_due - now)
        return max(sleep, 0.0)

    def _write_status(self, wall: float) -> None:
        assert self._status_path is not None
        now = self._now()
        ranks = [RankStatus(rank=r.rank, pid=r.pid,
                            last_activity=None if r.last_activity is None else wall - (now - r.last_activity),
                            steps=r.steps, step_seconds=r.step_seconds, last_step_seconds=r.last_step_seconds)
                 for r in (conn.rank for conn in self._connections.values()) if r is not None]
        try:
            write_status(self._status_path, MonitorStatus(time=wall, ranks=ranks))
        except OSError as exc:  # metrics must never stop the monitor
            log.debug("cannot write the status file %s: %s", self._status_path, exc)

    def _grant_lateness(self, late: float) -> None:
        """The loop woke ``late`` seconds after it meant to: that time is not the ranks' fault."""
        if late <= LATE_THRESHOLD:
            return
        self._grace += late
        ranks = sorted(conn.rank.rank for conn in self._connections.values()
                       if conn.rank is not None and conn.rank.hang is None and conn.rank.next_deadline() is not None)
        held_back = self._late_warnings.allow()
        if held_back is not None:
            log.warning("monitor woke %.3f s late (overloaded node, VM steal or a stopped monitor?): every running "
                        "deadline moves by %.3f s; ranks %s%s", late, late, ranks,
                        f" ({held_back} more late wake-up(s) not logged, all recorded as monitor_late)"
                        if held_back else "")
        self._record(MonitorLate(late=round(late, 3), grace=round(late, 3), ranks=ranks))

    def _check_deadlines(self, now: float) -> float:
        """Act on every expired deadline; return how long the loop may sleep."""
        sleep = self.cfg.workload_check_interval
        if self._live_ranks_requested:
            self._live_ranks_requested = False
            self._start_live_ranks(now)
        if self._live_ranks is not None:
            sleep = min(sleep, self._advance_live_ranks(now))
        for conn in list(self._connections.values()):
            if conn.rank is None:
                if now - conn.accepted_at <= HANDSHAKE_TIMEOUT:
                    sleep = min(sleep, conn.accepted_at + HANDSHAKE_TIMEOUT - now)
                elif self._refresh(conn) and conn.rank is None and conn.sock.fileno() >= 0:
                    self._defences.reject(conn, "no handshake within %.0f s" % HANDSHAKE_TIMEOUT)
                continue
            rank = conn.rank
            if rank.hang is not None:
                sleep = min(sleep, self._advance_hang(rank, now))
                continue
            expiry = rank.next_deadline()
            if expiry is not None and expiry.deadline <= now:
                # Frames the rank sent while this pass ran count before it is blamed.
                if not self._refresh(conn):
                    sleep = 0.0  # still sending: judge it once its frames are read
                    continue
                if conn.rank is None:
                    continue  # it said goodbye, or its connection closed
                now = self._now()
                expiry = rank.next_deadline()
                if expiry is not None and expiry.deadline <= now:
                    if self._slow_storage.extend(rank, expiry, now):
                        sleep = 0.0  # judged again at its new deadline
                        continue
                    wait = cpu_probe(rank, expiry, now)
                    if wait is None:
                        self._on_hang(rank, expiry, now)
                        wait = 0.0
                    sleep = min(sleep, wait)
                    continue
            if expiry is not None:
                sleep = min(sleep, AWAKE_TICK, expiry.deadline - now)
                self._slow_storage.look(rank, expiry, now)
        return max(sleep, 0.0)

    # -- connections ------------------------------------------------------
    def _read(self, conn: Connection) -> bool:
        """Read and handle one chunk; True if more may be waiting (the chunk was full)."""
        try:
            data = conn.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return False
        try:
            messages = conn.decoder.feed(data)
        except ProtocolError as exc:
            self._defences.reject(conn, str(exc))
            return False
        now = self._now()
        handle = self._messages.handle
        for msg in messages:
            if conn.sock.fileno() < 0:
                return False
            try:
                handle(conn, msg, now)
            except ProtocolError as exc:
                self._defences.reject(conn, str(exc))
                return False
            except Exception as exc:  # noqa: BLE001 - one peer's input must never stop the node's monitor
                log.exception("error handling %s from pid %d", type(msg).__name__, conn.peer_pid)
                self._defences.reject(conn, f"internal error handling {type(msg).__name__}: {exc!r}")
                return False
        return len(data) == READ_CHUNK and conn.sock.fileno() >= 0

    def _refresh(self, conn: Connection) -> bool:
        """Read what ``conn`` sent since the last pass; False if more is still waiting."""
        for _ in range(REFRESH_CHUNKS):
            if not self._read(conn):
                return True
        return False

    def _drop(self, conn: Connection, log_it: bool = True) -> None:
        fileno = conn.sock.fileno()
        if fileno >= 0:
            self._selector.unregister(conn.sock)
            self._connections.pop(fileno, None)
            self._defences.forget(fileno)
            conn.sock.close()
        rank = conn.rank
        if rank is not None and log_it:
            if rank.hang is None and not conn.graceful:
                log.warning("rank %d (pid %d) disconnected without shutdown", rank.rank, rank.pid)
            self._record_disconnect(conn, rank)
        if rank is not None:
            self._phases.forget(rank.rank)
        conn.rank = None

    def _record_disconnect(self, conn: Connection, rank: WatchedRank) -> None:
        self._record(RankDisconnected(rank=rank.rank, pid=rank.pid, graceful=conn.graceful,
                                      training_finished=conn.training_finished))

    # -- hang handling ----------------------------------------------------
    def _on_hang(self, rank: WatchedRank, expiry: Expiry, now: float) -> None:
        hang = rank.hang = Hang.detect(expiry, rank=rank.rank, pid=rank.pid, iteration=rank.iteration,
                                       open_sections=list(rank.open_sections), now=now, wall_now=time.time(),
                                       # Read before the SIGCONT below: evidence for the diagnosis.
                                       stopped=rank.pid > 0 and procutil.is_stopped(rank.pid))
        log.debug("rank %d (pid %d) missed its %s deadline; requesting its stack", rank.rank, rank.pid,
                  hang.report.reason.value)
        sig = self.cfg.stack_dump_signal
        if sig is not None and rank.dump_path and rank.pid > 0:
            try:
                offset = _file_size(rank.dump_path)
                # A stopped process runs no signal handler: continue it first.
                os.kill(rank.pid, signal.SIGCONT)
                os.kill(rank.pid, sig)
                hang.request_stack_dump(offset, now + self.cfg.stack_dump_timeout)
            except OSError as exc:
                log.warning("could not request a stack dump from rank %d: %s", rank.rank, exc)
        self._advance_hang(rank, now)

    def _advance_hang(self, rank: WatchedRank, now: float) -> float:
        """Wait for the stack dump (without blocking other ranks), then terminate."""
        hang = rank.hang
        assert hang is not None
        if hang.terminated:
            return self.cfg.workload_check_interval
        wait = hang.poll(now, _file_size(rank.dump_path) if rank.dump_path else 0)
        if wait is not None:
            return wait
        self._terminate(rank, hang)
        return self.cfg.workload_check_interval

    def _terminate(self, rank: WatchedRank, hang: Hang) -> None:
        """Record the hang, kill the rank, then have its stack copied to ``stacks_dir`` off the loop.

        The record goes first (the launcher must know it was a hang when it sees the rank die), the
        kill next: the stack is read from the job dir (local, private), but the copy goes to the log
        directory, often a shared filesystem, whose stall must delay neither this kill nor any other
        rank's deadline.
        """
        stack = None
        if rank.dump_path and _file_size(rank.dump_path) > hang.dump_offset:
            stack = _read_from(rank.dump_path, hang.dump_offset)
            if stack is None:  # e.g. out of descriptors: the kill matters more than the stack
                log.error("could not read the stack of hung rank %d from %s", rank.rank, rank.dump_path)
            else:
                log.debug("stack of hung rank %d:\n%s", rank.rank, stack.rstrip())
        kept = None
        if stack is not None:
            kept = rank.dump_path if self.stacks_dir is None else saved_stack_path(
                self.stacks_dir, rank.restart_count, rank.rank, rank.pid)
        self._record(hang.terminate(stack, kept))
        sig = self.cfg.rank_termination_signal
        action = f"sent {sig.name}" if rank.pid > 0 else "not signalled (pid unknown)"
        if rank.pid > 0:
            try:
                os.kill(rank.pid, signal.SIGCONT)
                os.kill(rank.pid, sig)
            except ProcessLookupError:
                action = "it had already exited"
        # What, where, what was done, and where its stack is (the one line per hang without ft_launcher).
        log.log(self._hang_log_level, "%s; %s; stack: %s", hang.report.describe(), action,
                hang.report.stack_dump_file or "none (no dump)")
        self._record(RankTerminated(rank=rank.rank, pid=rank.pid, signal=sig.name))
        if stack is not None and self.stacks_dir is not None:
            self._stack_copies.submit(self.stacks_dir, rank.restart_count, rank.rank, rank.pid, stack,
                                      rank.dump_path)

    # -- evidence of the live ranks (diagnosis) ----------------------------
    def _start_live_ranks(self, now: float) -> None:
        """Take the evidence of every live rank and ask each that can dump for its stack."""
        evidence = self._live_ranks = LiveRanksEvidence()
        wall_now = time.time()
        sig = self.cfg.stack_dump_signal
        for conn in self._connections.values():
            rank = conn.rank
            if rank is None or rank.hang is not None:
                continue  # a hung rank's evidence is its hang_detected record
            dump = None
            # Only a rank that registered its dump handler (it sent a dump path, then a first sign of life)
            # is signalled: to any other the dump signal's default action would be death.
            if sig is not None and rank.dump_path and rank.pid > 0 and rank.first_activity is not None:
                try:
                    offset = _file_size(rank.dump_path)
                    os.kill(rank.pid, sig)
                    dump = DumpWait(offset, now + self.cfg.stack_dump_timeout)
                except OSError as exc:
                    log.debug("no stack dump from rank %d for the live ranks evidence: %s", rank.rank, exc)
            evidence.add(rank.evidence(now, wall_now), rank.dump_path, dump)
        self._advance_live_ranks(now)

    def _advance_live_ranks(self, now: float) -> float:
        """Wait for the evidence's dumps without blocking the loop; record it once they are in."""
        assert self._live_ranks is not None
        wait = self._live_ranks.poll(now, _file_size)
        if wait is not None:
            return wait
        self._record(self._live_ranks.record(_read_from))
        self._live_ranks = None
        return self.cfg.workload_check_interval

    # -- subprocess helper ------------------------------------------------
    #: Start a monitor in a new process: :func:`ft_core.monitor.spawn.run_in_subprocess`.
    run_in_subprocess = staticmethod(run_in_subprocess)


def _read_from(path: str, offset: int) -> Optional[str]:
    """What ``path`` holds past ``offset`` (None if it cannot be read, whatever the error: one rank's file)."""
    try:
        with open(path, errors="replace") as handle:
            handle.seek(offset)
            return handle.read()
    except (OSError, ValueError):
        return None


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass  # empty (EAGAIN)


def _file_size(path: str) -> int:
    """The size of one rank's dump file; 0 if it cannot be had, whatever the error (the monitor goes on)."""
    try:
        return os.path.getsize(path)
    except (OSError, ValueError):
        return 0


def _remove_stale_socket(path: str) -> None:
    """Remove a socket file left by a dead monitor; refuse to steal a live one."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise RuntimeError(f"another process is already serving {path}")
