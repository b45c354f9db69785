"""The node monitor's server: one event loop that watches every local rank and kills hung ones.

It serves all local ranks over one ``AF_UNIX`` socket from a single-threaded
event loop. Each connected rank has deadlines (first heartbeat, next heartbeat,
every open tracked section, time out of any section); the loop sleeps exactly
until the earliest one, so a hang is detected within milliseconds of its
deadline, not on a polling interval. On a hang (see :mod:`.hang`) it logs what
and where, asks the rank for a faulthandler stack dump, then sends ``SIGCONT``
and the termination signal, and records every step as a JSON line the
launcher reads.

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
is judged once it is asleep or blocked, or has run (see ``_cpu_probe``).

Hostile or broken peers cost the other ranks nothing: a connection that
sends garbage (see :class:`~ft_core.protocol.FrameDecoder` for the bounds)
is closed alone. At most :data:`MAX_PENDING_HANDSHAKES` connections may wait
for their Hello (beyond that the oldest is closed: a real rank says Hello at
once, so the oldest idle one is the likeliest to be junk); each gets
:data:`HANDSHAKE_TIMEOUT` seconds and may make the monitor buffer at most
:data:`~ft_core.protocol.MAX_HELLO_FRAME_BYTES` before it. When ``accept()``
fails for lack of file descriptors (EMFILE/ENFILE) the monitor closes the
pending connection with a descriptor it keeps in reserve for that, logs
once, and keeps watching the ranks already connected.

This module must not import torch: one monitor per node should cost a few MB.
"""

from __future__ import annotations

import dataclasses
import errno
import hmac
import logging
import math
import os
import selectors
import signal
import socket
import struct
import time
from collections.abc import Callable, Collection
from typing import NoReturn, Optional

from ft_core import procutil
from ft_core.config import FaultToleranceConfig
from ft_core.config_fallback import with_fallback
from ft_core.config_loading import LoadedConfig
from ft_core.events import (
    CheckpointReported,
    ConnectionRejected,
    DeadlineExtended,
    Event,
    EventWriter,
    HangReason,
    MonitorLate,
    MonitorStarted,
    PhaseMedians,
    RankConnected,
    RankDisconnected,
    RankEvidence,
    RankException,
    RankTerminated,
    TimeoutsUpdated,
)
from ft_core.jobdir import (
    LAUNCHER_SOCKET_ENV,
    PRIVATE_FILE_MODE,
    JobDir,
    saved_stack_path,
)
from ft_core.monitor.hang import DumpWait, Expiry, Hang
from ft_core.monitor.process import MonitorProcess, run_in_subprocess
from ft_core.monitor.snapshot import Snapshot
from ft_core.monitor.stack_copy import STACK_COPY_CLOSE_TIMEOUT, StackCopier
from ft_core.monitor.status import STATUS_INTERVAL, MonitorStatus, RankStatus, status_path, write_status
from ft_core.protocol import (
    MAX_HELLO_FRAME_BYTES,
    Ack,
    EndAllSections,
    FrameDecoder,
    Goodbye,
    Heartbeat,
    Hello,
    HelloAck,
    Message,
    PhaseTime,
    ProtocolError,
    ReportCheckpoint,
    ReportException,
    Role,
    SectionEnd,
    SectionStart,
    UpdateTimeouts,
    WorkloadControl,
    check_exception_report,
    check_max_frame_bytes,
    encode,
)
from ft_core.ratelimit import LogThrottle
from ft_core.straggler import MAX_PHASES_PER_RANK, STEP_PHASE, PhaseWindows, check_phase_sample
from ft_core.timeouts import (
    COMPILE_SECTION,
    STEP_SECTION,
    HeartbeatTimeouts,
    SectionTimeouts,
    apply_calculated,
    describe_timeouts,
    timeouts_of,
)
from ft_core.warmup import WarmupRule, warmup_step_timeout

__all__ = [
    "AWAKE_TICK", "HANDSHAKE_TIMEOUT", "LATE_THRESHOLD", "MAX_PENDING_HANDSHAKES", "OpenSection", "RankMonitorServer",
    "WatchedRank",
]

log = logging.getLogger("ft_core.monitor")

