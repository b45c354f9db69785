"""Wire protocol between ranks, the node monitor and the launcher.

A frame is a 4-byte big-endian payload length followed by a msgpack payload
(msgspec tagged structs). Decoding is schema-checked: a frame that is not one
of the message types below raises :class:`ProtocolError`. Nothing is ever
unpickled. The first message on every connection is :class:`Hello` carrying
the job token; the peer answers :class:`HelloAck` or closes the connection.

This module must not import torch (the monitor imports it).
"""

from __future__ import annotations

import enum
import socket
import struct
import time
from typing import Any, Optional, Union

import msgspec

__all__ = [
    "Ack",
    "DEFAULT_MAX_FRAME_BYTES",
    "EndAllSections",
    "FrameDecoder",
    "Goodbye",
    "Heartbeat",
    "Hello",
    "HelloAck",
    "MAX_FRAME_BYTES_LIMIT",
    "Message",
    "ProtocolError",
    "ReportCheckpoint",
    "Role",
    "SectionEnd",
    "SectionStart",
    "UpdateTimeouts",
    "WorkloadControl",
    "encode",
    "recv_msg",
    "request",
    "send_msg",
]

DEFAULT_MAX_FRAME_BYTES = 1 << 20
_HEADER = struct.Struct(">I")
#: The largest payload a frame can announce: its length prefix is a 4-byte unsigned integer.
MAX_FRAME_BYTES_LIMIT = 2 ** (8 * _HEADER.size) - 1


class ProtocolError(Exception):
    """Malformed, oversized or unexpected data on a connection."""


class Role(str, enum.Enum):
    """Who opens a connection (``Hello.role``; the value is what goes on the wire)."""

    #: A training rank, served by the node monitor.
    RANK = "rank"
    #: A one-shot workload-control request, served by the launcher.
    CONTROL = "control"


class Hello(msgspec.Struct, tag="hello", forbid_unknown_fields=True):
    token: str
    rank: int
    local_rank: int = -1
    world_size: int = -1
    restart_count: int = 0
    role: Role = Role.RANK
    timeouts: Optional[dict[str, Any]] = None  # a loaded ``current_timeouts`` state dict
    dump_path: Optional[str] = None  # file the rank's faulthandler writes stack dumps to
    fallback_config: Optional[dict[str, Any]] = None  # see ft_core.config.with_fallback
    num_warmup_iters: Optional[int] = None  # overrides num_warmup_iterations for this connection (NVRx)
    # A "control" connection sends Hello then WorkloadControl back to back and reads one Ack.


class HelloAck(msgspec.Struct, tag="hello_ack", forbid_unknown_fields=True):
    config: dict[str, Any]


class Heartbeat(msgspec.Struct, tag="hb", forbid_unknown_fields=True):
    iteration: Optional[int] = None


class SectionStart(msgspec.Struct, tag="sec_start", forbid_unknown_fields=True):
    name: str
    iteration: Optional[int] = None


class SectionEnd(msgspec.Struct, tag="sec_end", forbid_unknown_fields=True):
    name: str


class EndAllSections(msgspec.Struct, tag="sec_end_all", forbid_unknown_fields=True):
    pass


class UpdateTimeouts(msgspec.Struct, tag="timeouts", forbid_unknown_fields=True):
    state: dict[str, Any]  # ``{"current_timeouts": {...}}``


class ReportCheckpoint(msgspec.Struct, tag="checkpoint", forbid_unknown_fields=True):
    iteration: int


class Goodbye(msgspec.Struct, tag="bye", forbid_unknown_fields=True):
    """Explicit end of monitoring: the monitor forgets the rank and never kills it."""


class WorkloadControl(msgspec.Struct, tag="workload", forbid_unknown_fields=True):
    action: str
    description: str = ""
    rank: int = -1


class Ack(msgspec.Struct, tag="ack", forbid_unknown_fields=True):
    ok: bool = True
    error: Optional[str] = None


Message = Union[
    Hello, HelloAck, Heartbeat, SectionStart, SectionEnd, EndAllSections, UpdateTimeouts,
    ReportCheckpoint, Goodbye, WorkloadControl, Ack,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    """Encode one message as a complete frame (header + payload)."""
    payload = _encoder.encode(msg)
    return _HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental decoder: ``feed()`` bytes, then iterate complete messages.

    Raises :class:`ProtocolError` for a frame larger than ``max_frame_bytes``
    (checked from the header, before buffering the payload) or a payload that
    is not a valid message.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        #: Messages already decoded but not yet consumed by :func:`recv_msg`.
        self.pending: list[Message] = []

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        buffer = memoryview(self._buffer)
        messages: list[Message] = []
        start = 0
        try:
            # Walk the frames by offset and trim the buffer once: trimming per frame
            # made a large read (a monitor catching up) quadratic in its size.
            while len(buffer) - start >= _HEADER.size:
                (length,) = _HEADER.unpack_from(buffer, start)
                if length > self.max_frame_bytes:
                    raise ProtocolError(f"frame of {length} bytes exceeds the limit of {self.max_frame_bytes}")
                end = start + _HEADER.size + length
                if len(buffer) < end:
                    break
                try:
                    messages.append(_decoder.decode(buffer[start + _HEADER.size:end]))
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise ProtocolError(f"undecodable message: {exc}") from None
                start = end
        finally:
            buffer.release()
        del self._buffer[:start]
        return messages


def send_msg(sock: socket.socket, msg: Message) -> None:
    sock.sendall(encode(msg))


def recv_msg(sock: socket.socket, decoder: FrameDecoder, timeout: Optional[float]) -> Message:
    """Block until one whole message arrives (or ``TimeoutError`` / ``ConnectionError``)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if decoder.pending:
        return decoder.pending.pop(0)
    while True:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no reply from peer within the timeout")
            sock.settimeout(remaining)
        else:
            sock.settimeout(None)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no reply from peer within the timeout") from None
        if not data:
            raise ConnectionError("peer closed the connection")
        decoder.pending.extend(decoder.feed(data))
        if decoder.pending:
            return decoder.pending.pop(0)


def request(sock: socket.socket, decoder: FrameDecoder, msg: Message, timeout: Optional[float]) -> Message:
    """Send ``msg`` and wait for the reply."""
    send_msg(sock, msg)
    return recv_msg(sock, decoder, timeout)
