"""SendBacklog: what a rank's full socket buffer held back, and the thread that flushes it.

One job: the client's one-way frames (heartbeats, section events, checkpoint
and phase reports) never block a training step and are never lost to a full
socket buffer. What the socket could not take is held back here, in order;
heartbeats are coalesced (only the latest one waits, with the latest
iteration); a small daemon thread sends what was held back as soon as the
monitor makes room -- not at the rank's next call, which may be minutes away.

The client's hot path (``RankMonitorClient.send_heartbeat``) sends on its own
and comes here only when :attr:`SendBacklog.congested` is set or the socket
did not take the whole frame; it reads that flag without the lock.

Example (what the client does, on a non-blocking connected socket ``sock``)::

    backlog = SendBacklog()
    backlog.start(sock, owner="rank 0")
    sent = sock.send(frame)                    # the hot path sends itself...
    if sent != len(frame):
        backlog.hold_back(frame[sent:], heartbeat=False)   # ...and hands over the rest
    leftover = backlog.stop()                  # at shutdown: the thread ends, leftover is sent blocking
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

from ft_core.protocol import Frame

__all__ = ["SendBacklog"]

log = logging.getLogger("ft_core.client")

#: While frames are held back, the flusher thread retries at least this often (ms), even
#: when the socket does not report room (Unix sockets report it only when 3/4 empty).
_FLUSH_POLL_MS = 50


class SendBacklog:
    """The held-back one-way bytes of one client connection, flushed in order by a background thread.

    Everything but :attr:`congested` (read lock-free by the hot path) is
    touched under one lock, shared with the flusher thread.

    Attributes:
        congested: something is held back, or the monitor is lost: senders take the slow path
            (:meth:`hold_back`) so that the order is kept.
        lost: the connection failed; everything later is dropped (the launcher notices a dead monitor).
        coalesced: heartbeats that found the buffer full and were folded into a later write
            (over every connection of the client).
    """

    def __init__(self) -> None:
        self.congested = False
        self.lost = False
        self.coalesced = 0
        self._sock: Optional[socket.socket] = None
        self._owner = ""
        self._unsent = bytearray()  # one-way bytes the socket could not take yet, in order
        self._pending_hb: Optional[bytes] = None  # the latest heartbeat coalesced while congested
        self._lock = threading.Lock()
        self._flush_wanted = threading.Condition(self._lock)
        self._flusher: Optional[threading.Thread] = None
        self._closing = False

    def start(self, sock: socket.socket, owner: str) -> None:
        """A new connection (non-blocking ``sock``); ``owner`` names the rank in the lost-connection error."""
        with self._lock:
            self._sock, self._owner = sock, owner
            self._unsent.clear()
            self._pending_hb = None
            self.congested = self.lost = self._closing = False

    def hold_back(self, frame: Frame, heartbeat: bool) -> None:
        """The slow path: queue a copy of ``frame`` (or make it the pending heartbeat) and have it flushed."""
        with self._lock:
            if self.lost:
                return
            if heartbeat:
                self._pending_hb = bytes(frame)  # the latest heartbeat replaces an older pending one
                self.coalesced += 1
            else:
                self._unsent += frame
            self.congested = True
            self._flush_locked()
            if self.congested and self._sock is not None:
                if self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush_in_background, args=(self._sock,),
                                                     name="ft-client-flush", daemon=True)
                    self._flusher.start()
                self._flush_wanted.notify()

    def lose(self, exc: OSError) -> None:
        """The connection failed (``exc``): drop what is held back and everything sent later."""
        with self._lock:
            self._lose_locked(exc)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Keep the flusher off the socket while the caller blocks on it (a round trip).

        Inside, the caller sends :meth:`held` before its own frame, then calls :meth:`clear`.
        """
        with self._lock:
            yield

    def held(self) -> bytes:
        """Everything held back, in order (the pending heartbeat last); only inside :meth:`exclusive`."""
        return bytes(self._unsent) + (self._pending_hb or b"")

    def clear(self) -> None:
        """What :meth:`held` returned was sent; only inside :meth:`exclusive`."""
        self._unsent.clear()
        self._pending_hb = None
        self.congested = False

    def stop(self) -> bytes:
        """End the flusher thread and the connection; returns the held-back section bytes to send blocking.

        A pending heartbeat is dropped: the goodbye that follows says more.
        """
        with self._lock:
            self._closing = True
            self._flush_wanted.notify()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        with self._lock:
            unsent = bytes(self._unsent)
            self._unsent.clear()
            self._pending_hb = None
            self._sock = None
        return unsent

    # -- internals (lock held) -------------------------------------------
    def _flush_locked(self) -> None:
        """Send what the socket takes: held-back bytes first, in order, then the pending heartbeat."""
        sock = self._sock
        if sock is None:  # shut down: nothing more goes out
            return
        try:
            if self._unsent:
                del self._unsent[:sock.send(self._unsent)]
            if not self._unsent and self._pending_hb is not None:
                frame = self._pending_hb
                sent = sock.send(frame)
                self._pending_hb = None
                self._unsent += frame[sent:]
        except BlockingIOError:
            pass
        except OSError as exc:
            self._lose_locked(exc)
            return
        self.congested = bool(self._unsent) or self._pending_hb is not None

    def _lose_locked(self, exc: OSError) -> None:
        # Losing the monitor must not become a new way for training to fail;
        # the launcher notices a dead monitor and restarts the cycle.
        self.lost = True
        self.congested = True  # every later send takes the slow path, which drops it
        self._unsent.clear()
        self._pending_hb = None
        log.error("%s lost its rank monitor connection (%s); hang detection is off for this rank", self._owner, exc)

    def _flush_in_background(self, sock: socket.socket) -> None:
        """Flusher thread: send what a full buffer held back as soon as the monitor makes room."""
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        while True:
            with self._lock:
                while not self.congested and not self._closing:
                    self._flush_wanted.wait()
                if self._closing or self.lost:
                    return
            poller.poll(_FLUSH_POLL_MS)  # room in the buffer, or time to retry (outside the lock)
            with self._lock:
                if not self._closing:
                    self._flush_locked()
