"""SendBacklog on a real Unix socket pair: a full buffer holds frames back, in order, and a thread flushes them."""

from __future__ import annotations

import socket

from ft_core.client_backlog import SendBacklog
from ft_core.utils.deadline import wait_until


def _full_pair() -> tuple[socket.socket, socket.socket, bytes]:
    """A connected pair whose writing end's buffer is full; returns (writer, reader, the bytes it took)."""
    writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    writer.setblocking(False)
    taken = bytearray()
    chunk = b"x" * 512
    while True:
        try:
            taken += chunk[:writer.send(chunk)]
        except BlockingIOError:
            return writer, reader, bytes(taken)


def _read(reader: socket.socket, size: int) -> bytes:
    """Read ``size`` bytes, waiting at most 10 s for them (the flusher sends in the background)."""
    reader.settimeout(10)
    data = bytearray()
    while len(data) < size:
        data += reader.recv(size - len(data))
    return bytes(data)


def test_held_back_frames_are_flushed_in_order_and_heartbeats_coalesced():
    writer, reader, taken = _full_pair()
    backlog = SendBacklog()
    backlog.start(writer, "rank 0")
    try:
        backlog.hold_back(b"<start>", heartbeat=False)
        backlog.hold_back(b"<hb 1>", heartbeat=True)
        backlog.hold_back(b"<hb 2>", heartbeat=True)  # replaces <hb 1>: only the latest heartbeat waits
        backlog.hold_back(b"<end>", heartbeat=False)
        assert backlog.congested and backlog.coalesced == 2
        # The reader makes room; nobody calls the backlog again: its thread sends what it held.
        received = _read(reader, len(taken) + len(b"<start><end><hb 2>"))
        assert received == taken + b"<start><end><hb 2>"
        assert wait_until(lambda: not backlog.congested, timeout=10)
        assert backlog.stop() == b""
    finally:
        backlog.stop()
        writer.close()
        reader.close()


def test_what_is_held_back_is_a_copy_of_a_frame_patched_later():
    # The client's heartbeat and section-start frames are one bytearray each, patched for the next iteration
    # (IterationFrame): what waits must be the frame as it was when it was held back.
    writer, reader, taken = _full_pair()
    backlog = SendBacklog()
    backlog.start(writer, "rank 0")
    start, heartbeat = bytearray(b"<start 1>"), bytearray(b"<hb 1>")
    try:
        backlog.hold_back(start, heartbeat=False)
        backlog.hold_back(heartbeat, heartbeat=True)
        start[-2:-1], heartbeat[-2:-1] = b"2", b"2"
        assert _read(reader, len(taken) + len(b"<start 1><hb 1>")) == taken + b"<start 1><hb 1>"
    finally:
        backlog.stop()
        writer.close()
        reader.close()


def test_a_round_trip_takes_what_is_held_back_first():
    writer, reader, _taken = _full_pair()
    backlog = SendBacklog()
    backlog.start(writer, "rank 0")
    try:
        backlog.hold_back(b"<start>", heartbeat=False)
        backlog.hold_back(b"<hb>", heartbeat=True)
        with backlog.exclusive():  # the flusher is kept off the socket meanwhile
            assert backlog.held() == b"<start><hb>"
            backlog.clear()
        assert not backlog.congested and backlog.held() == b""
    finally:
        assert backlog.stop() == b""
        writer.close()
        reader.close()


def test_shutdown_hands_over_unsent_section_bytes_and_drops_the_pending_heartbeat():
    writer, reader, _taken = _full_pair()
    backlog = SendBacklog()
    backlog.start(writer, "rank 0")
    try:
        backlog.hold_back(b"<end>", heartbeat=False)
        backlog.hold_back(b"<hb>", heartbeat=True)
        assert backlog.stop() == b"<end>"
    finally:
        writer.close()
        reader.close()


def test_a_lost_monitor_drops_everything_and_never_raises(caplog):
    writer, reader, _taken = _full_pair()
    backlog = SendBacklog()
    backlog.start(writer, "rank 3")
    reader.close()  # the monitor died
    try:
        backlog.hold_back(b"<start>", heartbeat=False)
        assert backlog.lost and backlog.congested
        backlog.hold_back(b"<end>", heartbeat=False)  # dropped, without an error
        assert backlog.stop() == b""
        assert "rank 3 lost its rank monitor connection" in caplog.text
    finally:
        writer.close()
