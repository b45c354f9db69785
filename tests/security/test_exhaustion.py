"""Out of file descriptors (EMFILE) and floods of idle connections: the monitor and the launcher's
control server keep serving, and a hang is still caught.

The servers run in subprocesses whose ``RLIMIT_NOFILE`` is lowered by ``preexec_fn``;
the test then opens more connections than they have descriptors for.
"""

from __future__ import annotations

import functools
import json
import logging
import resource
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from helpers import python_env, wait_for
from security_helpers import TOKEN, closed_by_peer

from ft_core.config_loading import load_mapping
from ft_core.data import WorkloadAction
from ft_core.event_file import read_events
from ft_core.jobdir import JobDir
from ft_core.launcher import control
from ft_core.launcher.control import WorkloadControlServer
from ft_core.monitor.spawn import MonitorProcess
from ft_core.protocol import Ack, FrameDecoder, Hello, Role, WorkloadControl, connect_unix, recv_msg, send_msg
from ft_core.utils import procutil

pytestmark = pytest.mark.timeout(90)

#: Descriptors of the monitor: ~12 for itself and two ranks, the rest for the flood. Below
#: MAX_PENDING_HANDSHAKES, so that descriptors run out before the cap on pending handshakes applies.
MONITOR_FD_LIMIT = 40
#: The control server needs ~8 for itself; below 8 + MAX_PENDING_REQUESTS for the same reason.
CONTROL_FD_LIMIT = 20
FLOOD = 150


def _limit_fds(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    procutil.die_with_parent()


def _flood(path: str, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(path)
        except BlockingIOError:  # the backlog is full: the connection is refused, not queued
            sock.close()
            continue
        socks.append(sock)
    return socks


@pytest.fixture
def limited_monitor(tmp_path):
    job = JobDir(str(tmp_path / "job")).create()
    cfg = load_mapping({"initial_rank_heartbeat_timeout": 60, "rank_heartbeat_timeout": 1.0,
                        "stack_dump_timeout": 0.5})
    log = open(tmp_path / "monitor.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "ft_core.monitor", "--socket", job.monitor_socket,
                             "--config-json", cfg.to_json()], env=python_env(FT_MONITOR_TOKEN=TOKEN),
                            stdout=subprocess.PIPE, stderr=log, preexec_fn=functools.partial(_limit_fds, MONITOR_FD_LIMIT))
    monitor = MonitorProcess(proc, job.monitor_socket, TOKEN, job.monitor_events)
    try:
        monitor.wait_ready(30)
        yield monitor
    finally:
        monitor.stop()
        log.close()


def test_the_monitor_survives_emfile_and_still_catches_a_hang(limited_monitor, ranks, tmp_path):
    monitor = limited_monitor
    stop = tmp_path / "stop_rank_1"
    healthy = ranks(monitor, "heartbeat_forever", rank=0)
    hanging = ranks(monitor, "heartbeat_forever", rank=1, extra=["--stop-file", str(stop)])
    flood = _flood(monitor.socket_path, FLOOD)
    try:
        # More connections than descriptors: the monitor closes the ones it has no room for.
        wait_for(lambda: any(closed_by_peer(s, 0.01) for s in flood), 30, "the monitor to shed connections")
        assert monitor.is_alive()
        stop.touch()  # rank 1 stops heartbeating while the monitor is out of descriptors
        hanging.wait(30)
        assert hanging.returncode == -signal.SIGKILL
    finally:
        for sock in flood:
            sock.close()
    events = read_events(monitor.events_path)[0]
    assert [(e["rank"], e["reason"]) for e in events if e["event"] == "hang_detected"] == [(1, "heartbeat")]
    assert monitor.is_alive() and healthy.poll() is None
    # Descriptors are free again: new ranks connect and are watched.
    ranks(monitor, "heartbeat_forever", rank=2)
    assert monitor.is_alive() and healthy.poll() is None
    # One warning when descriptors ran out, one when they came back: not one per refused connection.
    log = (tmp_path / "monitor.log").read_text()
    assert log.count("out of file descriptors") == 1 and log.count("available again") == 1, log


CONTROL_SERVER = """
import json, sys, time
from ft_core.launcher.control import WorkloadControlServer
server = WorkloadControlServer(sys.argv[1], sys.argv[2], 1 << 20)
print("ready", flush=True)
while True:
    request = server.pop()
    if request is not None:
        print(json.dumps({"action": request.action.name, "rank": request.rank}), flush=True)
    time.sleep(0.02)
"""


def _control_request(path: str, rank: int, timeout: float = 10.0) -> Ack:
    with connect_unix(path, timeout) as sock:  # the flood's connections may still fill the accept queue
        send_msg(sock, Hello(token=TOKEN, rank=rank, role=Role.CONTROL))
        send_msg(sock, WorkloadControl(WorkloadAction.ShutdownWorkload.name, "test", rank))
        reply = recv_msg(sock, FrameDecoder(), timeout)
    assert isinstance(reply, Ack)
    return reply


def test_the_control_server_survives_emfile(tmp_path):
    path = str(JobDir(str(tmp_path / "job")).create().launcher_socket)
    log = open(tmp_path / "control.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CONTROL_SERVER), path, TOKEN],
                            env=python_env(), stdout=subprocess.PIPE, stderr=log, text=True,
                            preexec_fn=functools.partial(_limit_fds, CONTROL_FD_LIMIT))
    try:
        assert proc.stdout.readline().strip() == "ready"
        flood = _flood(path, FLOOD)
        try:
            wait_for(lambda: b"out of file descriptors" in (tmp_path / "control.log").read_bytes(), 30,
                     "the control server to run out of descriptors")
        finally:
            for sock in flood:
                sock.close()
        assert proc.poll() is None
        # Its accept loop is still alive: a real request is answered and queued for the agent.
        assert _control_request(path, rank=5).ok
        assert json.loads(proc.stdout.readline()) == {"action": "ShutdownWorkload", "rank": 5}
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        log.close()


def test_the_control_server_caps_pending_connections_by_dropping_the_oldest(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="ft_core.launcher")
    path = str(JobDir(str(tmp_path / "job")).create().launcher_socket)
    server = WorkloadControlServer(path, TOKEN, 1 << 20)
    extra = 3
    socks = []
    try:
        for _ in range(control.MAX_PENDING_REQUESTS + extra):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            socks.append(sock)
        assert all(closed_by_peer(sock, 10) for sock in socks[:extra])
        assert "too many pending" in caplog.text  # evicted, not timed out
        for sock in socks[extra:]:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
        assert _control_request(path, rank=2).ok
        request = wait_for(server.pop, 10, "the queued request")
        assert (request.action, request.rank) == (WorkloadAction.ShutdownWorkload, 2)
    finally:
        for sock in socks:
            sock.close()
        server.close()
