"""Wire protocol between ranks, the node monitor and the launcher.

A frame is a 4-byte big-endian payload length followed by a msgpack payload
(msgspec tagged structs). Decoding is schema-checked: a frame that is not one
of the message types below raises :class:`ProtocolError`. Nothing is ever
unpickled. The first message on every connection is :class:`Hello` carrying
the job token; the peer answers :class:`HelloAck` or closes the connection.

The decoder is the first thing that touches bytes from an unauthenticated
peer, so it bounds everything before decoding: the frame length (checked from
the header, before the payload is buffered; a server may set a smaller bound
for the first frame, the Hello), empty frames, and msgpack nesting deeper
than :data:`MAX_NESTING` (msgspec decodes recursively: a frame nested a few
thousand levels deep would raise ``RecursionError`` instead of a
``ProtocolError``).

This module must not import torch (the monitor imports it).
"""

from __future__ import annotations

import enum
import socket
import struct
import time
from typing import Any, Optional, Union

import msgspec

from ft_core.utils.validation import int_in_range

__all__ = [
    "Ack",
    "DEFAULT_MAX_FRAME_BYTES",
    "EndAllSections",
    "Frame",
    "FrameDecoder",
    "Goodbye",
    "Heartbeat",
    "Hello",
    "HelloAck",
    "IterationFrame",
    "MAX_FRAME_BYTES_LIMIT",
    "MAX_HELLO_FRAME_BYTES",
    "MAX_EXCEPTION_FRAMES",
    "MAX_EXCEPTION_TEXT",
    "MAX_NESTING",
    "Message",
    "PhaseTime",
    "ProtocolError",
    "ReportCheckpoint",
    "ReportException",
    "Role",
    "SectionEnd",
    "SectionStart",
    "UpdateTimeouts",
    "WorkloadControl",
    "check_exception_report",
    "check_max_frame_bytes",
    "connect_unix",
    "encode",
    "recv_msg",
    "request",
    "send_msg",
]

DEFAULT_MAX_FRAME_BYTES = 1 << 20
_HEADER = struct.Struct(">I")
#: The largest payload a frame can announce: its length prefix is a 4-byte unsigned integer.
MAX_FRAME_BYTES_LIMIT = 2 ** (8 * _HEADER.size) - 1
#: Deepest msgpack nesting accepted; real messages nest at most 5 levels (a Hello's timeouts dict).
MAX_NESTING = 32
#: The largest first frame (the Hello) a server buffers from a peer that is not authenticated yet:
#: a Hello with a full fallback config is a few KB. Larger frames are for authenticated peers only.
MAX_HELLO_FRAME_BYTES = 64 * 1024


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
    fallback_config: Optional[dict[str, Any]] = None  # see ft_core.config_fallback.with_fallback
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


#: Bounds of a :class:`ReportException` (the monitor refuses larger ones): a fingerprint, not a traceback.
MAX_EXCEPTION_FRAMES = 8
MAX_EXCEPTION_TEXT = 300


class ReportException(msgspec.Struct, tag="exception", forbid_unknown_fields=True):
    """The rank is failing with an exception: its type and innermost user frames, sent before it dies.

    ``frames``: ``"file.py:42 function"``, innermost first (at most :data:`MAX_EXCEPTION_FRAMES`).
    """

    exception_type: str
    frames: list[str]
    iteration: Optional[int] = None


def check_exception_report(msg: ReportException) -> Optional[str]:
    """What is wrong with a rank's exception report, or None (the monitor refuses a bad one, that rank only)."""
    texts = [msg.exception_type, *msg.frames]
    if not msg.exception_type or len(msg.frames) > MAX_EXCEPTION_FRAMES:
        return f"an exception report needs a type and at most {MAX_EXCEPTION_FRAMES} frames"
    if any(len(text) > MAX_EXCEPTION_TEXT or "\x00" in text for text in texts):
        return f"exception report texts must be at most {MAX_EXCEPTION_TEXT} characters, without NUL"
    if msg.iteration is not None and msg.iteration < 0:
        return f"invalid iteration {msg.iteration}"
    return None


class PhaseTime(msgspec.Struct, tag="phase", forbid_unknown_fields=True):
    """One rank-local phase ended after ``seconds`` (straggler detection; see :mod:`ft_core.straggler_scoring`)."""

    name: str
    seconds: float


