"""The monitor's defences, with real Unix sockets in this process: accept, the kernel's pid, the handshake cap.

The floods, the descriptor exhaustion and hostile frames against a running monitor are in ``tests/security``.
"""

from __future__ import annotations

import itertools
import os
import secrets
import selectors
import socket

import pytest

from ft_core.config import FaultToleranceConfig
from ft_core.events import ConnectionRejected
from ft_core.monitor import defences
from ft_core.monitor.defences import Connection, Defences


class Guarded:
    """A listener guarded by :class:`Defences`, with the server's table, selector, event log and drops."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.address = f"\0ft-test-defences-{secrets.token_hex(8)}"  # abstract: no file, no path length limit
        self.listener.bind(self.address)
        self.listener.listen(16)
        self.listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.connections: dict[int, Connection] = {}
        self.records: list = []
        self.dropped: list[tuple[Connection, bool]] = []
        self.peers: list[socket.socket] = []
        self.clock = itertools.count()
        self.defences = Defences(FaultToleranceConfig(), "test.sock", self.selector, self.connections,
                                 lambda: float(next(self.clock)), self.records.append, self._drop)
        self.defences.open(self.listener)

    def _drop(self, conn: Connection, log_it: bool = True) -> None:
        self.dropped.append((conn, log_it))
        self.connections.pop(conn.sock.fileno(), None)
        self.selector.unregister(conn.sock)
        self.defences.forget(conn.sock.fileno())
        conn.sock.close()

    def connect(self, count: int) -> None:
        for _ in range(count):
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            peer.connect(self.address)
            self.peers.append(peer)

    def close(self) -> None:
        self.defences.close()
        for conn in list(self.connections.values()):
            conn.sock.close()
        for peer in self.peers:
            peer.close()
        self.selector.close()
        self.listener.close()


@pytest.fixture
def guarded():
    guarded = Guarded()
    yield guarded
    guarded.close()


def test_accepted_connections_are_registered_with_the_pid_the_kernel_gives(guarded):
    guarded.connect(2)
    guarded.defences.accept()
    assert [conn.accepted_at for conn in guarded.connections.values()] == [0.0, 1.0]  # the server's clock
    for fileno, conn in guarded.connections.items():
        assert conn.peer_pid == os.getpid()  # SO_PEERCRED: not what the peer claims
        assert conn.rank is None
        assert guarded.selector.get_key(fileno).data is conn
    guarded.defences.accept()  # nothing waiting: returns at once
    assert len(guarded.connections) == 2


def test_beyond_the_cap_of_pending_handshakes_the_oldest_is_rejected_and_recorded(guarded, monkeypatch):
    monkeypatch.setattr(defences, "MAX_PENDING_HANDSHAKES", 2)
    guarded.connect(3)
    guarded.defences.accept()
    assert len(guarded.connections) == 2
    ((oldest, log_it),) = guarded.dropped
    assert not log_it and oldest.accepted_at == 0.0  # the first accepted
    ((record,),) = [guarded.records]
    assert isinstance(record, ConnectionRejected) and record.pid == os.getpid()
    assert record.reason == "too many pending handshakes (2): closing the oldest"


def test_a_connection_forgotten_or_past_its_handshake_no_longer_counts(guarded, monkeypatch):
    monkeypatch.setattr(defences, "MAX_PENDING_HANDSHAKES", 2)
    guarded.connect(2)
    guarded.defences.accept()
    first, second = guarded.connections.values()
    guarded.defences.forget(first.sock.fileno())  # closed by the server
    second.rank = object()  # type: ignore[assignment]  # said Hello: no longer pending
    guarded.connect(2)
    guarded.defences.accept()
    assert guarded.dropped == [] and len(guarded.connections) == 4


def test_close_gives_the_reserve_descriptor_back(guarded):
    reserve = guarded.defences._reserve_fd
    assert reserve is not None and os.fstat(reserve)
    guarded.defences.close()
    assert guarded.defences._reserve_fd is None
    with pytest.raises(OSError):
        os.fstat(reserve)
