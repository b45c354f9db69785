"""The node monitor: one process per node that watches every local rank and kills hung ones.

It serves all local ranks over one ``AF_UNIX`` socket from a single-threaded
event loop. Each connected rank has deadlines (first heartbeat, next heartbeat,
every open tracked section, time out of any section); the loop sleeps exactly
until the earliest one, so a hang is detected within milliseconds of its
deadline, not on a polling interval. On a hang it logs what and where, asks
the rank for a faulthandler stack dump, then sends ``SIGCONT`` and the
termination signal, and records every step as a JSON line the launcher reads.

Usable without the launcher::

    proc = RankMonitorServer.run_in_subprocess(cfg, "/tmp/myjob/monitor.sock")
    os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = proc.socket_path   # children inherit
    ...
    proc.stop()

This module must not import torch: one monitor per node should cost a few MB.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import secrets
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, Optional

from ft_core import procutil
from ft_core.config import FaultToleranceConfig, with_fallback
from ft_core.protocol import (
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
    SectionEnd,
    SectionStart,
    UpdateTimeouts,
    WorkloadControl,
    encode,
)
from ft_core.timeouts import HeartbeatTimeouts, SectionTimeouts, apply_calculated

__all__ = ["MonitorProcess", "RankMonitorServer", "read_events", "stack_dump_dir"]

log = logging.getLogger("ft_core.monitor")

TOKEN_ENV = "FT_MONITOR_TOKEN"
#: An unauthenticated connection must say Hello within this time.
HANDSHAKE_TIMEOUT = 5.0
#: While a stack dump is pending, the loop polls the dump file this often.
_DUMP_POLL = 0.005
_PEERCRED = struct.Struct("3i")


def stack_dump_dir(socket_path: str) -> str:
    """Where ranks write their faulthandler dumps: ``<socket dir>/stacks`` (a shared convention)."""
    return os.path.join(os.path.dirname(os.path.abspath(socket_path)), "stacks")


def read_events(path: str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Read complete JSON lines appended to ``path`` after byte ``offset``.

    Returns the events and the offset to pass next time; a partially written
    last line is left for the next call.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            log.warning("skipping a corrupt line in %s", path)
    return events, offset + end


@dataclasses.dataclass
class _OpenSection:
    started: float
    timed: bool  # False for warm-up steps and sections without a timeout


@dataclasses.dataclass
class _Rank:
    """What the monitor knows about one connected rank."""

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
    open_sections: dict[str, _OpenSection] = dataclasses.field(default_factory=dict)
    out_of_section_since: Optional[float] = None
    steps_seen: int = 0
    # Hang handling: set once a deadline passed.
    hang: Optional[dict[str, Any]] = None
    dump_deadline: float = 0.0
    dump_offset: int = 0
    dump_last_size: int = -1

    def next_deadline(self) -> Optional[tuple[float, str, Optional[str], float, float]]:
        """(deadline, reason, section, timeout, since) of the earliest expiry, or None."""
        candidates = []
        if self.first_activity is None:
            if self.hb.initial is not None:
                candidates.append((self.connected_at + self.hb.initial, "initial_heartbeat", None,
                                   self.hb.initial, self.connected_at))
        elif self.hb.subsequent is not None and self.last_activity is not None:
            candidates.append((self.last_activity + self.hb.subsequent, "heartbeat", None,
                               self.hb.subsequent, self.last_activity))
        for name, section in self.open_sections.items():
            timeout = self.sections.section.get(name)
            if section.timed and timeout is not None:
                candidates.append((section.started + timeout, "section", name, timeout, section.started))
        if not self.open_sections and self.sections.out_of_section is not None:
            since = self.out_of_section_since if self.out_of_section_since is not None else self.connected_at
            candidates.append((since + self.sections.out_of_section, "out_of_section", None,
                               self.sections.out_of_section, since))
        return min(candidates, key=lambda c: c[0]) if candidates else None


class _Connection:
    def __init__(self, sock: socket.socket, max_frame_bytes: int) -> None:
        self.sock = sock
        self.decoder = FrameDecoder(max_frame_bytes)
        self.accepted_at = time.monotonic()
        self.peer_pid = _peer_pid(sock)
        self.rank: Optional[_Rank] = None
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
        events_path: JSON-lines event log (default ``<socket dir>/monitor_events.jsonl``).
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
        self.cfg = cfg
        self.socket_path = os.path.abspath(socket_path)
        self._token = token.encode()
        job_dir = os.path.dirname(self.socket_path)
        self.events_path = events_path or os.path.join(job_dir, "monitor_events.jsonl")
        self.dump_dir = stack_dump_dir(self.socket_path)
        self._selector = selectors.DefaultSelector()
        self._connections: dict[int, _Connection] = {}
        self._listener: Optional[socket.socket] = None
        self._events_file = None
        self._running = False
        self._parent_pid = os.getppid()

    # -- setup / teardown -------------------------------------------------
    def _listen(self) -> None:
        procutil.make_private_dir(os.path.dirname(self.socket_path))
        os.makedirs(self.dump_dir, mode=0o700, exist_ok=True)
        _remove_stale_socket(self.socket_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.socket_path)
        os.chmod(self.socket_path, 0o600)
        listener.listen(256)
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._listener = listener
        self._events_file = open(self.events_path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the server

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
        if self._events_file is not None:
            self._events_file.close()
            self._events_file = None

    def stop(self) -> None:
        """Make :meth:`serve_forever` return (safe from a signal handler)."""
        self._running = False

    # -- event log --------------------------------------------------------
    def _record(self, event: str, **fields: Any) -> None:
        if self._events_file is None:
            return
        self._events_file.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
        self._events_file.flush()

    # -- main loop --------------------------------------------------------
    def serve_forever(self, ready_callback=None) -> None:
        self._listen()
        self._record("monitor_started", pid=os.getpid(), socket=self.socket_path)
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
                sleep = min(sleep, self._advance_hang(conn, now))
                continue
            expiry = rank.next_deadline()
            if expiry is None:
                continue
            deadline, reason, section, timeout, since = expiry
            if deadline <= now:
                self._on_hang(conn, now, deadline, reason, section, timeout, since)
                sleep = 0.0
            else:
                sleep = min(sleep, deadline - now)
        return max(sleep, 0.0)

    # -- connections ------------------------------------------------------
    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            conn = _Connection(sock, self.cfg.max_frame_bytes)
            self._connections[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

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
        who = f"rank {conn.rank.rank}" if conn.rank else f"pid {conn.peer_pid}"
        log.warning("closing connection from %s: %s", who, reason)
        self._record("connection_rejected", pid=conn.peer_pid, reason=reason)
        self._drop(conn, log_it=False)

    def _drop(self, conn: _Connection, log_it: bool = True) -> None:
        fileno = conn.sock.fileno()
        if fileno >= 0:
            self._selector.unregister(conn.sock)
            self._connections.pop(fileno, None)
            conn.sock.close()
        rank = conn.rank
        if rank is not None and log_it:
            if rank.hang is None and not conn.graceful:
                log.warning("rank %d (pid %d) disconnected without shutdown", rank.rank, rank.pid)
            self._record("rank_disconnected", rank=rank.rank, pid=rank.pid, graceful=conn.graceful)
        conn.rank = None

    # -- messages ---------------------------------------------------------
    def _handle(self, conn: _Connection, msg: Message, now: float) -> None:
        rank = conn.rank
        if rank is None:
            self._handshake(conn, msg, now)
            return
        if isinstance(msg, Heartbeat):
            self._touch(rank, now, msg.iteration)
        elif isinstance(msg, SectionStart):
            self._section_start(rank, msg, now)
            self._ack_section(conn)
        elif isinstance(msg, SectionEnd):
            self._touch(rank, now)
            if rank.open_sections.pop(msg.name, None) is None:
                log.debug("rank %d closed section %r that was not open", rank.rank, msg.name)
            if not rank.open_sections:
                rank.out_of_section_since = now
            self._ack_section(conn)
        elif isinstance(msg, EndAllSections):
            self._touch(rank, now)
            rank.open_sections.clear()
            rank.out_of_section_since = now
            self._ack_section(conn)
        elif isinstance(msg, UpdateTimeouts):
            try:
                rank.hb, rank.sections = apply_calculated(rank.hb, rank.sections, msg.state)
            except ValueError as exc:
                self._reply(conn, Ack(ok=False, error=str(exc)))
                return
            self._record("timeouts_updated", rank=rank.rank, timeouts=msg.state)
            # All ranks send the same synchronized values: log them once, for rank 0.
            log.log(logging.INFO if rank.rank == 0 else logging.DEBUG,
                    "timeouts updated: heartbeat %s, sections %s", rank.hb.to_dict(), rank.sections.to_dict())
            self._reply(conn, Ack())
        elif isinstance(msg, ReportCheckpoint):
            self._record("checkpoint_reported", rank=rank.rank, iteration=msg.iteration)
        elif isinstance(msg, Goodbye):
            conn.graceful = True
            log.debug("rank %d ends monitoring", rank.rank)
            self._reply(conn, Ack())
            self._drop(conn)
        elif isinstance(msg, WorkloadControl):
            self._reply(conn, Ack(ok=False, error="workload control requests go to FT_LAUNCHER_IPC_SOCKET"))
        else:
            raise ProtocolError(f"unexpected message {type(msg).__name__}")

    def _touch(self, rank: _Rank, now: float, iteration: Optional[int] = None) -> None:
        """Record a sign of life: heartbeats and every section event count alike."""
        rank.last_activity = now
        if rank.first_activity is None:
            rank.first_activity = now
        if iteration is not None:
            rank.iteration = iteration

    def _section_start(self, rank: _Rank, msg: SectionStart, now: float) -> None:
        self._touch(rank, now, msg.iteration)
        timed = True
        if msg.name == "step":
            rank.steps_seen += 1
            timed = rank.steps_seen > rank.cfg.num_warmup_iterations
        rank.open_sections[msg.name] = _OpenSection(now, timed)
        rank.out_of_section_since = None

    def _ack_section(self, conn: _Connection) -> None:
        if conn.rank is not None and not conn.rank.cfg.skip_section_response:
            self._reply(conn, Ack())

    def _handshake(self, conn: _Connection, msg: Message, now: float) -> None:
        if not isinstance(msg, Hello):
            raise ProtocolError(f"expected Hello first, got {type(msg).__name__}")
        if not hmac.compare_digest(msg.token.encode(), self._token):
            raise ProtocolError("wrong job token")
        if msg.role != "rank":
            raise ProtocolError(f"role {msg.role!r} is not served by the rank monitor")
        try:
            cfg = with_fallback(self.cfg, msg.fallback_config) if msg.fallback_config else self.cfg
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
        conn.rank = _Rank(
            rank=msg.rank, local_rank=msg.local_rank, pid=pid, cfg=cfg, restart_count=msg.restart_count,
            connected_at=now, hb=hb, sections=sections, dump_path=msg.dump_path, out_of_section_since=now,
        )
        self._reply(conn, HelloAck(config=cfg.to_dict()))
        self._record("rank_connected", rank=msg.rank, local_rank=msg.local_rank, pid=pid,
                     restart_count=msg.restart_count)
        log.debug("rank %d (pid %d) connected", msg.rank, pid)

    # -- hang handling ----------------------------------------------------
    def _on_hang(self, conn: _Connection, now: float, deadline: float, reason: str,
                 section: Optional[str], timeout: float, since: float) -> None:
        rank = conn.rank
        assert rank is not None
        wall_now = time.time()
        rank.hang = {
            "rank": rank.rank, "pid": rank.pid, "reason": reason, "section": section,
            "elapsed": round(now - since, 3), "timeout": timeout, "iteration": rank.iteration,
            "open_sections": sorted(rank.open_sections), "deadline_time": wall_now - (now - deadline),
            "detected_time": wall_now, "stack_dump_file": None, "stack": None,
        }
        where = f" in section {section!r}" if section else ""
        log.error("rank %d (pid %d) hung: %s timeout%s, %.1f s elapsed > %.1f s allowed, iteration %s",
                  rank.rank, rank.pid, reason, where, now - since, timeout, rank.iteration)
        rank.dump_deadline = now
        sig = self.cfg.stack_dump_signal
        if sig is not None and rank.dump_path and rank.pid > 0:
            try:
                rank.dump_offset = os.path.getsize(rank.dump_path)
                # A stopped process runs no signal handler: continue it first.
                os.kill(rank.pid, signal.SIGCONT)
                os.kill(rank.pid, sig)
                rank.dump_deadline = now + self.cfg.stack_dump_timeout
            except OSError as exc:
                log.warning("could not request a stack dump from rank %d: %s", rank.rank, exc)
        self._advance_hang(conn, now)

    def _advance_hang(self, conn: _Connection, now: float) -> float:
        """Wait for the stack dump (without blocking other ranks), then terminate."""
        rank = conn.rank
        assert rank is not None and rank.hang is not None
        if rank.hang.get("terminated"):
            return self.cfg.workload_check_interval
        if now < rank.dump_deadline and rank.dump_path:
            size = _file_size(rank.dump_path)
            settled = size > rank.dump_offset and size == rank.dump_last_size
            rank.dump_last_size = size
            if not settled:
                return min(_DUMP_POLL, rank.dump_deadline - now)
        self._terminate(rank)
        return self.cfg.workload_check_interval

    def _terminate(self, rank: _Rank) -> None:
        hang = rank.hang
        assert hang is not None
        if rank.dump_path and _file_size(rank.dump_path) > rank.dump_offset:
            with open(rank.dump_path, errors="replace") as handle:
                handle.seek(rank.dump_offset)
                hang["stack"] = handle.read()
            hang["stack_dump_file"] = rank.dump_path
            log.error("stack of hung rank %d (from %s):\n%s", rank.rank, rank.dump_path, hang["stack"].rstrip())
        self._record("hang_detected", **hang)
        sig = self.cfg.rank_termination_signal
        if rank.pid > 0:
            try:
                os.kill(rank.pid, signal.SIGCONT)
                os.kill(rank.pid, sig)
                log.error("sent %s to rank %d (pid %d)", sig.name, rank.rank, rank.pid)
            except ProcessLookupError:
                log.warning("rank %d (pid %d) already exited", rank.rank, rank.pid)
        self._record("rank_terminated", rank=rank.rank, pid=rank.pid, signal=sig.name)
        hang["terminated"] = True

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
        wait: bool = True,
    ) -> MonitorProcess:
        """Start a monitor in a new process (``python -m ft_core.monitor``) and wait until it serves.

        With ``wait=False`` it returns at once; call ``wait_ready()`` on the handle before using the socket.

        With ``token=None`` the current ``FT_MONITOR_TOKEN`` is used, or a new
        one is generated and exported to ``os.environ`` so that ranks started
        later from this process inherit it. The token is also written to
        ``<socket_path>.token`` (mode 0600) for ranks started elsewhere by the
        same user.
        """
        token = token or os.environ.get(TOKEN_ENV) or secrets.token_hex(16)
        os.environ[TOKEN_ENV] = token
        socket_path = os.path.abspath(socket_path)
        procutil.make_private_dir(os.path.dirname(socket_path))
        procutil.write_private_file(socket_path + ".token", token)
        child_env = dict(os.environ if env is None else env)
        child_env[TOKEN_ENV] = token  # via the environment: argv is visible to every user
        args = [sys.executable, "-m", "ft_core.monitor", "--socket", socket_path,
                "--config-json", json.dumps(cfg.to_dict())]
        if events_path:
            args += ["--events", events_path]
        proc = subprocess.Popen(args, env=child_env, stdout=subprocess.PIPE,
                                preexec_fn=procutil.die_with_parent)
        handle = MonitorProcess(proc, socket_path, token, events_path or os.path.join(
            os.path.dirname(socket_path), "monitor_events.jsonl"))
        if wait:
            handle.wait_ready(start_timeout)
        return handle


class MonitorProcess:
    """Handle on a monitor started by :meth:`RankMonitorServer.run_in_subprocess`."""

    def __init__(self, proc: subprocess.Popen, socket_path: str, token: str, events_path: str) -> None:
        self.proc = proc
        self.socket_path = socket_path
        self.token = token
        self.events_path = events_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        self.proc.stdout.close()
        if line.strip() != b"ready":
            self.kill()
            raise RuntimeError(
                f"rank monitor did not start within {timeout:.0f} s (exit code {self.proc.poll()}); "
                "see its log above"
            )

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> Optional[int]:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.events_path)[0]


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


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ft_core.monitor", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="path of the Unix socket to serve")
    parser.add_argument("--config-json", default="{}", help="FaultToleranceConfig as JSON")
    parser.add_argument("--events", default=None, help="JSON-lines event log path")
    args = parser.parse_args(argv)
    cfg = FaultToleranceConfig.from_mapping(json.loads(args.config_json))
    logging.basicConfig(level=cfg.log_level, stream=sys.stderr,
                        format="[ft-monitor %(asctime)s] %(levelname)s: %(message)s")
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        parser.error(f"{TOKEN_ENV} must be set in the environment")
    # Every rank message wakes the monitor; as a normal task it would preempt the sending rank
    # on a busy core and bill the rank for its processing. SCHED_BATCH never preempts on wake-up
    # and still gets its fair share of CPU, so deadlines are met within milliseconds.
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    server = RankMonitorServer(cfg, args.socket, token, args.events)

    def _stop(_signum, _frame):
        server.stop()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    def _ready() -> None:
        # The parent waits for this line on our stdout; afterwards stdout is unused.
        os.write(1, b"ready\n")
        os.close(1)
        os.dup2(2, 1)

    try:
        server.serve_forever(ready_callback=_ready)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
