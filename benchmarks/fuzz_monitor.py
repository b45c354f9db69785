"""Fuzz a live node monitor with random and adversarial frames while real ranks heartbeat next to it.

For ``--duration`` seconds one process opens connection after connection to
the monitor's socket and sends, chosen at random: random bytes, frames with
random or huge lengths, zero-length frames, truncated frames, msgpack nested
tens of thousands of levels deep, Hellos with a wrong token, valid frames for
another rank sent before (or instead of) a Hello, wrongly typed messages, and
connections that never finish their handshake. Meanwhile ``--ranks`` real
rank processes (torch-free ``RankMonitorClient`` loops) heartbeat every 20 ms.

Connections are paced by the monitor: ``CONCURRENCY`` attacking connections
are in flight at once, and one is opened as the monitor closes another.
Afterwards it checks that the monitor closed every connection that sent
garbage (by its handshake timeout at the latest), that it still serves a new
rank, that no rank was signalled (no hang or kill record, no stack dump
written, every rank alive) and how much the monitor's resident memory grew
(``VmRSS`` from ``/proc``).
Prints JSON; ``tests/security/test_fuzz.py`` runs the same function.

    python benchmarks/fuzz_monitor.py [--duration 10] [--ranks 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

import msgspec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, rss_mb  # noqa: E402

from ft_core.config import FaultToleranceConfig  # noqa: E402
from ft_core.event_file import read_events  # noqa: E402
from ft_core.monitor import RankMonitorServer  # noqa: E402
from ft_core.monitor.defences import HANDSHAKE_TIMEOUT  # noqa: E402
from ft_core.protocol import (  # noqa: E402
    DEFAULT_MAX_FRAME_BYTES,
    Heartbeat,
    Hello,
    ReportCheckpoint,
    SectionEnd,
    SectionStart,
    encode,
)
from ft_core.utils.deadline import wait_until  # noqa: E402

RANK_CODE = """
import os, time
from ft_core.client import RankMonitorClient
client = RankMonitorClient()
client.init_workload_monitoring()
open(os.environ["FUZZ_READY"], "w").close()
i = 0
while True:
    client.set_iteration(i)
    client.send_heartbeat()
    i += 1
    time.sleep(0.02)
