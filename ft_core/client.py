"""RankMonitorClient: runs inside each training rank and reports liveness to the node monitor.

Example (the monitor is started by ``ft_launcher``, or by hand)::

    from ft_core.client import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()          # reads FT_RANK_MONITOR_IPC_SOCKET
    for step in range(steps):
        client.start_section("step"); train_step(); client.end_section("step")
        client.send_heartbeat()
    client.calculate_and_set_section_timeouts(skip_if_not_ready=True)  # before saving: the save keeps them
    checkpoint["ft"] = client.state_dict()
    client.shutdown_workload_monitoring()

Heartbeats and section events are one-way writes on a non-blocking socket:
a stalled monitor never blocks a training step. What a full socket buffer
holds back is queued (heartbeats coalesced) and flushed in order by a small
background thread: :class:`~ft_core.client_backlog.SendBacklog`.

The per-call paths (``send_heartbeat``, ``start_section``, ``end_section``) are kept at about one
``send`` syscall: frames are encoded once, a new iteration is patched into them (an IterationFrame),
the socket's ``send`` is bound once, the Megatron iteration source is resolved once (at init, or at
the first call after Megatron-LM set its args), timeout learning sees a heartbeat only when its gap
is a new largest one, and nothing is allocated when the socket takes the whole frame.
"""

from __future__ import annotations

import copy
import logging
import numbers
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Optional

from ft_core.client_backlog import SendBacklog
from ft_core.client_connection import (
    REQUEST_TIMEOUT,
    Session,
    connect,
    env_rank,
    monitor_socket_path,
    read_token,
    round_trip,
    send_workload_control,
)
from ft_core.client_errors import LauncherUnavailableError, RankMonitorClientError
from ft_core.client_hooks import StackDump, install_exception_hook, install_report_hook
from ft_core.compile_phase import CompileWatch
from ft_core.config import FaultToleranceConfig, timeouts_of
from ft_core.data import WorkloadAction, WorkloadControlRequest
from ft_core.fault_policy import exception_name, user_frames

# The job's environment variables, importable from here since before ft_core.jobdir had them.
from ft_core.jobdir import LAUNCHER_SOCKET_ENV as LAUNCHER_SOCKET_ENV
from ft_core.jobdir import MONITOR_SOCKET_ENV as MONITOR_SOCKET_ENV
from ft_core.jobdir import TOKEN_ENV as TOKEN_ENV
from ft_core.learning_rules import floor_out_of_section, learns_startup, section_learning
from ft_core.megatron_args import (
    megatron_args,
    megatron_global_vars,
    megatron_iteration,
    resolved_megatron_args,
)
from ft_core.protocol import (
    EndAllSections,
    Frame,
    FrameDecoder,
    Goodbye,
    Heartbeat,
    IterationFrame,
    Message,
    PhaseTime,
    ProtocolError,
    ReportCheckpoint,
    ReportException,
    SectionEnd,
    SectionStart,
    UpdateTimeouts,
    encode,
    request,
)
from ft_core.straggler_scoring import check_phase_sample
from ft_core.timeouts import (
    COMPILE_SECTION,
    CURRENT_TIMEOUTS_KEY,
    HeartbeatTimeouts,
    InvalidTimeoutsError,
    JobLife,
    SectionTimeouts,
    apply_calculated,
    job_life_from_state_dict,
    timeouts_from_state_dict,
    timeouts_state_dict,
)
from ft_core.timeouts_calc import TimeoutsCalc, TimeoutsNotReadyError

__all__ = [
    "LauncherUnavailableError",
    "RankMonitorClient",
    "RankMonitorClientError",
    "WorkloadAction",
    "WorkloadControlRequest",
]

log = logging.getLogger("ft_core.client")

_SEND_BUFFER_BYTES = 1 << 20
_monotonic = time.monotonic


