"""The node monitor's server: one event loop that watches every local rank and kills hung ones.

It serves all local ranks over one ``AF_UNIX`` socket from a single-threaded
event loop. Each connected rank has deadlines (first heartbeat, next heartbeat,
every open tracked section, time out of any section); the loop sleeps exactly
until the earliest one, so a hang is detected within milliseconds of its
deadline, not on a polling interval. On a hang (see :mod:`.hang`) it logs what
and where, asks the rank for a faulthandler stack dump, then sends ``SIGCONT``
and the termination signal, and records every step as a JSON line the
launcher reads.

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
import os
import selectors
import signal
import socket
import struct
import time
from collections.abc import Callable
from typing import Optional

from ft_core.config import FaultToleranceConfig, with_fallback
from ft_core.events import (
    CheckpointReported,
    ConnectionRejected,
    Event,
    EventWriter,
    HangReason,
    MonitorStarted,
    RankConnected,
    RankDisconnected,
    RankTerminated,
    TimeoutsUpdated,
)
from ft_core.jobdir import LAUNCHER_SOCKET_ENV, PRIVATE_FILE_MODE, JobDir
from ft_core.monitor.hang import Expiry, Hang
from ft_core.monitor.process import MonitorProcess, run_in_subprocess
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
    ProtocolError,
    ReportCheckpoint,
    Role,
    SectionEnd,
    SectionStart,
    UpdateTimeouts,
    WorkloadControl,
    check_max_frame_bytes,
    encode,
)
from ft_core.ratelimit import LogThrottle
from ft_core.timeouts import HeartbeatTimeouts, SectionTimeouts, apply_calculated

__all__ = ["HANDSHAKE_TIMEOUT", "MAX_PENDING_HANDSHAKES", "OpenSection", "RankMonitorServer", "WatchedRank"]

log = logging.getLogger("ft_core.monitor")

#: An unauthenticated connection must say Hello within this time.
HANDSHAKE_TIMEOUT = 5.0
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
    timed: bool  # False for warm-up steps and sections without a timeout


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
    out_of_section_since: Optional[float] = None
    steps_seen: int = 0
    #: Set once a deadline passed; the rank is never watched again.
    hang: Optional[Hang] = None

    def touch(self, now: float, iteration: Optional[int] = None) -> None:
        """Record a sign of life: heartbeats and every section event count alike."""
        self.last_activity = now
        if self.first_activity is None:
            self.first_activity = now
        if iteration is not None:
            self.iteration = iteration

    def section_start(self, name: str, now: float, iteration: Optional[int] = None) -> None:
        """Open ``name``; the first ``num_warmup_iterations`` ``step`` sections are not timed."""
        self.touch(now, iteration)
        timed = True
        if name == "step":
            self.steps_seen += 1
            timed = self.steps_seen > self.cfg.num_warmup_iterations
        self.open_sections[name] = OpenSection(now, timed)
        self.out_of_section_since = None

    def section_end(self, name: str, now: float) -> bool:
        """Close ``name``; False if it was not open. Out-of-section time starts when none is left open."""
        self.touch(now)
        was_open = self.open_sections.pop(name, None) is not None
        if not self.open_sections:
            self.out_of_section_since = now
        return was_open

    def end_all_sections(self, now: float) -> None:
        self.touch(now)
        self.open_sections.clear()
        self.out_of_section_since = now

    def next_deadline(self) -> Optional[Expiry]:
        """The earliest deadline of this rank, or None when nothing is timed."""
        candidates = []
        if self.first_activity is None:
            if self.hb.initial is not None:
                candidates.append(Expiry(self.connected_at + self.hb.initial, HangReason.INITIAL_HEARTBEAT, None,
                                         self.hb.initial, self.connected_at))
        elif self.hb.subsequent is not None and self.last_activity is not None:
            candidates.append(Expiry(self.last_activity + self.hb.subsequent, HangReason.HEARTBEAT, None,
                                     self.hb.subsequent, self.last_activity))
        for name, section in self.open_sections.items():
            timeout = self.sections.section.get(name)
            if section.timed and timeout is not None:
                candidates.append(Expiry(section.started + timeout, HangReason.SECTION, name, timeout,
                                         section.started))
        if not self.open_sections and self.sections.out_of_section is not None:
            since = self.out_of_section_since if self.out_of_section_since is not None else self.connected_at
            candidates.append(Expiry(since + self.sections.out_of_section, HangReason.OUT_OF_SECTION, None,
                                     self.sections.out_of_section, since))
        return min(candidates, key=lambda c: c.deadline) if candidates else None


class _Connection:
    def __init__(self, sock: socket.socket, max_frame_bytes: int) -> None:
        self.sock = sock
        self.decoder = FrameDecoder(max_frame_bytes, first_frame_bytes=min(MAX_HELLO_FRAME_BYTES, max_frame_bytes))
        self.accepted_at = time.monotonic()
        self.peer_pid = _peer_pid(sock)
        self.rank: Optional[WatchedRank] = None
        self.graceful = False


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
    """

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        socket_path: str,
        token: str,
        events_path: Optional[str] = None,
    ) -> None:
        if not token:
            raise ValueError("token: a non-empty job token is required")
        check_max_frame_bytes(cfg.max_frame_bytes)  # fail at start, not at the first connection
        self.cfg = cfg
        self.socket_path = os.path.abspath(socket_path)
        self._token = token.encode()
        self.job_dir = JobDir.of_socket(self.socket_path)
        self.events_path = events_path or self.job_dir.monitor_events
        self.dump_dir = self.job_dir.stacks
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
        self._listener = listener
        self._events = EventWriter(self.events_path)
        self._reserve_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
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

    def stop(self) -> None:
        """Make :meth:`serve_forever` return (safe from a signal handler)."""
        self._running = False

    # -- event log --------------------------------------------------------
    def _record(self, record: Event) -> None:
        if self._events is not None:
            self._events.write(record)

    # -- main loop --------------------------------------------------------
    def serve_forever(self, ready_callback: Optional[Callable[[], None]] = None) -> None:
        self._listen()
        self._record(MonitorStarted(pid=os.getpid(), socket=self.socket_path))
        log.info("rank monitor serving on %s (pid %d)", self.socket_path, os.getpid())
        if ready_callback is not None:
            ready_callback()
        self._running = True
        try:
            while self._running:
                timeout = self._check_deadlines(time.monotonic())
                for key, _mask in self._selector.select(timeout):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
                if os.getppid() != self._parent_pid:
                    log.warning("parent process exited; monitor stops")
                    break
        finally:
            self.close()

    def _check_deadlines(self, now: float) -> float:
        """Act on every expired deadline; return how long the loop may sleep."""
        sleep = self.cfg.workload_check_interval
        for conn in list(self._connections.values()):
            if conn.rank is None:
                if now - conn.accepted_at > HANDSHAKE_TIMEOUT:
                    self._reject(conn, "no handshake within %.0f s" % HANDSHAKE_TIMEOUT)
                else:
                    sleep = min(sleep, conn.accepted_at + HANDSHAKE_TIMEOUT - now)
                continue
            rank = conn.rank
            if rank.hang is not None:
                sleep = min(sleep, self._advance_hang(rank, now))
                continue
            expiry = rank.next_deadline()
            if expiry is None:
                continue
            if expiry.deadline <= now:
                self._on_hang(rank, expiry, now)
                sleep = 0.0
            else:
                sleep = min(sleep, expiry.deadline - now)
        return max(sleep, 0.0)

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
            conn = _Connection(sock, self.cfg.max_frame_bytes)
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

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        try:
            messages = conn.decoder.feed(data)
        except ProtocolError as exc:
            self._reject(conn, str(exc))
            return
        now = time.monotonic()
        for msg in messages:
            if conn.sock.fileno() < 0:
                return
            try:
                self._handle(conn, msg, now)
            except ProtocolError as exc:
                self._reject(conn, str(exc))
                return

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
            self._record(RankDisconnected(rank=rank.rank, pid=rank.pid, graceful=conn.graceful))
        conn.rank = None

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
            self._ack_section(conn)
        elif isinstance(msg, EndAllSections):
            rank.end_all_sections(now)
            self._ack_section(conn)
        elif isinstance(msg, UpdateTimeouts):
            try:
                rank.hb, rank.sections = apply_calculated(rank.hb, rank.sections, msg.state)
            except ValueError as exc:
                self._reply(conn, Ack(ok=False, error=str(exc)))
                return
            self._record(TimeoutsUpdated(rank=rank.rank, timeouts=msg.state))
            # All ranks send the same synchronized values: log them once, for rank 0.
            log.log(logging.INFO if rank.rank == 0 else logging.DEBUG,
                    "timeouts updated: heartbeat %s, sections %s", rank.hb.to_dict(), rank.sections.to_dict())
            self._reply(conn, Ack())
        elif isinstance(msg, ReportCheckpoint):
            self._record(CheckpointReported(rank=rank.rank, iteration=msg.iteration))
        elif isinstance(msg, Goodbye):
            conn.graceful = True
            log.debug("rank %d ends monitoring", rank.rank)
            self._reply(conn, Ack())
            self._drop(conn)
        elif isinstance(msg, WorkloadControl):
            self._reply(conn, Ack(ok=False, error=f"workload control requests go to {LAUNCHER_SOCKET_ENV}"))
        else:
            raise ProtocolError(f"unexpected message {type(msg).__name__}")

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
            cfg = (with_fallback(self.cfg, msg.fallback_config, self.cfg.explicit_keys)
                   if msg.fallback_config else self.cfg)
        except ValueError as exc:
            # Tell the rank why before closing: its integration was configured wrongly.
            self._reply(conn, Ack(ok=False, error=str(exc)))
            raise ProtocolError(f"invalid fallback config from rank {msg.rank}: {exc}") from None
        hb = HeartbeatTimeouts(cfg.initial_rank_heartbeat_timeout, cfg.rank_heartbeat_timeout)
        sections = SectionTimeouts(dict(cfg.rank_section_timeouts), cfg.rank_out_of_section_timeout)
        if msg.timeouts:
            try:
                hb, sections = apply_calculated(hb, sections, msg.timeouts)
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
        pid = conn.peer_pid if conn.peer_pid > 0 else -1
        conn.rank = WatchedRank(
            rank=msg.rank, local_rank=msg.local_rank, pid=pid, cfg=cfg, restart_count=msg.restart_count,
            connected_at=now, hb=hb, sections=sections, dump_path=msg.dump_path, out_of_section_since=now,
        )
        self._reply(conn, HelloAck(config=cfg.to_dict()))
        self._record(RankConnected(rank=msg.rank, local_rank=msg.local_rank, pid=pid,
                                   restart_count=msg.restart_count))
        log.debug("rank %d (pid %d) connected", msg.rank, pid)

    # -- hang handling ----------------------------------------------------
    def _on_hang(self, rank: WatchedRank, expiry: Expiry, now: float) -> None:
        hang = rank.hang = Hang.detect(expiry, rank=rank.rank, pid=rank.pid, iteration=rank.iteration,
                                       open_sections=list(rank.open_sections), now=now, wall_now=time.time())
        log.error("%s", hang.report.describe())
        sig = self.cfg.stack_dump_signal
        if sig is not None and rank.dump_path and rank.pid > 0:
            try:
                offset = os.path.getsize(rank.dump_path)
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
        stack = None
        if rank.dump_path and _file_size(rank.dump_path) > hang.dump_offset:
            try:
                with open(rank.dump_path, errors="replace") as handle:
                    handle.seek(hang.dump_offset)
                    stack = handle.read()
                log.error("stack of hung rank %d (from %s):\n%s", rank.rank, rank.dump_path, stack.rstrip())
            except OSError as exc:  # e.g. out of descriptors: the kill matters more than the stack
                log.error("could not read the stack of hung rank %d from %s: %s", rank.rank, rank.dump_path, exc)
        self._record(hang.terminate(stack, rank.dump_path if stack is not None else None))
        sig = self.cfg.rank_termination_signal
        if rank.pid > 0:
            try:
                os.kill(rank.pid, signal.SIGCONT)
                os.kill(rank.pid, sig)
                log.error("sent %s to rank %d (pid %d)", sig.name, rank.rank, rank.pid)
            except ProcessLookupError:
                log.warning("rank %d (pid %d) already exited", rank.rank, rank.pid)
        self._record(RankTerminated(rank=rank.rank, pid=rank.pid, signal=sig.name))

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
    ) -> MonitorProcess:
        """Start a monitor in a new process; see :func:`ft_core.monitor.process.run_in_subprocess`."""
        return run_in_subprocess(cfg, socket_path, token, events_path, start_timeout, env)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
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
