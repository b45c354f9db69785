"""The workload-control server: a rank's request reaches the agent's queue; a bad one is refused and named.

Floods, descriptor exhaustion and hostile frames are in ``tests/security``; here a client of this test process.
"""

from __future__ import annotations

import os

import pytest

from ft_core.client_connection import send_workload_control
from ft_core.client_errors import RankMonitorClientError
from ft_core.data import WorkloadAction, WorkloadControlRequest
from ft_core.jobdir import LAUNCHER_SOCKET_ENV, MONITOR_SOCKET_ENV, TOKEN_ENV
from ft_core.launcher.control import ControlRequest, WorkloadControlServer
from ft_core.protocol import Ack, FrameDecoder, Hello, Role, WorkloadControl, connect_unix, request, send_msg

TOKEN = "t0ken-" + "c" * 10


@pytest.fixture
def server(tmp_path, monkeypatch):
    server = WorkloadControlServer(str(tmp_path / "launcher.sock"), TOKEN, 1 << 20)
    monkeypatch.setenv(LAUNCHER_SOCKET_ENV, server.socket_path)
    monkeypatch.delenv(MONITOR_SOCKET_ENV, raising=False)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv("RANK", "5")
    yield server
    server.close()


def test_a_rank_s_queuedis_queued_for_the_agent_once(server):
    assert os.stat(server.socket_path).st_mode & 0o777 == 0o600
    assert server.pop() is None
    send_workload_control(WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "ECC errors"))
    queued = server.pop()
    assert isinstance(queued, ControlRequest)
    assert (queued.action, queued.description, queued.rank) == (WorkloadAction.ExcludeThisNode, "ECC errors", 5)
    assert server.pop() is None


def test_a_queuedwith_the_wrong_token_is_dropped_unanswered(server, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "not-the-token")
    with pytest.raises(RankMonitorClientError, match=f"cannot reach the launcher at {server.socket_path}"):
        send_workload_control(WorkloadControlRequest(WorkloadAction.ShutdownWorkload))
    assert server.pop() is None


def test_an_unknown_action_is_refused_with_the_allowed_ones(server):
    with connect_unix(server.socket_path, 30) as sock:
        send_msg(sock, Hello(token=TOKEN, rank=0, role=Role.CONTROL))
        reply = request(sock, FrameDecoder(), WorkloadControl("Explode", "", 0), 30)
    assert reply == Ack(ok=False, error="unknown action 'Explode'; allowed: Continue, ExcludeThisNode, "
                                        "ShutdownWorkload")
    assert server.pop() is None


def test_closing_removes_the_socket(tmp_path):
    server = WorkloadControlServer(str(tmp_path / "launcher.sock"), TOKEN, 1 << 20)
    server.close()
    assert not os.path.exists(server.socket_path)