#: An unauthenticated connection must say Hello within this time.
HANDSHAKE_TIMEOUT = 5.0
#: While any deadline runs, the loop sleeps at most this long, so a stall of the
#: monitor itself is measured to within this much (it cannot see a stall that
#: begins and ends inside one planned sleep).
AWAKE_TICK = 0.1
#: A wake-up later than planned by more than this was the monitor's fault, not the
#: ranks': it is granted to every rank as grace and recorded as ``monitor_late``.
LATE_THRESHOLD = 0.1
#: One ``recv`` per readable connection and loop pass: a flooding rank cannot starve the others.
READ_CHUNK = 1 << 15
#: Before acting on an expiry the rank's connection is read until empty, at most this many
#: chunks; a rank with more still waiting is alive and sending, and is judged on a later pass.
REFRESH_CHUNKS = 8
#: A runnable rank past its deadline is declared hung once it has had this much CPU time since
#: without a sign of life; until then it is waiting for a CPU, not hung (see ``_cpu_probe``).
CPU_PROBE = 0.02
#: Slow storage: the monitor takes a look at a section's I/O counters this fraction of its timeout before
#: its deadline (at most IO_LOOK_MAX s), and extends a rank whose counters advanced by that much again.
IO_LOOK_FRACTION = 0.25
IO_LOOK_MAX = 30.0
#: Connections still waiting for their Hello; one more closes the oldest. Far above the local ranks of
#: any node connecting at once (each says Hello at once), far below what would strain the monitor.
MAX_PENDING_HANDSHAKES = 256
#: Connections accepted per loop pass, so a connect flood cannot delay deadline checks.
_ACCEPT_BATCH = 64
#: accept() errors that mean "out of descriptors": close the newcomer with the reserve descriptor.
_NO_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
#: accept() errors about one connection (it went away before we took it): skip it.
_GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})
#: After an accept() error that closing a connection cannot help, the loop pauses this long.
_ACCEPT_BACKOFF = 0.01
#: Rejections logged (and recorded) per window; beyond that they are counted and summarized.
_REJECTIONS_PER_WINDOW = 20
_REJECTION_WINDOW = 10.0
_PEERCRED = struct.Struct("3i")


@dataclasses.dataclass
class OpenSection:
    started: float
    #: A ``step`` in warm-up (WarmupRule): timed by :func:`~ft_core.timeouts.warmup_step_timeout`.
    warmup: bool = False
    #: The deadline once extended for I/O progress (see ``RankMonitorServer._io_extension``).
    extended_to: Optional[float] = None
    #: The rank's I/O byte count at the monitor's last look, and when: the progress is measured from it.
    io_look: Optional[tuple[float, int]] = None


@dataclasses.dataclass(frozen=True)
class _CpuProbe:
    """A rank past ``expiry`` but runnable: how much CPU it has had since (see ``_cpu_probe``)."""

    expiry: Expiry
    started: float
    cpu_seconds: float  # the rank's CPU time when the probe started
    warned: bool = False


