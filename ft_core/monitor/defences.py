"""The monitor's defences against bad peers: accept, shed, cap, reject, and the descriptor reserve.

Hostile or broken peers cost the other ranks nothing: a connection that
sends garbage (see :class:`~ft_core.protocol.FrameDecoder` for the bounds)
is closed alone. At most :data:`MAX_PENDING_HANDSHAKES` connections may wait
for their Hello (beyond that the oldest is closed: a real rank says Hello at
once, so the oldest idle one is the likeliest to be junk); each gets
:data:`HANDSHAKE_TIMEOUT` seconds and may make the monitor buffer at most
:data:`~ft_core.protocol.MAX_HELLO_FRAME_BYTES` before it. When ``accept()``
fails for lack of file descriptors (EMFILE/ENFILE) the monitor closes the
pending connection with a descriptor it keeps in reserve for that, logs
once, and keeps watching the ranks already connected. Rejections are logged
and recorded at a bounded rate.

:class:`Defences` holds that state for :class:`~ft_core.monitor.server.RankMonitorServer`:
it fills the server's connection table and selector; the server reads, judges and drops.

This module must not import torch: the monitor imports it.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable
from typing import Optional, Protocol

from ft_core.config import FaultToleranceConfig
from ft_core.events import ConnectionRejected, Event
from ft_core.monitor.watched_rank import WatchedRank
from ft_core.protocol import MAX_HELLO_FRAME_BYTES, FrameDecoder
from ft_core.utils.ratelimit import LogThrottle

__all__ = ["HANDSHAKE_TIMEOUT", "MAX_PENDING_HANDSHAKES", "Connection", "Defences", "Drop"]

log = logging.getLogger("ft_core.monitor")

#: An unauthenticated connection must say Hello within this time.
HANDSHAKE_TIMEOUT = 5.0
#: Connections still waiting for their Hello; one more closes the oldest. Far above the local ranks of
#: any node connecting at once (each says Hello at once), far below what would strain the monitor.
MAX_PENDING_HANDSHAKES = 256
#: Connections accepted per loop pass, so a connect flood cannot delay deadline checks.
_ACCEPT_BATCH = 64
#: accept() errors that mean "out of descriptors": close the newcomer with the reserve descriptor.
_NO_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
#: accept() errors about one connection (it went away before we took it): skip it.
_GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})
#: After an accept() error that closing a connection cannot help, the loop pauses this long.
_ACCEPT_BACKOFF = 0.01
#: Rejections logged (and recorded) per window; beyond that they are counted and summarized.
_REJECTIONS_PER_WINDOW = 20
_REJECTION_WINDOW = 10.0
_PEERCRED = struct.Struct("3i")


class Connection:
    """One peer's connection: its bounded decoder, when it was accepted, its pid from the kernel, its rank."""

    def __init__(self, sock: socket.socket, max_frame_bytes: int, accepted_at: float) -> None:
        self.sock = sock
        self.decoder = FrameDecoder(max_frame_bytes, first_frame_bytes=min(MAX_HELLO_FRAME_BYTES, max_frame_bytes))
        self.accepted_at = accepted_at
        self.peer_pid = _peer_pid(sock)
        self.rank: Optional[WatchedRank] = None
        self.graceful = False
        #: The rank's Goodbye reported training complete.
        self.training_finished = False


def _peer_pid(sock: socket.socket) -> int:
    """The connecting process's pid from the kernel (SO_PEERCRED), not from what it claims."""
    try:
        pid, _uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        return pid
    except (OSError, AttributeError):
        return -1


class Drop(Protocol):
    """The server's way to close a connection (``log_it``: log and record a rank's disconnect)."""

    def __call__(self, conn: Connection, log_it: bool = ...) -> None: ...


