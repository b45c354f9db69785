"""The client's connection to its monitor: where it is, the job token, the rank, and what a failed handshake says.

With a real monitor: ``tests/integration/ft_core/test_client.py``; here the peer is a socket of this test.
"""

from __future__ import annotations

import secrets
import socket
import threading

import pytest

from ft_core.client_connection import (
    connect,
    env_rank,
    monitor_socket_path,
    read_token,
    send_workload_control,
)
from ft_core.client_errors import LauncherUnavailableError, RankMonitorClientError
from ft_core.data import WorkloadAction, WorkloadControlRequest
from ft_core.jobdir import LAUNCHER_SOCKET_ENV, MONITOR_SOCKET_ENV, TOKEN_ENV, token_path, write_private_file
from ft_core.protocol import Ack, FrameDecoder, Hello, recv_msg, send_msg


def test_the_monitor_socket_comes_from_the_environment_or_the_error_says_how_to_set_it(monkeypatch, tmp_path):
    monkeypatch.delenv(MONITOR_SOCKET_ENV, raising=False)
    with pytest.raises(RankMonitorClientError, match=f"^{MONITOR_SOCKET_ENV} is not set: launch with ft_launcher"):
        monitor_socket_path()
    monkeypatch.setenv(MONITOR_SOCKET_ENV, str(tmp_path / "monitor.sock"))
    assert monitor_socket_path() == str(tmp_path / "monitor.sock")


def test_the_token_is_the_variable_else_the_file_beside_the_socket(monkeypatch, tmp_path):
    socket_path = str(tmp_path / "monitor.sock")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(RankMonitorClientError, match=f"^{TOKEN_ENV} is not set and {token_path(socket_path)} cannot "
                                                     "be read"):
        read_token(socket_path)
    write_private_file(token_path(socket_path), "from-the-file\n")
    assert read_token(socket_path) == "from-the-file"
    monkeypatch.setenv(TOKEN_ENV, "from-the-variable")
    assert read_token(socket_path) == "from-the-variable"


def test_the_rank_is_rank_else_0_without_torch_distributed(monkeypatch):
    monkeypatch.setenv("RANK", "7")
    assert env_rank() == 7
    monkeypatch.delenv("RANK")
    assert env_rank() == 0


def test_workload_control_needs_a_request_and_the_launcher(monkeypatch):
    with pytest.raises(RankMonitorClientError, match="req: expected a WorkloadControlRequest, got 'stop'"):
        send_workload_control("stop")  # type: ignore[arg-type]
    monkeypatch.delenv(LAUNCHER_SOCKET_ENV, raising=False)
    with pytest.raises(LauncherUnavailableError, match=f"^{LAUNCHER_SOCKET_ENV} is not set"):
        send_workload_control(WorkloadControlRequest(WorkloadAction.ShutdownWorkload))


def _connect(socket_path: str):
    return connect(socket_path, FrameDecoder(), token="t0ken", rank=3, timeouts=None, dump_path=None,
                   fallback_config=None, num_warmup_iters=None)


def test_no_monitor_at_the_socket_is_an_error_naming_it(tmp_path):
    with pytest.raises(RankMonitorClientError, match=f"cannot connect to the rank monitor at {tmp_path}/none.sock: "):
        _connect(str(tmp_path / "none.sock"))


def test_a_refused_handshake_gives_the_monitor_s_reason(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    address = f"\0ft-test-client-{secrets.token_hex(8)}"  # abstract socket: no path length limit
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(1)
    seen = []

    def monitor() -> None:
        conn, _ = listener.accept()
        with conn:
            seen.append(recv_msg(conn, FrameDecoder(), 30))
            send_msg(conn, Ack(ok=False, error="wrong token"))

    thread = threading.Thread(target=monitor)
    thread.start()
    try:
        with pytest.raises(RankMonitorClientError, match="^rank monitor refused the handshake: wrong token$"):
            _connect(address)
    finally:
        thread.join(30)
        listener.close()
    (hello,) = seen
    assert isinstance(hello, Hello) and (hello.token, hello.rank, hello.local_rank) == ("t0ken", 3, 1)