@dataclasses.dataclass
class WatchedRank:
    """What the monitor knows about one connected rank, and the rules for its deadlines.

    Times are ``time.monotonic()`` seconds; the server passes ``now`` in, so the
    rules are testable without a clock.
    """

    rank: int
    local_rank: int
    pid: int
    cfg: FaultToleranceConfig  # the monitor's config, completed by the rank's fallback values
    restart_count: int
    connected_at: float
    hb: HeartbeatTimeouts
    sections: SectionTimeouts
    dump_path: Optional[str]
    first_activity: Optional[float] = None
    last_activity: Optional[float] = None
    iteration: Optional[int] = None
    open_sections: dict[str, OpenSection] = dataclasses.field(default_factory=dict)
    #: When the last tracked section closed; None while one is open and before the first one.
    out_of_section_since: Optional[float] = None
    #: Set while the rank is past a deadline but runnable: judged once it has had some CPU.
    cpu_probe: Optional[_CpuProbe] = None
    #: Set once a deadline passed; the rank is never watched again.
    hang: Optional[Hang] = None
    #: ``step`` sections completed, their total and last duration (seconds): for the metrics endpoint.
    steps: int = 0
    step_seconds: float = 0.0
    last_step_seconds: Optional[float] = None
    #: Which timeout times each ``step`` during warm-up; one rule per connection (= per cycle).
    warmup: WarmupRule = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.warmup = WarmupRule(self.cfg.num_warmup_iterations, self.sections.section)

    def touch(self, now: float, iteration: Optional[int] = None) -> None:
        """Record a sign of life: heartbeats and every section event count alike."""
        self.last_activity = now
        if self.first_activity is None:
            self.first_activity = now
        if iteration is not None:
            self.iteration = iteration

    def section_start(self, name: str, now: float, iteration: Optional[int] = None) -> None:
        """Open ``name``; during warm-up a ``step`` is timed as :class:`~ft_core.timeouts.WarmupRule` says."""
        self.touch(now, iteration)
        timed_as = self.warmup.section_opened(name, iteration)
        self.open_sections[name] = OpenSection(now, warmup=name == STEP_SECTION and timed_as != STEP_SECTION)
        self.out_of_section_since = None

    def section_end(self, name: str, now: float) -> bool:
        """Close ``name``; False if it was not open. Out-of-section time starts when none is left open.

        Closing ``compile`` resumes the sections it paused: their clocks skip the compilation.
        """
        self.touch(now)
        section = self.open_sections.pop(name, None)
        was_open = section is not None
        if section is not None and name == COMPILE_SECTION:
            for other in self.open_sections.values():
                other.started += now - section.started
                if other.extended_to is not None:
                    other.extended_to += now - section.started
        if section is not None and name == "step":
            self.steps += 1
            self.last_step_seconds = now - section.started
            self.step_seconds += self.last_step_seconds
        if not self.open_sections:
            self.out_of_section_since = now
        return was_open

    def end_all_sections(self, now: float) -> None:
        self.touch(now)
        self.open_sections.clear()
        self.out_of_section_since = now

    def evidence(self, now: float, wall_now: float) -> RankEvidence:
        """What this rank is doing at ``now`` (monotonic; ``wall_now`` is the same instant in unix time)."""
        last = self.last_activity
        expiry = self.next_deadline()
        return RankEvidence(
            rank=self.rank, pid=self.pid, iteration=self.iteration,
            section=next(reversed(self.open_sections), None),  # the innermost: opened last
            last_activity=None if last is None else round(wall_now - (now - last), 3),
            stalled_for=None if last is None else round(now - last, 3),
            stopped=self.pid > 0 and procutil.is_stopped(self.pid),
            timeout=None if expiry is None else expiry.timeout)

    def _warmup_timeout(self) -> Optional[float]:
        return warmup_step_timeout(self.sections, self.hb.initial, self.cfg.rank_section_timeouts.get(STEP_SECTION))

    def next_deadline(self) -> Optional[Expiry]:
        """The earliest deadline of this rank, or None when nothing is timed.

        While torch.compile compiles (``compile`` is open) only ``compile_timeout`` runs: a
        recompile is not a slow step, nor a missing heartbeat.
        """
        compiling = self.open_sections.get(COMPILE_SECTION)
        if compiling is not None:
            limit = self.cfg.compile_timeout
            return None if limit is None else Expiry(compiling.started + limit, HangReason.SECTION, COMPILE_SECTION,
                                                     limit, compiling.started)
        candidates = []
        if self.first_activity is None:
            if self.hb.initial is not None:
                candidates.append(Expiry(self.connected_at + self.hb.initial, HangReason.INITIAL_HEARTBEAT, None,
                                         self.hb.initial, self.connected_at))
        elif self.hb.subsequent is not None and self.last_activity is not None:
            candidates.append(Expiry(self.last_activity + self.hb.subsequent, HangReason.HEARTBEAT, None,
                                     self.hb.subsequent, self.last_activity))
        for name, section in self.open_sections.items():
            timeout = self._warmup_timeout() if section.warmup else self.sections.section.get(name)
            if timeout is not None:
                deadline = section.extended_to if section.extended_to is not None else section.started + timeout
                candidates.append(Expiry(deadline, HangReason.SECTION, name, timeout, section.started))
        # Out-of-section time runs only from the end of a section (None before the first
        # one): start-up is covered by the initial heartbeat timeout (NVRx does the same).
        since = self.out_of_section_since
        if not self.open_sections and since is not None and self.sections.out_of_section is not None:
            candidates.append(Expiry(since + self.sections.out_of_section, HangReason.OUT_OF_SECTION, None,
                                     self.sections.out_of_section, since))
        return min(candidates, key=lambda c: c.deadline) if candidates else None


class _Connection:
    def __init__(self, sock: socket.socket, max_frame_bytes: int, accepted_at: float) -> None:
        self.sock = sock
        self.decoder = FrameDecoder(max_frame_bytes, first_frame_bytes=min(MAX_HELLO_FRAME_BYTES, max_frame_bytes))
        self.accepted_at = accepted_at
        self.peer_pid = _peer_pid(sock)
        self.rank: Optional[WatchedRank] = None
        self.graceful = False
        #: The rank's Goodbye reported training complete.
        self.training_finished = False


def _peer_pid(sock: socket.socket) -> int:
    """The connecting process's pid from the kernel (SO_PEERCRED), not from what it claims."""
    try:
        pid, _uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        return pid
    except (OSError, AttributeError):
        return -1


