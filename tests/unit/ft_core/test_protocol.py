"""The wire protocol: the frame decoder (split, oversize, zero-length and garbage frames) and wire values
other implementations rely on (the Hello role stays a plain string on the wire)."""

from __future__ import annotations

import socket
import struct
import threading

import msgspec
import pytest

from ft_core.protocol import (
    EndAllSections,
    FrameDecoder,
    Goodbye,
    Heartbeat,
    Hello,
    IterationFrame,
    ProtocolError,
    Role,
    SectionStart,
    encode,
)

MESSAGES = [Hello(token="t" * 32, rank=3, local_rank=1, timeouts={"x": 1}), Heartbeat(iteration=5),
            SectionStart(name="step", iteration=6), EndAllSections()]


def test_messages_survive_any_split_of_the_byte_stream():
    stream = b"".join(encode(m) for m in MESSAGES)
    for chunk in (1, 2, 3, 5, 7, len(stream)):
        decoder = FrameDecoder()
        received = []
        for start in range(0, len(stream), chunk):
            received += decoder.feed(stream[start:start + chunk])
        assert received == MESSAGES, f"chunk size {chunk}"


def test_a_partial_frame_yields_nothing_until_it_is_complete():
    frame = encode(Heartbeat(iteration=1))
    decoder = FrameDecoder()
    assert decoder.feed(frame[:3]) == []  # not even a whole header
    assert decoder.feed(frame[3:-1]) == []  # header, most of the payload
    assert decoder.feed(frame[-1:]) == [Heartbeat(iteration=1)]


def test_an_oversize_frame_is_refused_from_its_header_alone():
    decoder = FrameDecoder(max_frame_bytes=64)
    with pytest.raises(ProtocolError, match="65 bytes exceeds the limit of 64"):
        decoder.feed(struct.pack(">I", 65))  # no payload sent: nothing is buffered for it
    assert FrameDecoder(max_frame_bytes=64).feed(encode(Heartbeat())) == [Heartbeat()]


def test_a_frame_at_the_limit_is_accepted():
    frame = encode(SectionStart(name="s" * 40))
    limit = len(frame) - 4
    assert FrameDecoder(max_frame_bytes=limit).feed(frame) == [SectionStart(name="s" * 40)]


@pytest.mark.parametrize("payload", [
    b"\x00\x01\x02garbage",  # not msgpack
    b"\x81\xa3foo\x01",  # msgpack, not a message
    b"\x82\xa4type\xa2hb\xa9iteration\xa3bad",  # a message with a wrong field type
])
def test_garbage_payloads_are_protocol_errors(payload):  # empty frames: tests/security
    with pytest.raises(ProtocolError, match="undecodable message"):
        FrameDecoder().feed(struct.pack(">I", len(payload)) + payload)


def test_unknown_fields_are_refused():
    import msgspec

    payload = msgspec.msgpack.encode({"type": "hb", "iteration": 1, "extra": True})
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack(">I", len(payload)) + payload)


def test_role_is_an_enum_with_the_old_wire_values():
    assert Hello(token="t", rank=0).role is Role.RANK
    payload = encode(Hello(token="t", rank=0, role=Role.CONTROL))[4:]
    assert msgspec.msgpack.decode(payload)["role"] == "control"  # a plain string on the wire
    (decoded,) = FrameDecoder().feed(encode(Hello(token="t", rank=1)))
    assert isinstance(decoded, Hello) and decoded.role is Role.RANK


def test_unknown_role_is_a_protocol_error():
    raw = msgspec.msgpack.encode({"type": "hello", "token": "t", "rank": 0, "role": "admin"})
    with pytest.raises(ProtocolError, match="role"):
        FrameDecoder().feed(len(raw).to_bytes(4, "big") + raw)


def test_a_plain_goodbye_is_the_frame_it_always_was_and_a_finished_one_says_so():
    # training_finished is omitted when False: a monitor of an earlier release still accepts the plain goodbye.
    assert encode(Goodbye())[4:] == msgspec.msgpack.encode({"type": "bye"})
    (decoded,) = FrameDecoder().feed(encode(Goodbye(training_finished=True)))
    assert decoded == Goodbye(training_finished=True)


@pytest.mark.parametrize("message", [Heartbeat(), SectionStart(name="step"), SectionStart(name="\xcf\xff" * 9)])
def test_an_iteration_frame_decodes_as_the_encoded_message_for_every_iteration(message):
    # The hot paths patch the iteration into one frame instead of encoding a new one: the monitor must read
    # exactly what encode() would have sent, whatever the iteration (a name holding the marker bytes too).
    frames = IterationFrame(message)
    for iteration in (None, 0, 1, 127, 128, 255, 65535, 2**32, 2**64 - 1, -1, -(2**63), 7, None):
        expected = msgspec.structs.replace(message, iteration=iteration)
        frame = bytes(frames.frame(iteration))
        assert FrameDecoder().feed(frame) == [expected], iteration
    assert isinstance(frames.frame(3), bytearray)  # patched in place, not encoded again
    assert frames.frame(3) is frames.frame(4)


def _fill_accept_queue(path: str, queued: list) -> None:
    """Connect without accepting until the listener's queue refuses one more (EAGAIN)."""
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(path)
        except BlockingIOError:
            sock.close()
            return
        queued.append(sock)


def test_connect_waits_out_a_full_accept_backlog_instead_of_failing_at_once(tmp_path):
    # A Unix socket whose accept queue is full refuses a connect with EAGAIN at once when the socket has a
    # timeout (Python's timeout mode is non-blocking); a rank must wait for the queue to drain, not fail.
    from ft_core.protocol import connect_unix

    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(0)
    queued: list[socket.socket] = []
    try:
        _fill_accept_queue(path, queued)
        drained = threading.Timer(0.3, lambda: [listener.accept()[0].close() for _ in queued])
        drained.start()
        with connect_unix(path, timeout=10.0) as sock:
            assert sock.gettimeout() == 10.0
        drained.join()
        _fill_accept_queue(path, queued)  # and now nobody accepts: the timeout, not EAGAIN
        with pytest.raises(TimeoutError):
            connect_unix(path, timeout=0.2)
    finally:
        for sock in queued:
            sock.close()
        listener.close()
