"""Hostile bytes on the monitor's socket: only the sender's connection is closed, other ranks never notice."""

from __future__ import annotations

import os
import struct

import msgspec
import pytest
from security_helpers import TOKEN, VICTIM_TEXT, assert_untouched, closed_by_peer, connect, wait_rejection

from ft_core import protocol
from ft_core.monitor import defences, server
from ft_core.protocol import FrameDecoder, Heartbeat, Hello, ProtocolError, encode

pytestmark = pytest.mark.timeout(90)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def _deep_hello(depth: int) -> bytes:
    """A Hello whose ``timeouts`` value is an array nested ``depth`` levels deep."""
    head = msgspec.msgpack.encode({"type": "hello", "token": "x", "rank": 0})
    # a fixmap of 3 entries becomes 4: add "timeouts": {"a": [[[...nil...]]]}
    assert head[0] == 0x83
    body = (bytes([0x84]) + head[1:] + msgspec.msgpack.encode("timeouts") + b"\x81" + msgspec.msgpack.encode("a")
            + b"\x91" * depth + b"\xc0")
    return _frame(body)


# -- the decoder alone ------------------------------------------------------------
@pytest.mark.parametrize("depth", [protocol.MAX_NESTING + 1, 5_000, 200_000])
def test_the_decoder_bounds_nesting(depth):
    with pytest.raises(ProtocolError, match="nested"):
        FrameDecoder().feed(_deep_hello(depth))


def test_the_decoder_accepts_real_messages_up_to_the_nesting_bound():
    assert isinstance(FrameDecoder().feed(_deep_hello(protocol.MAX_NESTING - 3))[0], Hello)
    fallback = {"rank_section_timeouts": {"step": 3.0, "setup": None}, "safety_factor": 5.0}
    hello = Hello(token=TOKEN, rank=3, fallback_config=fallback, timeouts={"current_timeouts": {"a": {"b": 1}}})
    assert FrameDecoder().feed(encode(hello) + encode(Heartbeat(iteration=2))) == [hello, Heartbeat(iteration=2)]


def test_the_decoder_names_an_empty_frame():
    with pytest.raises(ProtocolError, match="empty frame"):
        FrameDecoder().feed(b"\x00\x00\x00\x00")


@pytest.mark.parametrize("limit", [0, -1, protocol.MAX_FRAME_BYTES_LIMIT + 1, 1 << 40])
def test_the_decoder_refuses_a_limit_the_header_cannot_express(limit):
    with pytest.raises(ValueError, match="max_frame_bytes"):
        FrameDecoder(limit)


def test_the_monitor_and_the_control_server_refuse_such_a_limit_at_start(tmp_path):
    from ft_core.config import FaultToleranceConfig
    from ft_core.launcher.control import WorkloadControlServer

    cfg = FaultToleranceConfig()
    cfg.max_frame_bytes = 1 << 40  # past the config's own checks: the servers must not trust it either
    with pytest.raises(ValueError, match="max_frame_bytes: invalid value 1099511627776"):
        server.RankMonitorServer(cfg, str(tmp_path / "monitor.sock"), token=TOKEN)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        WorkloadControlServer(str(tmp_path / "launcher.sock"), TOKEN, 1 << 40)


# -- a live monitor ------------------------------------------------------------------
def test_a_deeply_nested_frame_closes_only_its_connection(monitor, ranks):
    healthy = ranks(monitor, "heartbeat_forever")
    with connect(monitor) as sock:
        sock.sendall(_deep_hello(50_000))  # deep, yet within the size allowed before a Hello
        assert closed_by_peer(sock, 10)
    assert "nested" in wait_rejection(monitor, "nested")
    assert_untouched(monitor, healthy)
    ranks(monitor, "heartbeat_forever", rank=1)  # still accepts and serves new ranks


def test_zero_length_and_oversized_frames_are_rejected_with_a_clear_reason(monitor, ranks):
    healthy = ranks(monitor, "heartbeat_forever")
    with connect(monitor) as sock:
        sock.sendall(b"\x00\x00\x00\x00")
        assert closed_by_peer(sock, 10)
    wait_rejection(monitor, "empty frame (length 0)")
    with connect(monitor) as sock:
        sock.sendall(b"\xff\xff\xff\xff")
        assert closed_by_peer(sock, 10)
    wait_rejection(monitor, "4294967295 bytes exceeds")
    assert_untouched(monitor, healthy)


def test_a_large_frame_before_the_handshake_is_refused_without_buffering_it(monitor, ranks):
    healthy = ranks(monitor, "heartbeat_forever")
    size = protocol.MAX_HELLO_FRAME_BYTES + 1  # below max_frame_bytes, above what a Hello needs
    with connect(monitor) as sock:
        sock.sendall(struct.pack(">I", size) + b"\x00" * 1000)
        assert closed_by_peer(sock, 10)
    wait_rejection(monitor, "before the handshake")
    assert_untouched(monitor, healthy)


