"""MessageHandlers on a real Unix socket pair: the handshake admits or refuses, each message does its one thing.

The monitor with real rank processes: ``tests/integration/ft_core/monitor/test_server.py``; hostile peers:
``tests/security/test_socket_input.py``.
"""

from __future__ import annotations

import os
import socket

import msgspec
import pytest

from ft_core.config import FaultToleranceConfig
from ft_core.config_loading import LoadedConfig
from ft_core.events import CheckpointReported, RankConnected, TimeoutsUpdated
from ft_core.jobdir import LAUNCHER_SOCKET_ENV
from ft_core.monitor.defences import Connection
from ft_core.monitor.handlers import MessageHandlers
from ft_core.protocol import (
    Ack,
    Goodbye,
    Heartbeat,
    Hello,
    HelloAck,
    ProtocolError,
    ReportCheckpoint,
    SectionEnd,
    SectionStart,
    UpdateTimeouts,
    WorkloadControl,
    recv_msg,
)
from ft_core.protocol import FrameDecoder as Decoder
from ft_core.straggler_scoring import PhaseWindows

TOKEN = "job-secret"
STACKS = "/run/job/stacks"


class Monitor:
    """The handlers with what the server would give them: a recorder, and a drop that remembers."""

    def __init__(self, cfg: FaultToleranceConfig, explicit_keys: frozenset[str] = frozenset()) -> None:
        self.events: list = []
        self.dropped: list[Connection] = []
        self.disconnected: list[int] = []
        self.handlers = MessageHandlers(LoadedConfig(cfg, explicit_keys), TOKEN.encode(), STACKS, PhaseWindows(), self.events.append,
                                        lambda conn, log_it=True: self.dropped.append(conn),
                                        lambda conn, rank: self.disconnected.append(rank.rank))


@pytest.fixture
def pair():
    """(the monitor's end as a Connection, the peer's socket, the peer's decoder)."""
    monitor_end, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield Connection(monitor_end, 1 << 20, accepted_at=0.0), peer, Decoder(1 << 20)
    monitor_end.close()
    peer.close()


def _same(recorded, expected) -> bool:
    """The same event but for the time it was stamped with."""
    return msgspec.structs.replace(recorded, time=expected.time) == expected


def _hello(**fields) -> Hello:
    return Hello(**{"token": TOKEN, "rank": 3, "local_rank": 1, "restart_count": 2, **fields})


def test_a_valid_hello_admits_the_rank_with_the_kernels_pid_and_replies_with_its_config(pair):
    conn, peer, decoder = pair
    monitor = Monitor(FaultToleranceConfig(rank_heartbeat_timeout=7.0))
    monitor.handlers.handle(conn, _hello(dump_path=f"{STACKS}/rank3.txt"), now=5.0)
    reply = recv_msg(peer, decoder, 10)
    assert isinstance(reply, HelloAck) and reply.config["rank_heartbeat_timeout"] == 7.0
    assert conn.rank is not None and (conn.rank.rank, conn.rank.pid, conn.rank.connected_at) == (3, os.getpid(), 5.0)
    assert len(monitor.events) == 1
    assert _same(monitor.events[0], RankConnected(rank=3, local_rank=1, pid=os.getpid(), restart_count=2))


@pytest.mark.parametrize(("first", "message"), [
    (Heartbeat(), "expected Hello first, got Heartbeat"),
    (Hello(token="not-the-job's", rank=0), "wrong job token"),
])
def test_a_connection_that_does_not_open_with_the_jobs_hello_is_refused_without_a_reply(pair, first, message):
    conn, peer, _ = pair
    monitor = Monitor(FaultToleranceConfig())
    with pytest.raises(ProtocolError, match=message):
        monitor.handlers.handle(conn, first, now=0.0)
    assert conn.rank is None and not monitor.events
    peer.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing told to an unauthenticated peer
        peer.recv(1)


@pytest.mark.parametrize(("hello", "message"), [
    (_hello(dump_path="relative.txt"), "invalid dump_path 'relative.txt' from rank 3: it must be an absolute path"),
    (_hello(dump_path="/tmp/elsewhere.txt"), "directly inside the job's stacks directory /run/job/stacks"),
    (_hello(dump_path=f"{STACKS}/../x.txt"), "directly inside the job's stacks directory"),
    (_hello(dump_path=f"{STACKS}/a\0b"), "NUL byte"),
    (_hello(fallback_config={"rank_section_timeouts": {"step": -1}}), "invalid config request from rank 3"),
    (_hello(timeouts={"heartbeat": {}}), "invalid timeouts from rank 3"),
])
def test_a_rank_with_a_bad_dump_path_config_or_timeouts_is_told_why_and_refused(pair, hello, message):
    conn, peer, decoder = pair
    monitor = Monitor(FaultToleranceConfig())
    with pytest.raises(ProtocolError, match=message):
        monitor.handlers.handle(conn, hello, now=0.0)
    reply = recv_msg(peer, decoder, 10)
    assert isinstance(reply, Ack) and not reply.ok and message.split(":")[0] in reply.error
    assert conn.rank is None and not monitor.events