class Goodbye(msgspec.Struct, tag="bye", forbid_unknown_fields=True, omit_defaults=True):
    """Explicit end of monitoring: the monitor forgets the rank and never kills it.

    ``training_finished``: the rank reports that training is complete (its integration saw
    ``max_steps``/``max_epochs`` reached); once every rank of the job did, the launcher treats a
    worker's failure at exit as a warning, not a fault. Omitted on the wire when False, so a
    plain goodbye is the same frame it always was.
    """

    training_finished: bool = False


class WorkloadControl(msgspec.Struct, tag="workload", forbid_unknown_fields=True):
    action: str
    description: str = ""
    rank: int = -1


class Ack(msgspec.Struct, tag="ack", forbid_unknown_fields=True):
    ok: bool = True
    error: Optional[str] = None


Message = Union[
    Hello, HelloAck, Heartbeat, SectionStart, SectionEnd, EndAllSections, UpdateTimeouts,
    ReportCheckpoint, Goodbye, WorkloadControl, Ack, PhaseTime, ReportException,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    """Encode one message as a complete frame (header + payload)."""
    payload = _encoder.encode(msg)
    return _HEADER.pack(len(payload)) + payload


#: A frame as a client sends it: bytes, or the bytearray of an :class:`IterationFrame`.
Frame = Union[bytes, bytearray]

#: An iteration an :class:`IterationFrame` patches in: msgpack's uint64 (``0xcf`` and 8 bytes, big-endian).
_UINT64 = struct.Struct(">Q")
_UINT64_MAX = 2 ** (8 * _UINT64.size) - 1


class IterationFrame:
    """The frame of a message whose last field is ``iteration`` (:class:`Heartbeat`, :class:`SectionStart`),
    patched in place for each iteration instead of encoded again.

    The rank's hot paths send one with a new iteration at every step. Encoding it (a Struct, msgspec's
    encoder, the header, a concatenation) costs several times what writing eight bytes into a ready frame
    does, most of all with the code cold again after a step's compute (measured: about 18 us against 4 us
    after a 20 ms sleep). The iteration is written as msgpack's uint64, valid msgpack that decodes to the
    same integer as its shortest form: the monitor reads what :func:`encode` would have sent. None and
    values that are not an ``int`` in 0 .. 2**64-1 are encoded as :func:`encode` does.

    :meth:`frame` returns the same bytearray for every iteration: send it at once, copy what must wait.
    """

    def __init__(self, message: Union[Heartbeat, SectionStart]) -> None:
        self._message = message
        self._without = encode(msgspec.structs.replace(message, iteration=None))
        self._frame = bytearray(encode(msgspec.structs.replace(message, iteration=_UINT64_MAX)))
        self._offset = len(self._frame) - _UINT64.size  # the last field's value ends the frame
        self._iteration = _UINT64_MAX  # the iteration the frame holds

    def frame(self, iteration: Optional[int]) -> Frame:
        """The frame of the message with ``iteration``; a bytearray valid until the next call."""
        if iteration.__class__ is not int or not 0 <= iteration <= _UINT64_MAX:
            return self._without if iteration is None else encode(
                msgspec.structs.replace(self._message, iteration=iteration))
        if iteration != self._iteration:
            _UINT64.pack_into(self._frame, self._offset, iteration)
            self._iteration = iteration
        return self._frame


def check_max_frame_bytes(value: int, name: str = "max_frame_bytes") -> int:
    """``value`` if it is a frame size limit the 4-byte header can express (1 .. 2**32-1)."""
    return int_in_range(name, value, 1, MAX_FRAME_BYTES_LIMIT)


class FrameDecoder:
    """Incremental decoder: ``feed()`` bytes, then iterate complete messages.

    Raises :class:`ProtocolError` for a frame larger than its limit (checked
    from the header, before buffering the payload), an empty frame, a payload
    nested deeper than :data:`MAX_NESTING`, or a payload that is not a valid
    message. The limit is ``max_frame_bytes``, or ``first_frame_bytes`` for
    the first frame of the connection (a server bounds what an unauthenticated
    peer can make it buffer). Both must be within 1 .. 2**32-1
    (``ValidationError`` otherwise).
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 first_frame_bytes: Optional[int] = None) -> None:
        self.max_frame_bytes = check_max_frame_bytes(max_frame_bytes)
        self._first_frame_bytes = (None if first_frame_bytes is None
                                   else check_max_frame_bytes(first_frame_bytes, "first_frame_bytes"))
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
                if length == 0:
                    raise ProtocolError("empty frame (length 0): every message has a payload")
                if self._first_frame_bytes is not None and length > self._first_frame_bytes:
                    raise ProtocolError(f"frame of {length} bytes exceeds the limit of {self._first_frame_bytes} "
                                        "before the handshake")
                if length > self.max_frame_bytes:
                    raise ProtocolError(f"frame of {length} bytes exceeds the limit of {self.max_frame_bytes}")
                end = start + _HEADER.size + length
                if len(buffer) < end:
                    break
                payload = bytes(buffer[start + _HEADER.size:end])
                start = end
                self._first_frame_bytes = None
                if _nested_deeper_than(payload, MAX_NESTING):
                    raise ProtocolError(f"message nested deeper than {MAX_NESTING} levels")
                try:
                    messages.append(_decoder.decode(payload))
                except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # ValidationError is a DecodeError
                    raise ProtocolError(f"undecodable message: {exc}") from None
        finally:
            buffer.release()
        del self._buffer[:start]
        return messages


# -- msgpack nesting ------------------------------------------------------------------
# Bytes that open a container (fixmap, fixarray, array16/32, map16/32). A payload with no more
# of them than the bound cannot nest deeper, whatever they mean, so most frames skip the scan.
_CONTAINER_BYTES = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_OTHER_BYTES = bytes(b for b in range(256) if b not in _CONTAINER_BYTES)
# For every other type byte: (bytes of its length field, fixed bytes after it) -- str/bin/ext
# carry a length of their payload; ints, floats and fixext have a fixed size.
_SKIP = {
    0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0),  # bin 8/16/32
    0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),  # ext 8/16/32 (+ type byte)
    0xCA: (0, 4), 0xCB: (0, 8),  # float 32/64
    0xCC: (0, 1), 0xCD: (0, 2), 0xCE: (0, 4), 0xCF: (0, 8),  # uint
    0xD0: (0, 1), 0xD1: (0, 2), 0xD2: (0, 4), 0xD3: (0, 8),  # int
    0xD4: (0, 2), 0xD5: (0, 3), 0xD6: (0, 5), 0xD7: (0, 9), 0xD8: (0, 17),  # fixext (+ type byte)
    0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),  # str 8/16/32
}
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # (count bytes, items per count)


def _nested_deeper_than(payload: bytes, limit: int) -> bool:
    """True if the msgpack object in ``payload`` nests containers more than ``limit`` levels deep.

    Iterative (a recursive check would fail the same way as the decoder). A
    truncated payload ends the scan; the decoder then reports it.
    """
    if len(payload.translate(None, _OTHER_BYTES)) <= limit:
        return False
    pending: list[int] = []  # items still to read in each open container, outermost first
    left = 1  # items still to read at the current level (the top level holds one object)
    i, size = 0, len(payload)
    while i < size:
        byte = payload[i]
        i += 1
        left -= 1
        items = 0
        if 0x80 <= byte <= 0x8F:
            items = (byte & 0x0F) * 2
        elif 0x90 <= byte <= 0x9F:
            items = byte & 0x0F
        elif 0xA0 <= byte <= 0xBF:
            i += byte & 0x1F
        elif byte in _CONTAINERS:
            width, per = _CONTAINERS[byte]
            items = int.from_bytes(payload[i:i + width], "big") * per
            i += width
        elif byte in _SKIP:
            width, fixed = _SKIP[byte]
            i += width + fixed + (int.from_bytes(payload[i:i + width], "big") if width else 0)
        is_container = 0x80 <= byte <= 0x9F or byte in _CONTAINERS
        if is_container and len(pending) + 1 > limit:
            return True
        if items:
            pending.append(left)
            left = items
        while left == 0 and pending:
            left = pending.pop()
        if left == 0:
            return False
    return False


def connect_unix(path: str, timeout: float) -> socket.socket:
    """A Unix stream socket connected to ``path``, with ``timeout`` set on it.

    A socket with a timeout is non-blocking underneath, and a Unix socket whose peer's accept
    queue is full refuses such a connect with ``EAGAIN`` at once (a blocking connect would wait).
    A rank must not fail because a flood filled its monitor's queue for a moment: the connect is
    retried until ``timeout``, then ``TimeoutError``.
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:
            sock.close()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{path}: the peer's accept queue stayed full for {timeout} s") from None
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.05)
        except BaseException:
            sock.close()
            raise


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