def test_a_handshake_that_never_completes_is_closed_after_the_handshake_timeout(monitor, ranks):
    healthy = ranks(monitor, "heartbeat_forever")
    with connect(monitor) as silent, connect(monitor) as partial:
        partial.sendall(encode(Hello(token=TOKEN, rank=0))[:7])  # a torn Hello, never finished
        assert closed_by_peer(silent, defences.HANDSHAKE_TIMEOUT + 10)
        assert closed_by_peer(partial, 10)
    wait_rejection(monitor, "no handshake within")
    assert_untouched(monitor, healthy)


def test_pending_handshakes_are_capped_by_dropping_the_oldest(monitor, ranks):
    healthy = ranks(monitor, "heartbeat_forever")
    extra = 5
    socks = [connect(monitor) for _ in range(defences.MAX_PENDING_HANDSHAKES + extra)]
    try:
        oldest, newest = socks[:extra], socks[extra:]
        assert all(closed_by_peer(sock, 10) for sock in oldest)
        wait_rejection(monitor, "too many pending handshakes")
        for sock in newest:  # still open: the monitor has not closed them
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
        # A real rank connecting now is served: the cap evicts idle connections, not it.
        ranks(monitor, "heartbeat_forever", rank=1)
    finally:
        for sock in socks:
            sock.close()
    assert_untouched(monitor, healthy)


def test_frames_for_another_rank_without_the_token_change_nothing(monitor, ranks):
    healthy = ranks(monitor, "heartbeat_forever", rank=3)
    with connect(monitor) as sock:
        sock.sendall(encode(Heartbeat(iteration=1)))  # before any Hello
        assert closed_by_peer(sock, 10)
    with connect(monitor) as sock:
        sock.sendall(encode(Hello(token="wrong", rank=3)))
        assert closed_by_peer(sock, 10)
    wait_rejection(monitor, "wrong job token")
    wait_rejection(monitor, "expected Hello first")
    assert_untouched(monitor, healthy)


@pytest.mark.parametrize("name, seconds, words", [
    ("forward", float("nan"), "a finite number of seconds"),
    ("forward", -1.0, "a finite number of seconds"),
    ("", 0.1, "a non-empty string"),
    ("x" * 1000, 0.1, "a non-empty string"),
])
def test_a_bad_phase_sample_closes_only_its_connection(monitor, ranks, name, seconds, words):
    # Straggler detection's phase messages cross the socket too: validated, never trusted.
    from ft_core.protocol import HelloAck, PhaseTime, recv_msg, send_msg

    healthy = ranks(monitor, "heartbeat_forever")
    with connect(monitor) as sock:
        send_msg(sock, Hello(token=TOKEN, rank=7))
        assert isinstance(recv_msg(sock, FrameDecoder(), 10), HelloAck)
        send_msg(sock, PhaseTime(name=name, seconds=seconds))
        assert closed_by_peer(sock, 10)
    assert words in wait_rejection(monitor, words)
    assert_untouched(monitor, healthy)


@pytest.mark.parametrize(("exception_type", "frames", "iteration", "words"), [
    ("", ["a.py:1 f"], 3, "needs a type"),
    ("ValueError", [f"a.py:{i} f" for i in range(9)], 3, "at most 8 frames"),
    ("ValueError", ["a" * 301], 3, "at most 300 characters"),
    ("Value\x00Error", [], 3, "without NUL"),
    ("ValueError", [], -1, "invalid iteration"),
])
def test_a_bad_exception_report_closes_only_its_connection(monitor, ranks, exception_type, frames, iteration, words):
    # A fault's fingerprint crosses the socket too: bounded and validated, never trusted.
    from ft_core.protocol import HelloAck, ReportException, recv_msg, send_msg

    healthy = ranks(monitor, "heartbeat_forever")
    with connect(monitor) as sock:
        send_msg(sock, Hello(token=TOKEN, rank=7))
        assert isinstance(recv_msg(sock, FrameDecoder(), 10), HelloAck)
        send_msg(sock, ReportException(exception_type=exception_type, frames=frames, iteration=iteration))
        assert closed_by_peer(sock, 10)
    assert words in wait_rejection(monitor, words)
    assert_untouched(monitor, healthy)


@pytest.mark.parametrize("dump_path, words", [
    ("{stacks}/rank7\x00.txt", "NUL"),
    ("relative/rank7.txt", "absolute"),
    ("{victim}", "inside"),
    ("{stacks}/../monitor_events.jsonl", "inside"),
])
def test_a_bad_dump_path_is_refused_at_the_handshake(monitor, ranks, victim, dump_path, words):
    # A client with the token must not make the monitor touch a file of its choice, nor kill it with a
    # path os.stat() raises ValueError on (a NUL byte) when that rank's deadline comes.
    from ft_core.protocol import Ack, recv_msg, send_msg

    healthy = ranks(monitor, "heartbeat_forever")
    stacks = os.path.join(os.path.dirname(monitor.socket_path), "stacks")
    with connect(monitor) as sock:
        send_msg(sock, Hello(token=TOKEN, rank=7, dump_path=dump_path.format(stacks=stacks, victim=victim)))
        reply = recv_msg(sock, FrameDecoder(), 10)
        assert isinstance(reply, Ack) and not reply.ok
        assert "dump_path" in reply.error and words in reply.error
        assert closed_by_peer(sock, 10)
    wait_rejection(monitor, "dump_path")
    assert_untouched(monitor, healthy)
    assert victim.read_text() == VICTIM_TEXT
