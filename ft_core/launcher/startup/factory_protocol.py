"""The channel between a launcher and its worker factory, and the messages on it (:mod:`.zygote`, :mod:`.prewarm`).

A private socket pair: frames of a 4-byte length and a JSON payload (msgspec
structs), file descriptors passed alongside (``SCM_RIGHTS``). The launcher
asks (``Prepare``, ``Fork``, ``Retire``); the factory answers (``Ready``,
``Prepared``, ``Forked``, ``Retired``, or ``Failed`` with the reason).

Imported by the factory before anything else (:mod:`.zygote`): standard library and msgspec only.
"""

from __future__ import annotations

import enum
import os
import socket
import struct
from collections.abc import Sequence
from typing import Optional, Union

import msgspec

__all__ = [
    "MAX_FDS",
    "MAX_FRAME_BYTES",
    "EntryKind",
    "FactoryChannel",
    "FactoryError",
    "FactoryMessage",
    "Failed",
    "Fork",
    "Forked",
    "Prepare",
    "Prepared",
    "PythonInvocation",
    "Ready",
    "Retire",
    "Retired",
]

_HEADER = struct.Struct(">I")
#: The largest frame accepted on the channel (a worker's environment can be large on clusters).
MAX_FRAME_BYTES = 16 << 20
#: The most file descriptors one frame carries (stdin, stdout, stderr).
MAX_FDS = 3


class FactoryError(Exception):
    """The factory cannot fork workers (bad request, broken channel, unsafe state)."""


class EntryKind(str, enum.Enum):
    """What ``python`` runs: a script file or a module (``-m``)."""

    SCRIPT = "script"
    MODULE = "module"


class PythonInvocation(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``python [-u] (script | -m module) args...`` as torchrun builds a worker's command line."""

    kind: EntryKind
    target: str
    args: list[str]
    unbuffered: bool

    @classmethod
    def parse(cls, interpreter: str, argv: Sequence[str]) -> Optional[PythonInvocation]:
        """The invocation in ``argv`` if it runs ``interpreter`` the way torchrun does, else ``None``.

        Only ``-u`` is accepted before the target (torchrun adds it); any other
        interpreter option, another executable (``--no-python``, a numactl
        wrapper) or a missing target gives ``None``: the worker is then started
        as a new process.
        """
        if len(argv) < 2 or argv[0] != interpreter:
            return None
        rest = list(argv[1:])
        unbuffered = False
        while rest and rest[0] == "-u":
            unbuffered = True
            rest.pop(0)
        if len(rest) >= 2 and rest[0] == "-m":
            return cls(EntryKind.MODULE, rest[1], rest[2:], unbuffered)
        if rest and not rest[0].startswith("-"):
            return cls(EntryKind.SCRIPT, rest[0], rest[1:], unbuffered)
        return None

    def command_line(self) -> list[str]:
        """The worker's command line after the interpreter, as torchrun builds it: ``[-u] (script | -m module) args``."""
        return [*(["-u"] if self.unbuffered else []), *(["-m"] if self.kind is EntryKind.MODULE else []),
                self.target, *self.args]

    def path0(self, cwd: str) -> str:
        """``sys.path[0]`` of a new interpreter: the script's real directory, or the working directory for ``-m``."""
        if self.kind is EntryKind.MODULE:
            return cwd
        return os.path.dirname(os.path.realpath(os.path.join(cwd, self.target)))


class Ready(msgspec.Struct, tag="ready", forbid_unknown_fields=True):
    pid: int
    import_seconds: float


class Failed(msgspec.Struct, tag="failed", forbid_unknown_fields=True):
    error: str


class Fork(msgspec.Struct, tag="fork", forbid_unknown_fields=True):
    """Fork one worker; stdin, stdout and stderr travel with the frame."""

    invocation: PythonInvocation
    env: dict[str, str]
    cwd: str
    #: The command line a plain start would have run (``sys.orig_argv``).
    orig_argv: list[str]


class Forked(msgspec.Struct, tag="forked", forbid_unknown_fields=True):
    pid: int


class Prepare(msgspec.Struct, tag="prepare", forbid_unknown_fields=True):
    """Fork the successor on the channel sent with the frame; it waits until this factory exits."""


class Prepared(msgspec.Struct, tag="prepared", forbid_unknown_fields=True):
    successor_pid: int


class Retire(msgspec.Struct, tag="retire", forbid_unknown_fields=True):
    """Exit; the prepared successor takes over."""


class Retired(msgspec.Struct, tag="retired", forbid_unknown_fields=True):
    pass


FactoryMessage = Union[Ready, Failed, Prepare, Prepared, Fork, Forked, Retire, Retired]
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(FactoryMessage)


class FactoryChannel:
    """Framed messages with file descriptors over a stream socket pair (both ends use this class)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: FactoryMessage, fds: Sequence[int] = ()) -> None:
        payload = _encoder.encode(msg)
        frame = _HEADER.pack(len(payload)) + payload
        # The descriptors ride on the first bytes of the frame; the rest follows with sendall.
        sent = socket.send_fds(self.sock, [frame], list(fds)) if fds else self.sock.send(frame)
        if sent < len(frame):
            self.sock.sendall(frame[sent:])

    def recv(self, timeout: Optional[float] = None) -> Optional[tuple[FactoryMessage, list[int]]]:
        """The next message and its descriptors; ``None`` when the peer closed the channel.

        Raises ``TimeoutError`` after ``timeout`` seconds and :class:`FactoryError`
        for a malformed frame (any descriptors received with it are closed).
        """
        self.sock.settimeout(timeout)
        header, fds, _flags, _addr = socket.recv_fds(self.sock, _HEADER.size, MAX_FDS)
        try:
            if not header:
                return None
            header += self._read_exactly(_HEADER.size - len(header))
            (length,) = _HEADER.unpack(header)
            if length > MAX_FRAME_BYTES:
                raise FactoryError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
            payload = self._read_exactly(length)
            try:
                return _decoder.decode(payload), fds
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise FactoryError(f"malformed message: {exc}") from None
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def _read_exactly(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            data = self.sock.recv(size - len(chunks))
            if not data:
                raise FactoryError("channel closed in the middle of a frame")
            chunks += data
        return bytes(chunks)

    def close(self) -> None:
        self.sock.close()
