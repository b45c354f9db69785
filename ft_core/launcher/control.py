"""Workload-control server: ranks ask the launcher to exclude their node or shut the job down.

Listens on ``FT_LAUNCHER_IPC_SOCKET`` (the job dir's ``launcher_socket``, mode 0600
in a 0700 directory). A client sends ``Hello(role=Role.CONTROL, token=...)`` and
``WorkloadControl`` back to back and reads one ``Ack`` (see docs/core_api.md).
Accepted requests are queued for the agent's main loop, which acts on them
between two monitoring passes; the server thread never touches workers.

The accept loop survives every error but the listener's close: out of file
descriptors (EMFILE/ENFILE) it logs once and retries with a growing pause
(the kernel keeps queueing connections meanwhile). At most
:data:`MAX_PENDING_REQUESTS` connections are served at once; one more closes
the oldest (a real client sends its two frames at once: the oldest is the
likeliest to be idle).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import hmac
import logging
import os
import queue
import socket
import threading
import time
from typing import Optional

from ft_core.data import WorkloadAction
from ft_core.jobdir import PRIVATE_FILE_MODE
from ft_core.protocol import (
    MAX_HELLO_FRAME_BYTES,
    Ack,
    FrameDecoder,
    Hello,
    ProtocolError,
    Role,
    WorkloadControl,
    check_max_frame_bytes,
    recv_msg,
    send_msg,
)
from ft_core.utils.ratelimit import LogThrottle

__all__ = ["ControlRequest", "MAX_PENDING_REQUESTS", "WorkloadControlServer"]

log = logging.getLogger("ft_core.launcher")

#: A client must complete its request within this time.
REQUEST_TIMEOUT = 5.0
#: Connections served at once (one thread each); one more closes the oldest.
MAX_PENDING_REQUESTS = 32
#: Warnings about rejected connections logged per window; the rest are counted.
_WARNINGS_PER_WINDOW = 20
_WARNING_WINDOW = 10.0
#: Pauses of the accept loop after an accept() error: first, and at most (doubling in between).
_BACKOFF_FIRST = 0.05
_BACKOFF_MAX = 1.0
#: On the wire an action is its name (stable, readable in logs), not its NVRx integer value.
_ACTIONS = {action.name: action for action in WorkloadAction}


@dataclasses.dataclass(frozen=True)
class ControlRequest:
    """One accepted workload-control request."""

    action: WorkloadAction
    description: str
    rank: int
    time: float


class WorkloadControlServer:
    """Serves workload-control requests on a Unix socket from a daemon thread."""

    def __init__(self, socket_path: str, token: str, max_frame_bytes: int) -> None:
        self.socket_path = socket_path
        self._token = token.encode()
        self._max_frame_bytes = check_max_frame_bytes(max_frame_bytes)  # here, not in a request's thread
        self._requests: queue.Queue[ControlRequest] = queue.Queue()
        self._closed = threading.Event()
        #: Connections being served, oldest first.
        self._pending: collections.OrderedDict[int, socket.socket] = collections.OrderedDict()
        self._pending_lock = threading.Lock()
        self._warnings = LogThrottle(_WARNINGS_PER_WINDOW, _WARNING_WINDOW)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(socket_path)
        os.chmod(socket_path, PRIVATE_FILE_MODE)
        self._listener.listen(64)
        self._thread = threading.Thread(target=self._serve, name="ft-workload-control", daemon=True)
        self._thread.start()

    def pop(self) -> Optional[ControlRequest]:
        """The oldest pending request, or None."""
        try:
            return self._requests.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        self._closed.set()
        # shutdown() wakes the accept() in the server thread.
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=2.0)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    def _serve(self) -> None:
        backoff = None  # seconds of the next pause while accept() fails; None while it works
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError as exc:
                if self._closed.is_set():
                    return
                if backoff is None:
                    what = "out of file descriptors" if exc.errno in (errno.EMFILE, errno.ENFILE) else "failing"
                    log.warning("workload-control accept() %s (%s): retrying until it works", what, exc)
                    backoff = _BACKOFF_FIRST
                self._closed.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                continue
            if backoff is not None:
                log.warning("workload-control server accepting connections again")
                backoff = None
            self._admit(conn)
            try:
                threading.Thread(target=self._handle, args=(conn,), name="ft-workload-request", daemon=True).start()
            except RuntimeError as exc:  # "can't start new thread": out of memory or of threads
                log.warning("cannot serve a workload-control connection: %s", exc)
                with self._pending_lock:
                    self._pending.pop(id(conn), None)
                conn.close()

    def _admit(self, conn: socket.socket) -> None:
        with self._pending_lock:
            self._pending[id(conn)] = conn
            if len(self._pending) <= MAX_PENDING_REQUESTS:
                return
            _, oldest = self._pending.popitem(last=False)
        self._warn(f"too many pending workload-control connections ({MAX_PENDING_REQUESTS}): closing the oldest")
        try:
            oldest.shutdown(socket.SHUT_RDWR)  # its thread sees the end of the stream and closes it
        except OSError:
            pass

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._serve_request(conn)
        finally:
            with self._pending_lock:
                self._pending.pop(id(conn), None)
            conn.close()

    def _serve_request(self, conn: socket.socket) -> None:
        decoder = FrameDecoder(self._max_frame_bytes,
                               first_frame_bytes=min(MAX_HELLO_FRAME_BYTES, self._max_frame_bytes))
        try:
            hello = recv_msg(conn, decoder, REQUEST_TIMEOUT)
            if not isinstance(hello, Hello) or hello.role is not Role.CONTROL:
                raise ProtocolError(f"expected a control Hello, got {type(hello).__name__}")
            if not hmac.compare_digest(hello.token.encode(), self._token):
                raise ProtocolError("wrong job token")
            msg = recv_msg(conn, decoder, REQUEST_TIMEOUT)
            if not isinstance(msg, WorkloadControl):
                raise ProtocolError(f"expected WorkloadControl, got {type(msg).__name__}")
        except (OSError, TimeoutError, ConnectionError, ProtocolError) as exc:
            log.warning("rejected a workload-control connection: %s", exc)
            return
        action = _ACTIONS.get(msg.action)
        if action is None:
            allowed = ", ".join(sorted(_ACTIONS))
            self._reply(conn, Ack(ok=False, error=f"unknown action {msg.action!r}; allowed: {allowed}"))
            return
        self._requests.put(ControlRequest(action, msg.description, msg.rank, time.time()))
        log.info("rank %d requested %s: %s", msg.rank, action.name, msg.description or "(no reason given)")
        self._reply(conn, Ack(ok=True))

    def _warn(self, message: str) -> None:
        """A warning about one bad connection, throttled: a flood of them logs a few lines."""
        held_back = self._warnings.allow()
        if held_back is not None:
            log.warning("%s%s", message, f" ({held_back} similar warnings not logged)" if held_back else "")

    @staticmethod
    def _reply(conn: socket.socket, ack: Ack) -> None:
        try:
            send_msg(conn, ack)
        except OSError as exc:
            log.warning("could not answer a workload-control request: %s", exc)
