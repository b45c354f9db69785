"""Workload-control server: ranks ask the launcher to exclude their node or shut the job down.

Listens on ``FT_LAUNCHER_IPC_SOCKET`` (the job dir's ``launcher_socket``, mode 0600
in a 0700 directory). A client sends ``Hello(role=Role.CONTROL, token=...)`` and
``WorkloadControl`` back to back and reads one ``Ack`` (see docs/core_api.md).
Accepted requests are queued for the agent's main loop, which acts on them
between two monitoring passes; the server thread never touches workers.
"""

from __future__ import annotations

import dataclasses
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
    Ack,
    FrameDecoder,
    Hello,
    ProtocolError,
    Role,
    WorkloadControl,
    recv_msg,
    send_msg,
)

__all__ = ["ControlRequest", "WorkloadControlServer"]

log = logging.getLogger("ft_core.launcher")

#: A client must complete its request within this time.
REQUEST_TIMEOUT = 5.0
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
        self._max_frame_bytes = max_frame_bytes
        self._requests: queue.Queue[ControlRequest] = queue.Queue()
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
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._handle, args=(conn,), name="ft-workload-request", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        decoder = FrameDecoder(self._max_frame_bytes)
        with conn:
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

    @staticmethod
    def _reply(conn: socket.socket, ack: Ack) -> None:
        try:
            send_msg(conn, ack)
        except OSError as exc:
            log.warning("could not answer a workload-control request: %s", exc)
