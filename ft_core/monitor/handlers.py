"""What the node monitor does with each message a peer sends: one handler per message type.

:meth:`MessageHandlers.handle` dispatches with ``match``. A connection's first
message must be a valid :class:`~ft_core.protocol.Hello` (the handshake: job
token, role, the rank's config and timeouts, its dump path); it makes the
connection a :class:`~ft_core.monitor.watched_rank.WatchedRank`. The heartbeat,
by far the most frequent message, is handled first and inline, before the ``match``.

A handler raises :class:`~ft_core.protocol.ProtocolError` for a message the
monitor refuses; the server then closes that connection alone.

This module must not import torch: the monitor imports it.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import os
from collections.abc import Callable
from typing import NoReturn, Optional

from ft_core.config import timeouts_of
from ft_core.config_fallback import with_fallback
from ft_core.config_loading import LoadedConfig
from ft_core.events import (
    CheckpointReported,
    Event,
    RankConnected,
    RankException,
    TimeoutsUpdated,
)
from ft_core.jobdir import LAUNCHER_SOCKET_ENV
from ft_core.monitor.defences import Connection, Drop
from ft_core.monitor.watched_rank import WatchedRank
from ft_core.protocol import (
    Ack,
    EndAllSections,
    Goodbye,
    Heartbeat,
    Hello,
    HelloAck,
    Message,
    PhaseTime,
    ProtocolError,
    ReportCheckpoint,
    ReportException,
    Role,
    SectionEnd,
    SectionStart,
    UpdateTimeouts,
    WorkloadControl,
    check_exception_report,
    encode,
)
from ft_core.straggler_scoring import MAX_PHASES_PER_RANK, STEP_PHASE, PhaseWindows, check_phase_sample
from ft_core.timeouts import apply_calculated, describe_timeouts

__all__ = ["MessageHandlers"]

log = logging.getLogger("ft_core.monitor")


class MessageHandlers:
    """Handles the messages of the monitor's connections; see the module docstring.

    Args:
        launched: the monitor's config and the keys set at launch (a rank's own config is completed from
            it in the handshake: its fallback values fill in the other keys).
        token: the job secret every connection must present first.
        dump_dir: the job's stacks directory, where a rank's dump file must be.
        phases: straggler detection's phase durations per rank (the server closes their report rounds).
        record: writes an event to the monitor's event log.
        drop: the server's way to close a connection.
        record_disconnect: records a rank's ``rank_disconnected`` event.
    """

    def __init__(
        self,
        launched: LoadedConfig,
        token: bytes,
        dump_dir: str,
        phases: PhaseWindows,
        record: Callable[[Event], None],
        drop: Drop,
        record_disconnect: Callable[[Connection, WatchedRank], None],
    ) -> None:
        self.launched = launched
        self.cfg = launched.cfg
        self._token = token
        self.dump_dir = dump_dir
        self._phases = phases
        self._record = record
        self._drop = drop
        self._record_disconnect = record_disconnect
        #: The last timeouts logged at INFO: all ranks send the same values, at every calculation.
        self._logged_timeouts: Optional[str] = None

    def handle(self, conn: Connection, msg: Message, now: float) -> None:
        """Act on ``msg`` from ``conn`` at ``now`` (the monitor's clock); ProtocolError: close the connection."""
        rank = conn.rank
        if rank is None:
            self._handshake(conn, msg, now)
            return
        # The heartbeat, by far the most frequent message, is first and inline, and tested before the match:
        # on CPython 3.11 a class pattern costs ~60 ns more than isinstance (measured), on every heartbeat.
        if isinstance(msg, Heartbeat):
            rank.touch(now, msg.iteration)
            return
        match msg:  # the frequent messages first
            case SectionStart():
                self._section_start(conn, rank, msg, now)
            case SectionEnd():
                self._section_end(conn, rank, msg, now)
            case PhaseTime():  # one per timed phase and step while straggler detection runs
                self._phase_time(rank, msg, now)
            case EndAllSections():
                self._end_all_sections(conn, rank, now)
            case UpdateTimeouts():
                self._update_timeouts(conn, rank, msg)
            case ReportCheckpoint():
                self._report_checkpoint(rank, msg)
            case ReportException():
                self._report_exception(rank, msg)
            case Goodbye():
                self._goodbye(conn, rank, msg)
            case WorkloadControl():
                self._workload_control(conn)
            case _:
                raise ProtocolError(f"unexpected message {type(msg).__name__}")

    # -- one handler per message type ---------------------------------------
    def _handshake(self, conn: Connection, msg: Message, now: float) -> None:
        """Hello: admit the connection as a rank, or refuse it (wrong token or role, invalid config, timeouts
        or dump path)."""
        if not isinstance(msg, Hello):
            raise ProtocolError(f"expected Hello first, got {type(msg).__name__}")
        if not hmac.compare_digest(msg.token.encode(), self._token):
            raise ProtocolError("wrong job token")
        if msg.role is not Role.RANK:
            raise ProtocolError(f"role {msg.role!r} is not served by the rank monitor")
        try:
            cfg = with_fallback(self.launched, msg.fallback_config) if msg.fallback_config else self.cfg
            if msg.num_warmup_iters is not None:  # NVRx: the rank's value wins (validated by the config)
                cfg = dataclasses.replace(cfg, num_warmup_iterations=msg.num_warmup_iters)
        except ValueError as exc:
            self._refuse(conn, f"invalid config request from rank {msg.rank}: {exc}")
        hb, sections = timeouts_of(cfg)
        if msg.timeouts:
            try:
                hb, sections = apply_calculated(hb, sections, msg.timeouts)
            except ValueError as exc:
                self._refuse(conn, f"invalid timeouts from rank {msg.rank}: {exc}")
        if msg.dump_path is not None:
            problem = _dump_path_problem(msg.dump_path, self.dump_dir)
            if problem is not None:
                self._refuse(conn, f"invalid dump_path {msg.dump_path!r} from rank {msg.rank}: {problem}")
        pid = conn.peer_pid if conn.peer_pid > 0 else -1
        conn.rank = WatchedRank(
            rank=msg.rank, local_rank=msg.local_rank, pid=pid, cfg=cfg, restart_count=msg.restart_count,
            connected_at=now, hb=hb, sections=sections, dump_path=msg.dump_path,
        )
        self._reply(conn, HelloAck(config=cfg.to_dict()))
        self._record(RankConnected(rank=msg.rank, local_rank=msg.local_rank, pid=pid,
                                   restart_count=msg.restart_count))
        log.debug("rank %d (pid %d) connected", msg.rank, pid)

    def _section_start(self, conn: Connection, rank: WatchedRank, msg: SectionStart, now: float) -> None:
        rank.section_start(msg.name, now, msg.iteration)
        self._ack_section(conn)

    def _section_end(self, conn: Connection, rank: WatchedRank, msg: SectionEnd, now: float) -> None:
        if not rank.section_end(msg.name, now):
            log.debug("rank %d closed section %r that was not open", rank.rank, msg.name)
        elif (msg.name == STEP_PHASE and self.cfg.straggler_report_interval is not None
              and rank.last_step_seconds is not None):
            # The reference of straggler detection's relative floor (never scored itself).
            self._phases.add(rank.rank, STEP_PHASE, rank.last_step_seconds)
        self._ack_section(conn)

    def _end_all_sections(self, conn: Connection, rank: WatchedRank, now: float) -> None:
        rank.end_all_sections(now)
        self._ack_section(conn)

    def _update_timeouts(self, conn: Connection, rank: WatchedRank, msg: UpdateTimeouts) -> None:
        try:
            rank.hb, rank.sections = apply_calculated(rank.hb, rank.sections, msg.state)
        except ValueError as exc:
            self._refuse(conn, f"invalid timeouts from rank {rank.rank}: {exc}")
        self._record(TimeoutsUpdated(rank=rank.rank, timeouts=msg.state))
        # All ranks send the same synchronized values, at every calculation: log each change once.
        text = describe_timeouts(rank.hb, rank.sections)
        log.log(logging.INFO if text != self._logged_timeouts else logging.DEBUG, "timeouts: %s", text)
        self._logged_timeouts = text
        self._reply(conn, Ack())

    def _phase_time(self, rank: WatchedRank, msg: PhaseTime, now: float) -> None:
        problem = check_phase_sample(msg.name, msg.seconds)
        if problem is not None:
            raise ProtocolError(f"rank {rank.rank}: {problem}")
        rank.touch(now)
        if not self._phases.add(rank.rank, msg.name, msg.seconds):
            log.debug("rank %d marks more than %d phases: %r is not scored", rank.rank, MAX_PHASES_PER_RANK,
                      msg.name)

    def _report_checkpoint(self, rank: WatchedRank, msg: ReportCheckpoint) -> None:
        self._record(CheckpointReported(rank=rank.rank, iteration=msg.iteration))

    def _report_exception(self, rank: WatchedRank, msg: ReportException) -> None:
        problem = check_exception_report(msg)
        if problem is not None:
            raise ProtocolError(f"rank {rank.rank}: {problem}")
        first = msg.iteration if rank.first_iteration is None else rank.first_iteration
        self._record(RankException(rank=rank.rank, pid=rank.pid, exception_type=msg.exception_type,
                                   frames=list(msg.frames), iteration=msg.iteration, first_iteration=first))

    def _goodbye(self, conn: Connection, rank: WatchedRank, msg: Goodbye) -> None:
        conn.graceful, conn.training_finished = True, msg.training_finished
        log.debug("rank %d ends monitoring%s", rank.rank, " (training finished)" if msg.training_finished else "")
        # Recorded before the Ack: the rank may exit, even fail at exit, right after it, and the
        # launcher must already find the record when it sees that exit.
        self._record_disconnect(conn, rank)
        try:
            conn.sock.send(encode(Ack()))
        except OSError:
            pass  # the rank is gone already: it said goodbye, there is nothing more to tell it
        self._drop(conn, log_it=False)

    def _workload_control(self, conn: Connection) -> None:
        self._reply(conn, Ack(ok=False, error=f"workload control requests go to {LAUNCHER_SOCKET_ENV}"))

    # -- helpers ----------------------------------------------------------
    def _refuse(self, conn: Connection, error: str) -> NoReturn:
        """Tell the peer why (its integration or checkpoint is at fault), then close only its connection."""
        self._reply(conn, Ack(ok=False, error=error))
        raise ProtocolError(error)

    def _ack_section(self, conn: Connection) -> None:
        if conn.rank is not None and not conn.rank.cfg.skip_section_response:
            self._reply(conn, Ack())

    def _reply(self, conn: Connection, msg: Message) -> None:
        try:
            conn.sock.send(encode(msg))
        except OSError:
            # A peer that does not read its replies is broken; only it is dropped.
            self._drop(conn)


def _dump_path_problem(path: str, stacks: str) -> Optional[str]:
    """Why ``path`` cannot be a rank's dump file (None if it can): an absolute file path in the job's ``stacks``."""
    if "\0" in path:
        return "it holds a NUL byte"
    if not os.path.isabs(path):
        return f"it must be an absolute path, a file directly inside {stacks}"
    if os.path.normpath(path) != path or os.path.dirname(path) != stacks:
        return f"it must be a file directly inside the job's stacks directory {stacks}"
    return None