"""

TOKEN = "fuzz-token-" + "0" * 20
#: Attacking connections in flight at once.
CONCURRENCY = 16
#: Cases the monitor answers only at its handshake timeout, and how many of them are kept open at once.
LINGERING_CASES = frozenset({"idle", "truncated"})
MAX_LINGERING = 100
_HEADER = struct.Struct(">I")


def _frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload)) + payload


def _nested(depth: int) -> bytes:
    head = msgspec.msgpack.encode({"type": "hello", "token": TOKEN, "rank": 0})
    return _frame(bytes([0x84]) + head[1:] + msgspec.msgpack.encode("timeouts") + b"\x81\xa1a"
                  + b"\x91" * depth + b"\xc0")


class Fuzzer:
    """Builds one adversarial payload per call; ``case`` names what was sent."""

    def __init__(self, rng: random.Random, rank_numbers: list[int]) -> None:
        self.rng = rng
        self.rank_numbers = rank_numbers
        self.cases = [name for name in dir(self) if name.startswith("case_")]

    def next(self) -> tuple[str, list[bytes]]:
        """A case name and the frames (byte strings) it sends, in order."""
        name = self.rng.choice(self.cases)
        return name[len("case_"):], getattr(self, name)()

    def _rand(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    def case_random_bytes(self) -> list[bytes]:
        return [self._rand(self.rng.randint(1, 4096))]

    def case_random_length(self) -> list[bytes]:
        length = self.rng.choice([self.rng.randint(1, 300), self.rng.randint(0, 2**32 - 1)])
        return [_HEADER.pack(length) + self._rand(self.rng.randint(0, 2000))]

    def case_huge_length(self) -> list[bytes]:
        return [_HEADER.pack(self.rng.choice([2**32 - 1, DEFAULT_MAX_FRAME_BYTES + 1, 2**31]))]

    def case_zero_length(self) -> list[bytes]:
        return [_HEADER.pack(0)]

    def case_deep_nesting(self) -> list[bytes]:
        return [_nested(self.rng.choice([40, 1_000, 10_000, 100_000]))]

    def case_truncated(self) -> list[bytes]:
        frame = encode(Hello(token=TOKEN, rank=self.rng.choice(self.rank_numbers)))
        return [frame[:self.rng.randint(1, len(frame) - 1)]]

    def case_wrong_token(self) -> list[bytes]:
        return [encode(Hello(token=self._rand(8).hex(), rank=self.rng.choice(self.rank_numbers)))]

    def case_other_ranks_frames(self) -> list[bytes]:
        # What a rank would send, without a Hello first: heartbeats, sections, checkpoints "for" rank N.
        rank = self.rng.choice(self.rank_numbers)
        return [encode(Heartbeat(iteration=rank)), encode(SectionStart(name="step", iteration=1)),
                encode(SectionEnd(name="step")), encode(ReportCheckpoint(iteration=10**6))]

    def case_wrong_types(self) -> list[bytes]:
        bad = {"type": "hello", "token": self.rng.choice([1, None, [TOKEN]]), "rank": "zero"}
        return [_frame(msgspec.msgpack.encode(bad)),
                _frame(msgspec.msgpack.encode({"type": self._rand(4).hex()}))]

    def case_flipped_bits(self) -> list[bytes]:
        # Not the job token: a flip that still decodes must not make the monitor watch this process.
        frame = bytearray(encode(Hello(token="x" * len(TOKEN), rank=0, fallback_config={"rank_heartbeat_timeout": 5})))
        for _ in range(self.rng.randint(1, 4)):
            frame[self.rng.randrange(_HEADER.size, len(frame))] ^= 1 << self.rng.randrange(8)
        return [bytes(frame)]

    def case_idle(self) -> list[bytes]:
        return []  # connect and say nothing: a handshake that never completes


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(path)
    except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    return sock


def _send(sock: socket.socket, data: bytes) -> bool:
    """Send what fits; False if the monitor already closed the connection."""
    try:
        sock.send(data)
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        return False
    return True


def run(duration: float = 10.0, n_ranks: int = 4, seed: int = 0) -> dict[str, Any]:
    """Fuzz a fresh monitor for ``duration`` seconds; returns the counts and checks (see the module doc)."""
    rng = random.Random(seed)
    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=120, rank_heartbeat_timeout=10,
                               log_level="ERROR")
    with tempfile.TemporaryDirectory(prefix="ft-fuzz-") as tmp:
        monitor = RankMonitorServer.run_in_subprocess(cfg, os.path.join(tmp, "job", "monitor.sock"), token=TOKEN)
        ranks: list[subprocess.Popen] = []
        try:
            for rank in range(n_ranks):
                ready = os.path.join(tmp, f"ready{rank}")
                env = dict(os.environ, FT_RANK_MONITOR_IPC_SOCKET=monitor.socket_path, FT_MONITOR_TOKEN=TOKEN,
                           RANK=str(rank), LOCAL_RANK=str(rank), FUZZ_READY=ready)
                ranks.append(subprocess.Popen([sys.executable, "-c", RANK_CODE], env=env))
                if not wait_until(lambda r=ready: os.path.exists(r), 60):
                    raise RuntimeError(f"rank {rank} did not connect")
            rss_before = rss_mb(monitor.pid)
            counts = _fuzz(monitor.socket_path, Fuzzer(rng, list(range(n_ranks))), duration)
            alive = monitor.is_alive()
            rss_after = rss_mb(monitor.pid) if alive else None
            # One more real rank must still be served after the storm.
            served_after = _hello_served(monitor.socket_path, rank=n_ranks) if alive else False
            events = read_events(monitor.events_path)[0]
            stacks = os.path.join(tmp, "job", "stacks")
            dumps = sum(1 for name in os.listdir(stacks) if os.path.getsize(os.path.join(stacks, name)) > 0)
            ranks_exited = sum(1 for proc in ranks if proc.poll() is not None)
        finally:
            for proc in ranks:
                proc.kill()
                proc.wait()
            monitor.stop()
    kill_records = [e for e in events if e["event"] in ("hang_detected", "rank_terminated")]
    return {
        "benchmark": "fuzz_monitor",
        "duration_s": duration,
        "seed": seed,
        "ranks": n_ranks,
        **counts,
        "rejections_recorded": sum(1 for e in events if e["event"] == "connection_rejected"),
        "monitor_alive": alive,
        "new_rank_served_after": served_after,
        # Kill records, stack dumps the monitor asked for, and ranks that died: all must be 0.
        "ranks_signalled": len({e["rank"] for e in kill_records}) + dumps + ranks_exited,
        "monitor_rss_mb": {"before": rss_before, "after": rss_after,
                           "growth": None if rss_after is None else round(rss_after - rss_before, 1)},
    }


def _fuzz(path: str, fuzzer: Fuzzer, duration: float) -> dict[str, Any]:
    """Keep ``CONCURRENCY`` attacking connections in flight, open a new one as the monitor closes one.

    Paced by the monitor: a connection counts as dropped when the monitor
    closes it. Connections that wait for their handshake timeout (idle,
    truncated) are kept aside, at most ``MAX_LINGERING`` (then we close the
    oldest ourselves).
    """
    selector = selectors.DefaultSelector()
    in_flight: dict[socket.socket, float] = {}  # expected to be closed by the monitor soon
    lingering: collections.deque[socket.socket] = collections.deque()  # closed after HANDSHAKE_TIMEOUT
    frames_sent = connections = dropped = refused = closed_by_us = 0
    cases: collections.Counter[str] = collections.Counter()

    def forget(sock: socket.socket) -> None:
        selector.unregister(sock)
        if in_flight.pop(sock, None) is None:
            lingering.remove(sock)
        sock.close()

    def poll(timeout: float) -> int:
        closed = 0
        for key, _ in selector.select(timeout):
            conn: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                if conn.recv(65536):
                    continue  # a reply (a rejection's Ack): the close follows
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                pass
            closed += 1
            forget(conn)
        return closed

    end = time.monotonic() + duration
    while time.monotonic() < end:
        while len(in_flight) < CONCURRENCY:
            sock = _connect(path)
            if sock is None:
                refused += 1
                break
            connections += 1
            name, frames = fuzzer.next()
            cases[name] += 1
            for frame in frames:
                if not _send(sock, frame):
                    break
                frames_sent += 1
            selector.register(sock, selectors.EVENT_READ)
            if name in LINGERING_CASES:
                lingering.append(sock)
                if len(lingering) > MAX_LINGERING:
                    forget(lingering[0])
                    closed_by_us += 1
            else:
                in_flight[sock] = time.monotonic()
        dropped += poll(0.05)
    # Every connection in flight sent garbage (a partial frame at worst): the monitor must close each,
    # by the handshake timeout at the latest. What is left after it is counted as kept open.
    settle = time.monotonic() + HANDSHAKE_TIMEOUT + 1.0
    while in_flight and time.monotonic() < settle:
        dropped += poll(0.1)
    kept = len(in_flight)
    closed_by_us += len(lingering)
    for sock in list(in_flight) + list(lingering):
        forget(sock)
    # connections_opened = connections_dropped (by the monitor) + closed_by_fuzzer (idle or truncated ones
    # it did not wait for) + garbage_connections_left_open (must be 0)
    return {"frames_sent": frames_sent, "connections_opened": connections, "connections_dropped": dropped,
            "connections_closed_by_fuzzer": closed_by_us, "garbage_connections_left_open": kept,
            "connections_refused": refused, "cases": dict(sorted(cases.items()))}


def _hello_served(path: str, rank: int) -> bool:
    from ft_core.protocol import FrameDecoder, Goodbye, HelloAck, recv_msg, send_msg

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        send_msg(sock, Hello(token=TOKEN, rank=rank))
        reply = recv_msg(sock, FrameDecoder(), 10)
        send_msg(sock, Goodbye())  # or the monitor would watch this (short-lived) process
        return isinstance(reply, HelloAck)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    emit(run(args.duration, args.ranks, args.seed))


if __name__ == "__main__":
    main()
