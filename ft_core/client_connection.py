"""The round trips of a rank with its node monitor and its launcher: handshake, requests, control requests.

Everything the client (:mod:`ft_core.client`) does on a socket that waits for
an answer: the rank's handshake with its node monitor (:func:`connect`, with
who the rank is and the job token: ``FT_MONITOR_TOKEN``, else the token file
beside the monitor's socket), a blocking request on the open connection
(:func:`round_trip`), and the one-shot workload-control request to
``ft_launcher`` (:func:`send_workload_control`). The one-way hot path is the
client's own, with :mod:`ft_core.client_backlog` behind it.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any, Optional

from ft_core.client_backlog import SendBacklog
from ft_core.client_errors import LauncherUnavailableError, RankMonitorClientError
from ft_core.data import WorkloadControlRequest
from ft_core.jobdir import (
    LAUNCHER_SOCKET_ENV,
    MONITOR_SOCKET_ENV,
    TOKEN_ENV,
    UnsafePathError,
    read_private_file,
    resolve_socket_link,
    token_path,
)
from ft_core.protocol import (
    Ack,
    Frame,
    FrameDecoder,
    Hello,
    HelloAck,
    Message,
    ProtocolError,
    Role,
    WorkloadControl,
    connect_unix,
    recv_msg,
    request,
    send_msg,
)
from ft_core.timeouts_calc import TimeoutsCalc

__all__ = ["REQUEST_TIMEOUT", "Session", "connect", "env_rank", "monitor_socket_path", "read_token", "round_trip",
           "send_workload_control"]

#: Round trips (handshake, timeout updates) give up after this long.
REQUEST_TIMEOUT = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class Session:
    """What a client holds only between init and shutdown, in one object instead of Optional fields.

    The client holds one (``_session``) exactly while it is initialised; a
    method that got it needs no further None checks.
    """

    sock: socket.socket
    #: ``sock.send`` bound once: the hot paths make no attribute lookup on the socket per call.
    send: Callable[[Frame], int]
    #: Learns the timeouts from this connection's heartbeats and sections.
    calc: TimeoutsCalc


def monitor_socket_path() -> str:
    """The node monitor's socket (``FT_RANK_MONITOR_IPC_SOCKET``), or the error that says how to set it.

    A path in a shared directory is our symlink to the socket in the monitor's private job
    directory (:func:`~ft_core.jobdir.link_socket`): the real socket is returned, so that the
    token file and the stack dumps are looked for beside it.
    """
    socket_path = os.environ.get(MONITOR_SOCKET_ENV)
    if not socket_path:
        raise RankMonitorClientError(
            f"{MONITOR_SOCKET_ENV} is not set: launch with ft_launcher, or start a monitor with "
            f"RankMonitorServer.run_in_subprocess(cfg, path) and export {MONITOR_SOCKET_ENV}=path"
        )
    try:
        return resolve_socket_link(socket_path)
    except UnsafePathError as exc:
        raise RankMonitorClientError(f"{MONITOR_SOCKET_ENV}={socket_path}: {exc}") from None


def connect(socket_path: str, decoder: FrameDecoder, *, token: str, rank: int, timeouts: Optional[dict[str, Any]],
            dump_path: Optional[str], fallback_config: Optional[Mapping[str, Any]],
            num_warmup_iters: Optional[int]) -> tuple[socket.socket, HelloAck]:
    """Connect to the monitor at ``socket_path`` and shake hands; the (blocking) socket and the monitor's answer.

    The handshake carries the job ``token``, the rank's place in the job (torchrun's
    environment) and the client's arguments (see ``Hello``).
    """
    hello = Hello(
        token=token, rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", -1)),
        world_size=int(os.environ.get("WORLD_SIZE", -1)),
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
        timeouts=timeouts, dump_path=dump_path,
        fallback_config=dict(fallback_config) if fallback_config else None,
        num_warmup_iters=None if num_warmup_iters is None else int(num_warmup_iters),
    )
    sock: Optional[socket.socket] = None
    try:
        sock = connect_unix(socket_path, REQUEST_TIMEOUT)
        reply = request(sock, decoder, hello, REQUEST_TIMEOUT)
    except (OSError, TimeoutError, ConnectionError, ProtocolError) as exc:
        if sock is not None:
            sock.close()
        raise RankMonitorClientError(
            f"cannot connect to the rank monitor at {socket_path}: {exc}. Is the monitor running, and "
            f"is {TOKEN_ENV} the job's token?"
        ) from exc
    if not isinstance(reply, HelloAck):
        sock.close()
        reason = reply.error if isinstance(reply, Ack) else repr(reply)
        raise RankMonitorClientError(f"rank monitor refused the handshake: {reason}")
    return sock, reply


def round_trip(sock: socket.socket, backlog: SendBacklog, decoder: FrameDecoder, frame: Frame) -> Message:
    """Send ``frame`` after what ``backlog`` holds back and wait for the monitor's answer (blocking, bounded)."""
    with backlog.exclusive():  # the flusher thread must not write while the socket blocks
        try:
            sock.setblocking(True)
            sock.settimeout(REQUEST_TIMEOUT)
            sock.sendall(backlog.held() + frame)
            backlog.clear()
            reply = recv_msg(sock, decoder, REQUEST_TIMEOUT)
        except (OSError, TimeoutError, ConnectionError, ProtocolError) as exc:
            raise RankMonitorClientError(f"rank monitor did not answer: {exc}") from exc
        finally:
            sock.setblocking(False)
    if isinstance(reply, Ack) and not reply.ok:
        raise RankMonitorClientError(f"rank monitor rejected the request: {reply.error}")
    return reply


def send_workload_control(req: WorkloadControlRequest) -> None:
    """Ask ``ft_launcher`` to exclude this node or shut the workload down (``RankMonitorClient``'s request)."""
    if not isinstance(req, WorkloadControlRequest):
        raise RankMonitorClientError(f"req: expected a WorkloadControlRequest, got {req!r}")
    path = os.environ.get(LAUNCHER_SOCKET_ENV)
    if not path:
        raise LauncherUnavailableError(
            f"{LAUNCHER_SOCKET_ENV} is not set: workload control requests need ft_launcher")
    monitor_socket = os.environ.get(MONITOR_SOCKET_ENV, path)
    rank = env_rank()
    decoder = FrameDecoder()
    try:
        with connect_unix(path, REQUEST_TIMEOUT) as sock:
            send_msg(sock, Hello(token=read_token(monitor_socket), rank=rank, role=Role.CONTROL))
            reply = request(sock, decoder, WorkloadControl(req.action.name, req.description, rank),
                            REQUEST_TIMEOUT)
    except (OSError, TimeoutError, ConnectionError, ProtocolError) as exc:
        raise RankMonitorClientError(f"cannot reach the launcher at {path}: {exc}") from exc
    if not (isinstance(reply, Ack) and reply.ok):
        raise RankMonitorClientError(f"the launcher rejected {req.action.name}: {reply!r}")


def env_rank() -> int:
    """This process's global rank: ``RANK``, else torch.distributed's (when initialised), else 0."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def read_token(socket_path: str) -> str:
    """The job token: ``FT_MONITOR_TOKEN``, else the token file beside the monitor's socket."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    try:
        return read_private_file(token_path(socket_path)).strip()
    except OSError as exc:
        raise RankMonitorClientError(
            f"{TOKEN_ENV} is not set and {token_path(socket_path)} cannot be read ({exc}): the job token is "
            "needed to talk to the monitor (ft_launcher sets it for its workers)"
        ) from None