class Defences:
    """Lets peers in and keeps bad ones from costing the ranks anything; see the module docstring.

    Args:
        cfg: the monitor's config (its ``max_frame_bytes`` bounds every connection's decoder).
        socket_path: the listening socket, for log lines.
        selector: the server's selector; accepted connections are registered in it with themselves as data.
        connections: the server's connection table (by file descriptor), filled by :meth:`accept`.
        now: the server's clock (see ``RankMonitorServer._now``).
        record: writes an event to the monitor's event log.
        drop: the server's way to close a connection (``drop(conn, log_it=False)``).
    """

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        socket_path: str,
        selector: selectors.BaseSelector,
        connections: dict[int, Connection],
        now: Callable[[], float],
        record: Callable[[Event], None],
        drop: Drop,
    ) -> None:
        self.cfg = cfg
        self.socket_path = socket_path
        self._selector = selector
        self._connections = connections
        self._now = now
        self._record = record
        self._drop = drop
        self._listener: Optional[socket.socket] = None
        #: Connections without a handshake yet, oldest first (entries of ranks that said Hello linger
        #: until the next pruning).
        self._pending: dict[int, Connection] = {}
        #: A descriptor kept free so that, out of descriptors, a connection can still be accepted and closed.
        self._reserve_fd: Optional[int] = None
        #: Connections closed unserved for lack of descriptors since it began; None while descriptors last.
        self._shed: Optional[int] = None
        self._rejections = LogThrottle(_REJECTIONS_PER_WINDOW, _REJECTION_WINDOW)

    def open(self, listener: socket.socket) -> None:
        """Guard ``listener`` (already listening): take the reserve descriptor."""
        self._listener = listener
        self._reserve_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        """Give the reserve descriptor back (the server closes the listener and the connections)."""
        self._listener = None
        if self._reserve_fd is not None:
            os.close(self._reserve_fd)
            self._reserve_fd = None

    def forget(self, fileno: int) -> None:
        """The connection on ``fileno`` is closed: it waits for no handshake any more."""
        self._pending.pop(fileno, None)

    def accept(self) -> None:
        """Take the connections waiting on the listener, at most ``_ACCEPT_BATCH`` per loop pass."""
        assert self._listener is not None
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _GONE:
                    continue
                if exc.errno in _NO_DESCRIPTORS and self._shed_one(exc):
                    continue
                log.warning("accept() failed on %s: %s; retrying", self.socket_path, exc)
                time.sleep(_ACCEPT_BACKOFF)  # the listener stays readable: do not spin
                return
            if self._shed is not None:
                log.warning("file descriptors available again: accepting connections (%d closed unserved "
                            "meanwhile)", self._shed)
                self._shed = None
            sock.setblocking(False)
            conn = Connection(sock, self.cfg.max_frame_bytes, self._now())
            self._connections[sock.fileno()] = conn
            self._pending[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._cap_pending()

    def _shed_one(self, exc: OSError) -> bool:
        """Out of descriptors: accept the next connection on the reserve descriptor and close it at once.

        Empties the backlog instead of spinning on a readable listener; the
        ranks already connected are still watched. Logged once per shortage.
        Returns False if even that failed (another process took the slot).
        """
        if self._shed is None:
            log.warning("out of file descriptors (%s): closing new connections until some are free; "
                        "%d connected ranks are still watched", exc,
                        sum(1 for c in self._connections.values() if c.rank is not None))
            self._shed = 0
        if self._reserve_fd is None:
            return False
        os.close(self._reserve_fd)
        self._reserve_fd = None
        try:
            assert self._listener is not None
            sock, _ = self._listener.accept()
            sock.close()
            self._shed = self._shed + 1
            return True
        except OSError:
            return False
        finally:
            try:
                self._reserve_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass  # tried again at the next shortage

    def _cap_pending(self) -> None:
        """Keep at most MAX_PENDING_HANDSHAKES connections waiting for their Hello: close the oldest."""
        if len(self._pending) <= MAX_PENDING_HANDSHAKES:
            return
        self._pending = {fd: c for fd, c in self._pending.items() if c.rank is None}
        while len(self._pending) > MAX_PENDING_HANDSHAKES:
            oldest = next(iter(self._pending.values()))
            self.reject(oldest, f"too many pending handshakes ({MAX_PENDING_HANDSHAKES}): closing the oldest")

    def reject(self, conn: Connection, reason: str) -> None:
        """Close ``conn`` (a bad peer) for ``reason``; logged and recorded as ``connection_rejected``."""
        # Throttled: a flood of bad connections must not flood the log and the event file too.
        held_back = self._rejections.allow()
        if held_back is not None:
            who = f"rank {conn.rank.rank}" if conn.rank else f"pid {conn.peer_pid}"
            more = f" ({held_back} more rejections not logged before this one)" if held_back else ""
            log.warning("closing connection from %s: %s%s", who, reason, more)
            self._record(ConnectionRejected(pid=conn.peer_pid, reason=reason + more))
        self._drop(conn, log_it=False)