def test_the_ranks_warmup_count_wins_and_fallback_values_fill_only_what_the_launch_did_not_set(pair):
    conn, peer, decoder = pair
    monitor = Monitor(FaultToleranceConfig(rank_heartbeat_timeout=50.0), frozenset({"rank_heartbeat_timeout"}))
    monitor.handlers.handle(conn, _hello(num_warmup_iters=4, fallback_config={
        "rank_heartbeat_timeout": 5.0, "initial_rank_heartbeat_timeout": 6.0}), now=0.0)
    assert isinstance(recv_msg(peer, decoder, 10), HelloAck)
    cfg = conn.rank.cfg
    assert (cfg.num_warmup_iterations, cfg.rank_heartbeat_timeout, cfg.initial_rank_heartbeat_timeout) == (4, 50.0, 6.0)


def test_heartbeats_and_sections_touch_the_rank_and_sections_are_acked_only_when_asked(pair):
    conn, peer, decoder = pair
    monitor = Monitor(FaultToleranceConfig(skip_section_response=False, rank_section_timeouts="step:60"))
    monitor.handlers.handle(conn, _hello(), now=0.0)
    recv_msg(peer, decoder, 10)
    monitor.handlers.handle(conn, Heartbeat(iteration=11), now=1.0)
    assert (conn.rank.last_activity, conn.rank.iteration, conn.rank.first_iteration) == (1.0, 11, 11)
    monitor.handlers.handle(conn, SectionStart("step", iteration=12), now=2.0)
    assert recv_msg(peer, decoder, 10) == Ack()
    assert list(conn.rank.open_sections) == ["step"]
    monitor.handlers.handle(conn, SectionEnd("step"), now=3.0)
    assert recv_msg(peer, decoder, 10) == Ack()
    assert not conn.rank.open_sections and conn.rank.last_activity == 3.0
    peer.setblocking(False)
    with pytest.raises(BlockingIOError):  # the heartbeat got no reply
        peer.recv(1)


def test_updated_timeouts_apply_and_are_recorded_and_bad_ones_refused(pair):
    conn, peer, decoder = pair
    monitor = Monitor(FaultToleranceConfig())
    monitor.handlers.handle(conn, _hello(), now=0.0)
    recv_msg(peer, decoder, 10)
    state = {"current_timeouts": {"heartbeat": {"initial": 11.0, "subsequent": 12.0, "were_calculated": True}}}
    monitor.handlers.handle(conn, UpdateTimeouts(state), now=1.0)
    assert recv_msg(peer, decoder, 10) == Ack()
    assert (conn.rank.hb.initial, conn.rank.hb.subsequent) == (11.0, 12.0)
    assert _same(monitor.events[-1], TimeoutsUpdated(rank=3, timeouts=state))
    with pytest.raises(ProtocolError, match="invalid timeouts from rank 3"):
        monitor.handlers.handle(conn, UpdateTimeouts({"heartbeat": {}}), now=2.0)
    assert not recv_msg(peer, decoder, 10).ok


def test_a_checkpoint_report_is_recorded_and_workload_control_is_sent_to_the_launcher(pair):
    conn, peer, decoder = pair
    monitor = Monitor(FaultToleranceConfig())
    monitor.handlers.handle(conn, _hello(), now=0.0)
    recv_msg(peer, decoder, 10)
    monitor.handlers.handle(conn, ReportCheckpoint(iteration=42), now=1.0)
    assert _same(monitor.events[-1], CheckpointReported(rank=3, iteration=42))
    monitor.handlers.handle(conn, WorkloadControl(action="exclude_this_node"), now=1.0)
    reply = recv_msg(peer, decoder, 10)
    assert not reply.ok and LAUNCHER_SOCKET_ENV in reply.error


def test_a_goodbye_records_the_disconnect_before_its_ack_and_drops_the_connection(pair):
    conn, peer, decoder = pair
    monitor = Monitor(FaultToleranceConfig())
    monitor.handlers.handle(conn, _hello(), now=0.0)
    recv_msg(peer, decoder, 10)
    monitor.handlers.handle(conn, Goodbye(training_finished=True), now=1.0)
    assert recv_msg(peer, decoder, 10) == Ack()
    assert (conn.graceful, conn.training_finished) == (True, True)
    assert monitor.disconnected == [3] and monitor.dropped == [conn]