class RankMonitorServer:
    """Watches the ranks of one node; see the module docstring.

    Args:
        cfg: timeouts and behaviour; ranks receive it in the handshake.
        socket_path: where to listen. Its directory is created with mode 0700.
        token: the job secret every connection must present first.
        events_path: JSON-lines event log (default: the socket's :class:`~ft_core.jobdir.JobDir` ``monitor_events``).
        stacks_dir: keep each hung rank's stack there as :func:`ft_core.jobdir.saved_stack_path` names it
            (by the cycle it hung in: the rank's ``TORCHELASTIC_RESTART_COUNT``) and report that path;
            default: the rank's own dump file.
        explicit_keys: the keys of ``cfg`` the user set at launch
            (:attr:`~ft_core.config_loading.LoadedConfig.explicit_keys`): a rank's fallback values fill
            in the others (:func:`~ft_core.config_fallback.with_fallback`). None: every key was set.
    """

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        socket_path: str,
        token: str,
        events_path: Optional[str] = None,
        stacks_dir: Optional[str] = None,
        launcher_reports_hangs: bool = False,
        explicit_keys: Optional[Collection[str]] = None,
    ) -> None:
        if not token:
            raise ValueError("token: a non-empty job token is required")
        check_max_frame_bytes(cfg.max_frame_bytes)  # fail at start, not at the first connection
        self.cfg = cfg
        self.explicit_keys = LoadedConfig.of(cfg, explicit_keys).explicit_keys
        self.socket_path = os.path.abspath(socket_path)
        self._token = token.encode()
        self.job_dir = JobDir.of_socket(self.socket_path)
        self.events_path = events_path or self.job_dir.monitor_events
        self.dump_dir = self.job_dir.stacks
        self.stacks_dir = stacks_dir
        #: ft_launcher tells each hang in one line (its diagnosis: the culprit, its stack): this monitor's line
        #: per hung rank, often a rank that only waited, then goes to DEBUG. Alone, the monitor's line is the report.
        self._hang_log_level = logging.DEBUG if launcher_reports_hangs else logging.ERROR
        #: The last timeouts logged at INFO: all ranks send the same values, at every calculation.
        self._logged_timeouts: Optional[str] = None
        self._selector = selectors.DefaultSelector()
        self._connections: dict[int, _Connection] = {}
        #: Connections without a handshake yet, oldest first (entries of ranks that said Hello linger
        #: until the next pruning).
        self._pending: dict[int, _Connection] = {}
        #: A descriptor kept free so that, out of descriptors, a connection can still be accepted and closed.
        self._reserve_fd: Optional[int] = None
        #: Connections closed unserved for lack of descriptors since it began; None while descriptors last.
        self._shed: Optional[int] = None
        self._rejections = LogThrottle(_REJECTIONS_PER_WINDOW, _REJECTION_WINDOW)
        self._listener: Optional[socket.socket] = None
        self._events: Optional[EventWriter] = None
        self._running = False
        self._parent_pid = os.getppid()
        #: Seconds of monitor lateness granted to the ranks so far; see :meth:`_now`.
        self._grace = 0.0
        #: Set by :meth:`request_snapshot` (a signal handler); the socket pair wakes the loop for it.
        self._snapshot_requested = False
        self._snapshot: Optional[Snapshot] = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        #: Straggler detection: phase durations per rank, and the report round last closed (see :meth:`_periodic`).
        self._phases = PhaseWindows(cfg.straggler_window)
        self._phase_round: Optional[int] = None
        #: The live status file for the launcher's metrics endpoint, and when it is due; None: metrics off.
        self._status_path = status_path(self.job_dir) if cfg.metrics_port is not None else None
        self._status_due = 0.0
        #: Copies hung ranks' stacks to ``stacks_dir`` in a thread: a stalled filesystem never delays a kill.
        self._stack_copies = StackCopier()

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
        self._reserve_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

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
        if self._reserve_fd is not None:
            os.close(self._reserve_fd)
            self._reserve_fd = None
        for sock in (self._wake_r, self._wake_w):
            if sock.fileno() >= 0:
                try:
                    self._selector.unregister(sock)
                except (KeyError, ValueError):
                    pass  # only the read end is registered, and only while serving
                sock.close()

    def request_snapshot(self) -> None:
        """Write a ``ranks_snapshot`` of the live ranks soon (safe from a signal handler; see :mod:`.snapshot`)."""
        self._snapshot_requested = True
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
                        self._accept()
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
        log.warning("monitor woke %.3f s late (overloaded node, VM steal or a stopped monitor?): every running "
                    "deadline moves by %.3f s; ranks %s", late, late, ranks)
        self._record(MonitorLate(late=round(late, 3), grace=round(late, 3), ranks=ranks))

    def _check_deadlines(self, now: float) -> float:
        """Act on every expired deadline; return how long the loop may sleep."""
        sleep = self.cfg.workload_check_interval
        if self._snapshot_requested:
            self._snapshot_requested = False
            self._start_snapshot(now)
        if self._snapshot is not None:
            sleep = min(sleep, self._advance_snapshot(now))
        for conn in list(self._connections.values()):
            if conn.rank is None:
                if now - conn.accepted_at <= HANDSHAKE_TIMEOUT:
                    sleep = min(sleep, conn.accepted_at + HANDSHAKE_TIMEOUT - now)
                elif self._refresh(conn) and conn.rank is None and conn.sock.fileno() >= 0:
                    self._reject(conn, "no handshake within %.0f s" % HANDSHAKE_TIMEOUT)
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
                    if self._io_extension(rank, expiry, now):
                        sleep = 0.0  # judged again at its new deadline
                        continue
                    wait = self._cpu_probe(rank, expiry, now)
                    if wait is None:
                        self._on_hang(rank, expiry, now)
                        wait = 0.0
                    sleep = min(sleep, wait)
                    continue
            if expiry is not None:
                sleep = min(sleep, AWAKE_TICK, expiry.deadline - now)
                self._io_look(rank, expiry, now)
        return max(sleep, 0.0)

    # -- slow storage: I/O progress extends a section's deadline --------------
    def _io_section(self, rank: WatchedRank, expiry: Expiry) -> Optional[OpenSection]:
        """The open section whose deadline ``expiry`` is, when slow-storage extensions apply to it."""
        if self.cfg.io_progress_cap is None or expiry.reason is not HangReason.SECTION or rank.pid <= 0:
            return None
        return rank.open_sections.get(expiry.section or "")

    def _io_look(self, rank: WatchedRank, expiry: Expiry, now: float) -> None:
        """Shortly before a section's deadline, note the rank's I/O byte count: the baseline of its progress."""
        section = self._io_section(rank, expiry)
        if section is None or section.io_look is not None or now < expiry.deadline - _io_interval(expiry.timeout):
            return
        count = procutil.io_bytes(rank.pid)
        if count is not None:
            section.io_look = (now, count)

    def _io_extension(self, rank: WatchedRank, expiry: Expiry, now: float) -> bool:
        """Extend a section past its deadline while its rank moves bytes (slow storage), up to the cap.

        Evidence the monitor reads without the rank's help: the rank's read and written bytes
        (``/proc/<pid>/io``) advanced since the last look. Then the deadline moves one look
        interval on, to at most ``io_progress_cap`` times the timeout from the section's start;
        the first extension of a section is recorded (``deadline_extended``) and logged. Without
        progress, or past the cap, the rank is judged as before (returns False).
        """
        section = self._io_section(rank, expiry)
        if section is None or section.io_look is None:
            return False
        cap = self.cfg.io_progress_cap
        assert cap is not None  # _io_section returns a section only when extensions are on
        limit = expiry.since + cap * expiry.timeout
        if now >= limit:
            return False
        count = procutil.io_bytes(rank.pid)
        if count is None or count <= section.io_look[1]:
            return False
        moved = count - section.io_look[1]
        first = section.extended_to is None
        section.io_look = (now, count)
        section.extended_to = min(now + _io_interval(expiry.timeout), limit)
        if first:
            log.warning("rank %d (pid %d) is past its %.3g s deadline in section %r but moving bytes (%d since the "
                        "last look; slow storage?): its deadline is extended while they keep moving, up to %.3g s",
                        rank.rank, rank.pid, expiry.timeout, expiry.section, moved, cap * expiry.timeout)
            self._record(DeadlineExtended(rank=rank.rank, pid=rank.pid, section=expiry.section or "",
                                          timeout=expiry.timeout, bytes=moved, cap=cap))
        return True

    def _cpu_probe(self, rank: WatchedRank, expiry: Expiry, now: float) -> Optional[float]:
        """Seconds to wait before judging ``rank`` past ``expiry``, or None to judge it now.

        A rank that is runnable but not running -- waiting for a CPU on an
        overloaded node -- is starved, not hung. So a rank past its deadline is
        declared hung only once it is asleep or blocked (a hang in a collective,
        a lock, I/O), or has been on a CPU for :data:`CPU_PROBE` seconds since
        without a sign of life (a busy hang). A sleeping rank is judged at once.
        """
        sample = procutil.cpu_sample(rank.pid) if rank.pid > 0 else None
        if sample is None or not sample.runnable:
            return None
        probe = rank.cpu_probe
        if probe is None or probe.expiry != expiry:
            rank.cpu_probe = _CpuProbe(expiry, now, sample.cpu_seconds)
            return CPU_PROBE
        if sample.cpu_seconds - probe.cpu_seconds >= CPU_PROBE:
            return None  # it ran and said nothing
        if not probe.warned and now - probe.started >= 2 * CPU_PROBE:
            rank.cpu_probe = dataclasses.replace(probe, warned=True)
            log.warning("rank %d (pid %d) is past its %s deadline but waiting for a CPU (overloaded node?): "
                        "it is judged once it has run", rank.rank, rank.pid, expiry.reason.value)
        return CPU_PROBE

    # -- connections ------------------------------------------------------
    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _GONE:
                    continue
                if exc.errno in _NO_DESCRIPTORS and self._shed_one(exc):
                    continue
                log.warning("accept() failed on %s: %s; retrying", self.socket_path, exc)
                time.sleep(_ACCEPT_BACKOFF)  # the listener stays readable: do not spin
                return
            if self._shed is not None:
                log.warning("file descriptors available again: accepting connections (%d closed unserved "
                            "meanwhile)", self._shed)
                self._shed = None
            sock.setblocking(False)
            conn = _Connection(sock, self.cfg.max_frame_bytes, self._now())
            self._connections[sock.fileno()] = conn
            self._pending[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._cap_pending()

    def _shed_one(self, exc: OSError) -> bool:
        """Out of descriptors: accept the next connection on the reserve descriptor and close it at once.

        Empties the backlog instead of spinning on a readable listener; the
        ranks already connected are still watched. Logged once per shortage.
        Returns False if even that failed (another process took the slot).
        """
        if self._shed is None:
            log.warning("out of file descriptors (%s): closing new connections until some are free; "
                        "%d connected ranks are still watched", exc,
                        sum(1 for c in self._connections.values() if c.rank is not None))
            self._shed = 0
        if self._reserve_fd is None:
            return False
        os.close(self._reserve_fd)
        self._reserve_fd = None
        try:
            assert self._listener is not None
            sock, _ = self._listener.accept()
            sock.close()
            self._shed = self._shed + 1
            return True
        except OSError:
            return False
        finally:
            try:
                self._reserve_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass  # tried again at the next shortage

    def _cap_pending(self) -> None:
        """Keep at most MAX_PENDING_HANDSHAKES connections waiting for their Hello: close the oldest."""
        if len(self._pending) <= MAX_PENDING_HANDSHAKES:
            return
        self._pending = {fd: c for fd, c in self._pending.items() if c.rank is None}
        while len(self._pending) > MAX_PENDING_HANDSHAKES:
            oldest = next(iter(self._pending.values()))
            self._reject(oldest, f"too many pending handshakes ({MAX_PENDING_HANDSHAKES}): closing the oldest")

    def _read(self, conn: _Connection) -> bool:
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
            self._reject(conn, str(exc))
            return False
        now = self._now()
        for msg in messages:
            if conn.sock.fileno() < 0:
                return False
            try:
                self._handle(conn, msg, now)
            except ProtocolError as exc:
                self._reject(conn, str(exc))
                return False
            except Exception as exc:  # noqa: BLE001 - one peer's input must never stop the node's monitor
                log.exception("error handling %s from pid %d", type(msg).__name__, conn.peer_pid)
                self._reject(conn, f"internal error handling {type(msg).__name__}: {exc!r}")
                return False
        return len(data) == READ_CHUNK and conn.sock.fileno() >= 0

    def _refresh(self, conn: _Connection) -> bool:
        """Read what ``conn`` sent since the last pass; False if more is still waiting."""
        for _ in range(REFRESH_CHUNKS):
            if not self._read(conn):
                return True
        return False

    def _reply(self, conn: _Connection, msg: Message) -> None:
        try:
            conn.sock.send(encode(msg))
        except OSError:
            # A peer that does not read its replies is broken; only it is dropped.
            self._drop(conn)

    def _reject(self, conn: _Connection, reason: str) -> None:
        # Throttled: a flood of bad connections must not flood the log and the event file too.
        held_back = self._rejections.allow()
        if held_back is not None:
            who = f"rank {conn.rank.rank}" if conn.rank else f"pid {conn.peer_pid}"
            more = f" ({held_back} more rejections not logged before this one)" if held_back else ""
            log.warning("closing connection from %s: %s%s", who, reason, more)
            self._record(ConnectionRejected(pid=conn.peer_pid, reason=reason + more))
        self._drop(conn, log_it=False)

    def _drop(self, conn: _Connection, log_it: bool = True) -> None:
        fileno = conn.sock.fileno()
        if fileno >= 0:
            self._selector.unregister(conn.sock)
            self._connections.pop(fileno, None)
            self._pending.pop(fileno, None)
            conn.sock.close()
        rank = conn.rank
        if rank is not None and log_it:
            if rank.hang is None and not conn.graceful:
                log.warning("rank %d (pid %d) disconnected without shutdown", rank.rank, rank.pid)
            self._record_disconnect(conn, rank)
        if rank is not None:
            self._phases.forget(rank.rank)
        conn.rank = None

    def _record_disconnect(self, conn: _Connection, rank: WatchedRank) -> None:
        self._record(RankDisconnected(rank=rank.rank, pid=rank.pid, graceful=conn.graceful,
                                      training_finished=conn.training_finished))

    # -- messages ---------------------------------------------------------
    def _handle(self, conn: _Connection, msg: Message, now: float) -> None:
        rank = conn.rank
        if rank is None:
            self._handshake(conn, msg, now)
            return
        if isinstance(msg, Heartbeat):
            rank.touch(now, msg.iteration)
        elif isinstance(msg, SectionStart):
            rank.section_start(msg.name, now, msg.iteration)
            self._ack_section(conn)
        elif isinstance(msg, SectionEnd):
            if not rank.section_end(msg.name, now):
                log.debug("rank %d closed section %r that was not open", rank.rank, msg.name)
            elif (msg.name == STEP_PHASE and self.cfg.straggler_report_interval is not None
                  and rank.last_step_seconds is not None):
                # The reference of straggler detection's relative floor (never scored itself).
                self._phases.add(rank.rank, STEP_PHASE, rank.last_step_seconds)
            self._ack_section(conn)
        elif isinstance(msg, EndAllSections):
            rank.end_all_sections(now)
            self._ack_section(conn)
        elif isinstance(msg, UpdateTimeouts):
            try:
                rank.hb, rank.sections = apply_calculated(rank.hb, rank.sections, msg.state)
            except ValueError as exc:
                self._refuse(conn, f"invalid timeouts from rank {rank.rank}: {exc}")
            self._record(TimeoutsUpdated(rank=rank.rank, timeouts=msg.state))
            # All ranks send the same synchronized values, at every calculation: log each change once.
            text = describe_timeouts(rank.hb, rank.sections)
            log.log(logging.INFO if text != self._logged_timeouts else logging.DEBUG, "timeouts: %s", text)
            self._logged_timeouts = text
            self._reply(conn, Ack())
        elif isinstance(msg, PhaseTime):
            problem = check_phase_sample(msg.name, msg.seconds)
            if problem is not None:
                raise ProtocolError(f"rank {rank.rank}: {problem}")
            rank.touch(now)
            if not self._phases.add(rank.rank, msg.name, msg.seconds):
                log.debug("rank %d marks more than %d phases: %r is not scored", rank.rank, MAX_PHASES_PER_RANK,
                          msg.name)
        elif isinstance(msg, ReportCheckpoint):
            self._record(CheckpointReported(rank=rank.rank, iteration=msg.iteration))
        elif isinstance(msg, ReportException):
            problem = check_exception_report(msg)
            if problem is not None:
                raise ProtocolError(f"rank {rank.rank}: {problem}")
            self._record(RankException(rank=rank.rank, pid=rank.pid, exception_type=msg.exception_type,
                                       frames=list(msg.frames), iteration=msg.iteration))
        elif isinstance(msg, Goodbye):
            conn.graceful, conn.training_finished = True, msg.training_finished
            log.debug("rank %d ends monitoring%s", rank.rank, " (training finished)" if msg.training_finished else "")
            # Recorded before the Ack: the rank may exit, even fail at exit, right after it, and the
            # launcher must already find the record when it sees that exit.
            self._record_disconnect(conn, rank)
            try:
                conn.sock.send(encode(Ack()))
            except OSError:
                pass  # the rank is gone already: it said goodbye, there is nothing more to tell it
            self._drop(conn, log_it=False)
        elif isinstance(msg, WorkloadControl):
            self._reply(conn, Ack(ok=False, error=f"workload control requests go to {LAUNCHER_SOCKET_ENV}"))
        else:
            raise ProtocolError(f"unexpected message {type(msg).__name__}")

    def _refuse(self, conn: _Connection, error: str) -> NoReturn:
        """Tell the peer why (its integration or checkpoint is at fault), then close only its connection."""
        self._reply(conn, Ack(ok=False, error=error))
        raise ProtocolError(error)

    def _ack_section(self, conn: _Connection) -> None:
        if conn.rank is not None and not conn.rank.cfg.skip_section_response:
            self._reply(conn, Ack())

    def _handshake(self, conn: _Connection, msg: Message, now: float) -> None:
        if not isinstance(msg, Hello):
            raise ProtocolError(f"expected Hello first, got {type(msg).__name__}")
        if not hmac.compare_digest(msg.token.encode(), self._token):
            raise ProtocolError("wrong job token")
        if msg.role is not Role.RANK:
            raise ProtocolError(f"role {msg.role!r} is not served by the rank monitor")
        try:
            cfg = (with_fallback(self.cfg, msg.fallback_config, self.explicit_keys)
                   if msg.fallback_config else self.cfg)
            if msg.num_warmup_iters is not None:  # NVRx: the rank's value wins (validated by the config)
                cfg = dataclasses.replace(cfg, num_warmup_iterations=msg.num_warmup_iters)
        except ValueError as exc:
            self._refuse(conn, f"invalid config request from rank {msg.rank}: {exc}")
        hb, sections = timeouts_of(cfg)
        if msg.timeouts:
            try:
                hb, sections = apply_calculated(hb, sections, msg.timeouts)
            except ValueError as exc:
                self._refuse(conn, f"invalid timeouts from rank {msg.rank}: {exc}")
        if msg.dump_path is not None:
            problem = _dump_path_problem(msg.dump_path, self.dump_dir)
            if problem is not None:
                self._refuse(conn, f"invalid dump_path {msg.dump_path!r} from rank {msg.rank}: {problem}")
        pid = conn.peer_pid if conn.peer_pid > 0 else -1
        conn.rank = WatchedRank(
            rank=msg.rank, local_rank=msg.local_rank, pid=pid, cfg=cfg, restart_count=msg.restart_count,
            connected_at=now, hb=hb, sections=sections, dump_path=msg.dump_path,
        )
        self._reply(conn, HelloAck(config=cfg.to_dict()))
        self._record(RankConnected(rank=msg.rank, local_rank=msg.local_rank, pid=pid,
                                   restart_count=msg.restart_count))
        log.debug("rank %d (pid %d) connected", msg.rank, pid)

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

    # -- snapshot of the live ranks (diagnosis) ---------------------------
    def _start_snapshot(self, now: float) -> None:
        """Take the evidence of every live rank and ask each that can dump for its stack."""
        snapshot = self._snapshot = Snapshot()
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
                    log.debug("no stack dump from rank %d for the snapshot: %s", rank.rank, exc)
            snapshot.add(rank.evidence(now, wall_now), rank.dump_path, dump)
        self._advance_snapshot(now)

    def _advance_snapshot(self, now: float) -> float:
        """Wait for the snapshot's dumps without blocking the loop; record it once they are in."""
        assert self._snapshot is not None
        wait = self._snapshot.poll(now, _file_size)
        if wait is not None:
            return wait
        self._record(self._snapshot.record(_read_from))
        self._snapshot = None
        return self.cfg.workload_check_interval

    # -- subprocess helper ------------------------------------------------
    @classmethod
    def run_in_subprocess(
        cls,
        cfg: FaultToleranceConfig,
        socket_path: str,
        token: Optional[str] = None,
        events_path: Optional[str] = None,
        start_timeout: float = 30.0,
        env: Optional[dict[str, str]] = None,
        stacks_dir: Optional[str] = None,
        wait: bool = True,
        launcher_reports_hangs: bool = False,
        explicit_keys: Optional[Collection[str]] = None,
    ) -> MonitorProcess:
        """Start a monitor in a new process; see :func:`ft_core.monitor.process.run_in_subprocess`."""
        return run_in_subprocess(cfg, socket_path, token, events_path, start_timeout, env, stacks_dir, wait,
                                 launcher_reports_hangs, explicit_keys)


def _io_interval(timeout: float) -> float:
    """How long before a deadline the I/O baseline is taken, and how far one extension reaches."""
    return min(IO_LOOK_FRACTION * timeout, IO_LOOK_MAX)


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


def _dump_path_problem(path: str, stacks: str) -> Optional[str]:
    """Why ``path`` cannot be a rank's dump file (None if it can): an absolute file path in the job's ``stacks``."""
    if "\0" in path:
        return "it holds a NUL byte"
    if not os.path.isabs(path):
        return f"it must be an absolute path, a file directly inside {stacks}"
    if os.path.normpath(path) != path or os.path.dirname(path) != stacks:
        return f"it must be a file directly inside the job's stacks directory {stacks}"
    return None


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