class RankMonitorClient:
    """The rank side of fault tolerance (API and semantics of NVRx's ``RankMonitorClient``).

    One client per process, used from one thread at a time (like a torch process group handle); the hot paths take no lock.

    Attributes:
        cfg: the :class:`FaultToleranceConfig` received from the monitor at init.
        hb_timeouts: heartbeat timeouts in force (config, loaded or calculated); None before init.
        section_timeouts: section timeouts in force; None before init.
        is_initialized: True between init and shutdown.
    """

    #: The key of :meth:`state_dict` (NVRx's name for it).
    CURRENT_TIMEOUTS_STATE_KEY = CURRENT_TIMEOUTS_KEY

    def __init__(self) -> None:
        self.cfg: Optional[FaultToleranceConfig] = None
        self.hb_timeouts: Optional[HeartbeatTimeouts] = None
        self.section_timeouts: Optional[SectionTimeouts] = None
        #: The job-life maxima (loaded, then updated by every calculation): no calculation goes below them.
        self.job_life = JobLife()
        self.is_initialized = False
        self.rank: Optional[int] = None
        self._loaded_state: Optional[dict[str, Any]] = None
        self._resumed = False  # a checkpoint's state was loaded: start-up may be learned (ft_core.learning_rules)
        #: The connection and the learning, between init and shutdown (None otherwise: the hot paths' init check).
        self._session: Optional[Session] = None
        self._decoder = FrameDecoder()
        #: What a full socket buffer held back; the hot path reads only its ``congested`` flag.
        self._backlog = SendBacklog()
        self._open: set[str] = set()
        self._tracked: frozenset[str] = frozenset()
        #: Opens COMPILE_SECTION while torch.compile compiles (installed at init when compile_timeout is set).
        self._compile_watch = CompileWatch(lambda: self._mark_compile(True), lambda: self._mark_compile(False))
        #: The last heartbeat's time, and the largest gap TimeoutsCalc has seen (-1 until it has one):
        #: a heartbeat consults TimeoutsCalc only when its gap is a new largest one (see send_heartbeat).
        self._hb_last = 0.0
        self._hb_max_gap = -1.0
        #: Section events wait for the monitor's Ack (``skip_section_response=False``).
        self._section_replies = False
        self._iteration: Optional[int] = None
        #: Megatron's global args, read for the iteration when set_iteration() was never called; a
        #: PendingMegatronArgs until Megatron-LM sets them; None without Megatron-LM (the hot paths' check).
        self._megatron_args: Any = None
        self._hb_frames = IterationFrame(Heartbeat())
        self._end_frames: dict[str, bytes] = {}
        self._start_frames: dict[str, IterationFrame] = {}
        self._stack_dump = StackDump()

    @property
    def coalesced_heartbeats(self) -> int:
        """Heartbeats that found the buffer full and were folded into a later write."""
        return self._backlog.coalesced

    # -- lifecycle --------------------------------------------------------
    def init_workload_monitoring(
        self,
        num_warmup_iters: Optional[int] = None,
        fallback_config: Optional[dict[str, Any]] = None,
    ) -> None:
        """Connect to the node monitor named by ``FT_RANK_MONITOR_IPC_SOCKET`` and start being watched.

        Args:
            num_warmup_iters: warm-up iterations for this rank (NVRx's argument;
                Megatron-LM passes it): overrides the monitor's
                ``num_warmup_iterations`` for this connection. During the first
                N iterations a ``step`` section is timed by the ``warmup``
                section's timeout when one is configured, and is untimed
                otherwise. None keeps the monitor's value.
            fallback_config: timeout settings (``FaultToleranceConfig`` keys such as
                ``rank_section_timeouts``) for the keys the launcher's user did
                not set (no ``--ft-*`` flag, not in ``--ft-cfg-path``), so a
                training config can drive a launcher started without
                ``--ft-cfg-path``. Values set at launch always win, even when
                they equal the defaults.
        """
        if self.is_initialized:
            raise RankMonitorClientError("init_workload_monitoring() was already called; call "
                                         "shutdown_workload_monitoring() before initializing again")
        if num_warmup_iters is not None and (
                isinstance(num_warmup_iters, bool) or not isinstance(num_warmup_iters, numbers.Integral)
                or num_warmup_iters < 0):
            raise RankMonitorClientError(
                f"num_warmup_iters: invalid value {num_warmup_iters!r}; allowed: an integer >= 0, or None "
                "(the monitor's num_warmup_iterations)")
        socket_path = monitor_socket_path()
        token = read_token(socket_path)  # before anything is created: without it nothing can work
        self.rank = env_rank()
        # Learned values travel to the monitor in the handshake: loaded ones, or,
        # when re-initializing after a shutdown, the ones this client learned.
        carried = self._loaded_state if self._loaded_state is not None else self._calculated_state()
        dump_path = self._stack_dump.open(socket_path, self.rank)
        try:
            sock, reply = connect(socket_path, self._decoder, token=token, rank=self.rank, timeouts=carried,
                                  dump_path=dump_path, fallback_config=fallback_config, num_warmup_iters=num_warmup_iters)
        except RankMonitorClientError:
            self._stack_dump.close()
            raise
        self.cfg = FaultToleranceConfig.from_mapping(reply.config)
        self.hb_timeouts, self.section_timeouts = timeouts_of(self.cfg)
        if carried is not None:
            self.hb_timeouts, self.section_timeouts = apply_calculated(self.hb_timeouts, self.section_timeouts, carried)
        self._loaded_state = None
        self._tracked = self._tracked_sections()
        calc = TimeoutsCalc(self.cfg.safety_factor, num_warmup_iterations=self.cfg.num_warmup_iterations,
                            min_timeout=self.cfg.min_calculated_timeout, sections=self._tracked,
                            job_life=self.job_life)
        self._hb_last, self._hb_max_gap = calc.start_time, -1.0
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER_BYTES)
        sock.setblocking(False)
        self._section_replies = not self.cfg.skip_section_response
        self._megatron_args = megatron_args()
        self._backlog.start(sock, f"rank {self.rank}")
        self._stack_dump.register(self.cfg.stack_dump_signal)
        install_report_hook(self)
        if self.cfg.install_exception_hook:
            install_exception_hook()
        self._session = Session(sock, sock.send, calc)  # set with is_initialized: the hot paths check this one
        self.is_initialized = True
        self._watch_compiles()
        log.debug("rank %d connected to the rank monitor at %s", self.rank, socket_path)

    def shutdown_workload_monitoring(self, training_finished: bool = False) -> None:
        """Say goodbye to the monitor (it will not kill this rank) and disconnect. Idempotent.

        Args:
            training_finished: this rank reports that training is complete (``max_steps`` or
                ``max_epochs`` reached, the final save done). Once every rank of the job reported
                it, ``ft_launcher`` treats a worker that fails afterwards (a crash at interpreter
                exit) as a warning and exits 0 instead of restarting a finished job. Never pass it
                on a time limit or a failure: the job would not be requeued.
        """
        if not self.is_initialized:
            return
        self.is_initialized = False
        unsent = self._backlog.stop()
        session, self._session = self._session, None
        assert session is not None
        sock = session.sock
        try:
            sock.setblocking(True)
            sock.settimeout(REQUEST_TIMEOUT)
            if not self._backlog.lost:
                sock.sendall(unsent)
                request(sock, self._decoder, Goodbye(training_finished=bool(training_finished)), REQUEST_TIMEOUT)
        except (OSError, TimeoutError, ConnectionError, ProtocolError) as exc:
            log.warning("rank monitor did not confirm the shutdown: %s", exc)
        finally:
            self._open.clear()
            sock.close()
            self._stack_dump.unregister()
            self._compile_watch.remove()

    # -- liveness ---------------------------------------------------------
    def send_heartbeat(self) -> None:
        """Tell the monitor this rank is alive (one ``send``; never blocks)."""
        session = self._session
        if session is None:
            raise RankMonitorClientError("send_heartbeat() needs init_workload_monitoring() first")
        now = _monotonic()
        if now - self._hb_last > self._hb_max_gap:
            self._learn_heartbeat_gap(session.calc, now)  # the first heartbeats, then only a new largest gap
        self._hb_last = now
        iteration = self._iteration if self._megatron_args is None else self._current_iteration()
        frame = self._hb_frames.frame(iteration)  # patched in place: the backlog copies what must wait
        backlog = self._backlog
        if backlog.congested:  # something is held back, or the monitor is lost
            backlog.hold_back(frame, heartbeat=True)
            return
        # _send_oneway inlined (one call less per step: this path is measured against a raw send).
        try:
            sent = session.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            backlog.lose(exc)
            return
        if sent != len(frame):
            # Not sent at all: coalesced into the next write; partly sent: the rest must follow.
            backlog.hold_back(frame[sent:], heartbeat=sent == 0)

    def start_section(self, section: str) -> None:
        """Open ``section``; sections may nest and overlap, but not be opened twice.

        As in NVRx, a section not named in ``rank_section_timeouts`` is ignored (no message, no check):
        instrumented code runs unchanged under any config."""
        session = self._session
        if session is None:
            raise RankMonitorClientError("start_section() needs init_workload_monitoring() first")
        if section not in self._tracked:
            return
        if section in self._open:
            raise RankMonitorClientError(f"section {section!r} is already open; end it before starting it again")
        self._open.add(section)
        iteration = self._iteration if self._megatron_args is None else self._current_iteration()
        session.calc.update_on_section_start(section, _monotonic(), iteration)
        if section not in self._start_frames:
            self._start_frames[section] = IterationFrame(SectionStart(section))
        self._send_state(self._start_frames[section].frame(iteration))

    def _tracked_sections(self) -> frozenset[str]:
        """The configured sections, and ``compile`` when ``compile_timeout`` times it."""
        assert self.cfg is not None and self.section_timeouts is not None
        compiling = {COMPILE_SECTION} if self.cfg.compile_timeout is not None else set()
        return frozenset(self.section_timeouts.section) | compiling

    def _mark_compile(self, started: bool) -> None:
        """From torch.compile's callbacks (see :mod:`ft_core.compile_phase`)."""
        if not self.is_initialized or (COMPILE_SECTION in self._open) == started:
            return
        (self.start_section if started else self.end_section)(COMPILE_SECTION)

    def end_section(self, section: str) -> None:
        """Close ``section``; a tracked section must be open, an untracked one is ignored."""
        session = self._session
        if session is None:
            raise RankMonitorClientError("end_section() needs init_workload_monitoring() first")
        if section not in self._tracked:
            return
        if section not in self._open:
            raise RankMonitorClientError(f"section {section!r} is not open; start_section({section!r}) first")
        self._open.discard(section)
        session.calc.update_on_section_end(section, _monotonic())
        frame = self._end_frames.get(section)
        if frame is None:
            frame = self._end_frames[section] = encode(SectionEnd(section))
        self._send_state(frame)

    def end_all_sections(self) -> None:
        """Close every open section; does nothing when none is open."""
        session = self._require_init("end_all_sections")
        tracked_open = sorted(self._open)
        for section in tracked_open:
            session.calc.update_on_section_end(section)
        self._open.clear()
        if tracked_open:
            self._send_state(encode(EndAllSections()))

    # -- straggler detection ----------------------------------------------
    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Time a rank-local phase (no collective inside: data fetch, forward...) for straggler detection.

        ``with client.timed("forward"): loss = model(batch)`` sends one small
        one-way message when the block ends (not when it raises). Nothing is
        sent while straggler detection is off (``straggler_report_interval``
        none). See :mod:`ft_core.straggler_scoring` for why a phase must not contain a
        collective.
        """
        started = time.monotonic()
        yield
        self.record_phase(phase, time.monotonic() - started)

    def record_phase(self, phase: str, seconds: float) -> None:
        """Report that ``phase`` took ``seconds`` (what :meth:`timed` sends; for phases timed elsewhere)."""
        self.record_phases(((phase, seconds),))

    def record_phases(self, samples: Iterable[tuple[str, float]]) -> None:
        """Report ``(phase, seconds)`` samples in one ``send`` (a message each); a bad one raises, none is sent."""
        self._require_init("record_phase")
        frames = []
        for phase, seconds in samples:
            problem = check_phase_sample(phase, seconds)
            if problem is not None:
                raise RankMonitorClientError(f"record_phase: {problem}")
            frames.append(encode(PhaseTime(phase, float(seconds))))
        if frames and self.cfg is not None and self.cfg.straggler_report_interval is not None:
            self._send_oneway(b"".join(frames))

    def set_iteration(self, iteration: Optional[int]) -> None:
        """The training iteration reported with later heartbeats and sections."""
        self._iteration = iteration
        self._watch_compiles()  # a model compiled after init: before its first compilation

    def report_exception(self, exc: BaseException) -> None:
        """Tell the monitor which exception this rank is failing with (type, innermost user frames, iteration).

        Call it where the failure is caught, before the rank disconnects (the Lightning
        callback does in ``on_exception``; the client's own exception hook does for an
        exception nobody caught). The launcher builds the fault's fingerprint from it,
        so a deterministic fault (the same exception at the same place and iteration,
        from the same checkpoint) stops the job instead of spending every restart. One
        small one-way message; a client that is not connected sends nothing.
        """
        if not self.is_initialized or self._backlog.lost:
            return
        report = ReportException(exception_name(exc), user_frames(exc.__traceback__), self._current_iteration())
        try:
            self._send_state(encode(report))
        except RankMonitorClientError:
            pass  # failing already: the fingerprint is a bonus, the exception is what matters

    def report_checkpoint(self, iteration: int) -> None:
        """Report the latest iteration saved in a checkpoint (the launcher's progress signal)."""
        self._require_init("report_checkpoint")
        self._send_state(encode(ReportCheckpoint(int(iteration))))

    # -- timeouts ---------------------------------------------------------
    def calculate_and_set_hb_timeouts(self, skip_if_not_ready: bool = False, calc_initial: Optional[bool] = None) -> bool:
        """Learn heartbeat timeouts from observed intervals (a collective across ranks).

        ``calc_initial`` None: the ``initial`` timeout is learned only in a run that loaded a checkpoint's
        state (a fresh start's says nothing about a resume's). False when skipped (``skip_if_not_ready``).
        """
        session = self._require_init("calculate_and_set_hb_timeouts")
        assert self.hb_timeouts is not None
        initial = learns_startup(self._resumed) if calc_initial is None else calc_initial
        try:
            new = session.calc.calculate_hb_timeouts(self.hb_timeouts, skip_if_not_ready, initial)
        except TimeoutsNotReadyError as exc:
            raise RankMonitorClientError(str(exc)) from None
        if new is None:
            return False
        self.hb_timeouts = new
        self._send_timeouts()
        return True

    def calculate_and_set_section_timeouts(
        self,
        selected_sections: Optional[list[str]] = None,
        calc_out_of_section: Optional[bool] = None,
        skip_if_not_ready: bool = False,
    ) -> bool:
        """Learn section timeouts (a collective; False when nothing was, with ``skip_if_not_ready``).

        Defaults (None, :mod:`ft_core.learning_rules`): every tracked section (``setup`` only once a checkpoint's
        state was loaded); out of section (the stretch still running counts) only if set at launch, never below it.
        """
        session = self._require_init("calculate_and_set_section_timeouts")
        assert self.section_timeouts is not None and self.cfg is not None
        learnable = frozenset(self.section_timeouts.section)  # "compile" has its own timeout: not learned
        plan = section_learning(learnable, selected_sections, calc_out_of_section, resumed=self._resumed,
                                launch_value=self.cfg.rank_out_of_section_timeout)
        unknown = sorted(set(plan.sections) - learnable)
        if unknown:
            raise RankMonitorClientError(
                f"selected_sections: {unknown} are not tracked; tracked sections come from "
                f"rank_section_timeouts: {sorted(learnable)}"
            )
        try:
            new = session.calc.calculate_section_timeouts(
                self.section_timeouts, plan.sections, plan.out_of_section, skip_if_not_ready)
        except TimeoutsNotReadyError as exc:
            raise RankMonitorClientError(str(exc)) from None
        if new is None:
            return False
        self.section_timeouts = floor_out_of_section(new, plan.out_of_section_floor)
        self._send_timeouts()
        return True

    def state_dict(self) -> dict[str, Any]:
        """NVRx's ``{"current_timeouts": {...}}``: JSON-safe, identical on all ranks after a calculation.

        Holds only what was calculated: ``{"current_timeouts": {}}`` until then,
        ``"heartbeat"`` and ``"section"`` once they were, with ``"job_life"``: the largest
        interval of each phase the job observed over its life (:class:`~ft_core.timeouts.JobLife`),
        which no later calculation goes below. Before init, what :meth:`load_state_dict` loaded.
        """
        if not self.is_initialized and self._loaded_state is not None:
            return copy.deepcopy(self._loaded_state)
        return timeouts_state_dict(self.hb_timeouts, self.section_timeouts, self.job_life)

    def _calculated_state(self) -> Optional[dict[str, Any]]:
        state = timeouts_state_dict(self.hb_timeouts, self.section_timeouts, self.job_life)
        return state if state[CURRENT_TIMEOUTS_KEY] else None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore learned timeouts, e.g. from a checkpoint saved by this client or by NVRx's.

        Any subset of ``current_timeouts`` loads (``{}``, ``heartbeat`` or ``section`` alone); only
        calculated values apply. Before init they are sent with the handshake, after init at once. A
        state without ``current_timeouts`` is ignored (``{}``, a fresh start's, silently; others with a
        warning); one with it makes the run a resume (start-up is learned). A malformed value (string,
        NaN, infinity, <= 0, wrong type) raises :class:`RankMonitorClientError` naming it, and nothing
        is loaded.
        """
        if isinstance(state, Mapping) and CURRENT_TIMEOUTS_KEY not in state:
            if state:  # ``{}`` is a fresh start's ``ckpt.get("ft_state", {})``: nothing to load, nothing wrong
                log.warning("load_state_dict: the state has no %r key (keys: %s); nothing loaded",
                            CURRENT_TIMEOUTS_KEY, sorted(map(str, state)))
            return
        try:
            hb, sections = timeouts_from_state_dict(state)
            job_life = job_life_from_state_dict(state)
        except InvalidTimeoutsError as exc:
            raise RankMonitorClientError(f"load_state_dict: {exc}; nothing was loaded") from None
        # By maximum, in place (a live TimeoutsCalc holds it): what the job has seen is never forgotten.
        self.job_life.merge(job_life)
        self._resumed = True
        loaded = timeouts_state_dict(hb, sections, self.job_life)
        if not self.is_initialized:
            # Partial states accumulate until init, as NVRx's loaded heartbeat/section timeouts do.
            previous = self._loaded_state[CURRENT_TIMEOUTS_KEY] if self._loaded_state else {}
            self._loaded_state = {CURRENT_TIMEOUTS_KEY: {**previous, **loaded[CURRENT_TIMEOUTS_KEY]}}
            return
        assert self.hb_timeouts is not None and self.section_timeouts is not None
        self.hb_timeouts, self.section_timeouts = apply_calculated(self.hb_timeouts, self.section_timeouts, loaded)
        self._tracked = self._tracked_sections()
        self._send_timeouts()

    # -- workload control -------------------------------------------------
    def send_workload_control_request(self, req: WorkloadControlRequest) -> None:
        """Ask ``ft_launcher`` to exclude this node or shut the workload down."""
        send_workload_control(req)

    # -- internals --------------------------------------------------------
    def _require_init(self, what: str) -> Session:
        """The session, or the error that names ``what`` needs init first."""
        session = self._session
        if session is None:
            raise RankMonitorClientError(f"{what}() needs init_workload_monitoring() first")
        return session

    def _current_iteration(self) -> Optional[int]:
        """The iteration: ``set_iteration``'s, else Megatron-LM's ``curr_iteration`` (or ``iteration``, as NVRx)."""
        if self._iteration is not None or self._megatron_args is None:
            return self._iteration
        return self._get_current_iteration()

    # NVRx's own (private) names of its Megatron-LM lookup: code and tests written against NVRx's client read them.
    _workload_global_vars_module = property(lambda self: megatron_global_vars())
    _cached_workload_args = property(lambda self: resolved_megatron_args(self._megatron_args))

    def _can_report_iterations(self) -> bool:
        return megatron_global_vars() is not None

    def _get_current_iteration(self) -> Optional[int]:
        """Megatron-LM's iteration (None without Megatron-LM or before it set its args); looked up once found."""
        if self._megatron_args is None:
            self._megatron_args = megatron_args()  # before init too, as NVRx's client finds it at construction
            if self._megatron_args is None:
                return None
        self._megatron_args, iteration = megatron_iteration(self._megatron_args)
        return iteration

    def _learn_heartbeat_gap(self, calc: TimeoutsCalc, now: float) -> None:
        """Give TimeoutsCalc a heartbeat whose gap may be a new maximum (the first ones always are).

        Heartbeats with smaller gaps cannot change what TimeoutsCalc learns (the first delay and the
        largest gap), so the hot path skips it and only keeps the last heartbeat's time, handed over here.
        """
        if calc.last_hb_time is not None:
            calc.last_hb_time = self._hb_last
        calc.update_on_heartbeat(now)
        self._hb_max_gap = -1.0 if calc.max_hb_interval is None else calc.max_hb_interval

    def _send_oneway(self, frame: Frame) -> None:
        """Send a section or checkpoint frame without blocking; what the socket cannot take is held back.

        ``send_heartbeat`` has its own inlined copy of this, which coalesces a heartbeat not sent at all.
        """
        session, backlog = self._session, self._backlog
        if backlog.congested or session is None:  # held back (keep the order), lost, or shut down
            backlog.hold_back(frame, heartbeat=False)
            return
        try:
            sent = session.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            backlog.lose(exc)
            return
        if sent != len(frame):
            backlog.hold_back(frame[sent:], heartbeat=False)  # a frame begun must be completed

    def _send_state(self, frame: Frame) -> None:
        """Section/checkpoint events: never dropped; a round trip if the config asks for replies."""
        if self._section_replies and not self._backlog.lost:
            self._round_trip_raw(frame)
        else:
            self._send_oneway(frame)

    def _round_trip_raw(self, frame: Frame) -> Message:
        session = self._session
        assert session is not None, "every caller checked the client is initialised"
        return round_trip(session.sock, self._backlog, self._decoder, frame)

    def _watch_compiles(self) -> None:
        """Time torch.compile's compilations as ``compile`` once dynamo is imported (never import it)."""
        if COMPILE_SECTION in self._tracked:
            self._compile_watch.install()

    def _send_timeouts(self) -> None:
        self._watch_compiles()  # learned timeouts from now on: a recompile must not count as a step
        if not self._backlog.lost:
            self._round_trip_raw(encode(UpdateTimeouts(self.state_dict())))
