"""The fault tolerance configuration: its fields, their validation and their documentation.

Example::

    >>> from ft_core.config import FaultToleranceConfig
    >>> cfg = FaultToleranceConfig.from_kwargs(rank_heartbeat_timeout="none",
    ...                                         rank_section_timeouts="step:30,checkpointing:none")
    >>> cfg.rank_heartbeat_timeout is None, cfg.rank_section_timeouts
    (True, {'step': 30.0, 'checkpointing': None})

Values are checked and converted by :mod:`ft_core.utils.validation`; a bad one
raises :class:`ConfigError` naming the key, the value and what is allowed.
Where the values come from (a YAML file, ``--ft-<field>`` flags) is
:mod:`ft_core.config_sources`, below this module; the config as loaded, with the
keys the user set, is :mod:`ft_core.config_loading`, above it; which keys a rank
may fill in is :mod:`ft_core.config_fallback`.

NVRx compatibility: a YAML file or keyword arguments written for
nvidia-resiliency-ext load here. With ``ignore_not_recognized=True`` (NVRx's
default) keys that are not ours are skipped, as NVRx does: keys of NVRx's
``FaultToleranceConfig`` that this project does not implement
(:data:`NVRX_ONLY_KEYS`) with one warning listing them, and any other unknown
key with one warning that suggests the known key it resembles ("did you
mean"), since a misspelt timeout would silently not be set. With
``ignore_not_recognized=False`` both are an error.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import os
import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Optional

import msgspec

from ft_core.config_sources import (
    NVRX_ONLY_KEYS,
    ConfigError,
    add_flags,
    flag_values,
    recognized,
    write_yaml,
    yaml_section,
)
from ft_core.protocol import DEFAULT_MAX_FRAME_BYTES, MAX_FRAME_BYTES_LIMIT
from ft_core.straggler_scoring import DEFAULT_MIN_PHASE_SECONDS, DEFAULT_WINDOW, StragglerAction
from ft_core.timeouts import HeartbeatTimeouts, SectionTimeouts
from ft_core.utils.validation import (
    ValidationError,
    boolean,
    convert,
    enum_member,
    int_in_range,
    is_none_word,
    positive_seconds,
    signal_or_none,
)

if TYPE_CHECKING:
    import argparse

# argparse is imported where it is used: the node monitor and every rank import this module but
# never parse flags, and each import costs memory in every process.

__all__ = [
    "FIELD_HELP", "NVRX_ONLY_KEYS", "ConfigError", "FaultToleranceConfig", "LogLevel",
    "checked_value", "parse_log_level", "parse_signal", "timeouts_of",
]


log = logging.getLogger(__name__)


class LogLevel(enum.IntEnum):
    """The level names ``log_level`` accepts (any case), NVRx's aliases ``DBG`` and ``WARN`` included.

    The config holds the level as a plain ``int`` (as NVRx does); a number from
    ``DEBUG`` to ``CRITICAL`` is accepted as well.
    """

    DEBUG = logging.DEBUG
    DBG = logging.DEBUG
    INFO = logging.INFO
    WARNING = logging.WARNING
    WARN = logging.WARNING
    ERROR = logging.ERROR
    CRITICAL = logging.CRITICAL


def _config_error(exc: ValidationError) -> ConfigError:
    return exc if isinstance(exc, ConfigError) else ConfigError(exc.name, exc.value, exc.allowed, exc.problem)


def parse_signal(value: Any, key: str = "rank_termination_signal") -> signal.Signals:
    """Turn ``"SIGKILL"``, ``"kill"``, ``9`` or ``signal.SIGKILL`` into ``signal.Signals``."""
    try:
        return signal_or_none(f"fault_tolerance.{key}", value)
    except ValidationError as exc:
        raise _config_error(exc) from None


def parse_log_level(value: Any, key: str = "fault_tolerance.log_level") -> int:
    """A ``logging`` level number from a name (``"debug"``, ``"WARN"``, ...; see :class:`LogLevel`) or a number.

    Raises:
        ConfigError: naming ``key``, the value and what is allowed.
    """
    try:
        return _log_level(key, value)
    except ValidationError as exc:
        raise _config_error(exc) from None


_LOG_LEVEL_ALLOWED = (
    "a level name (" + ", ".join(LogLevel.__members__) + "; any case) or a number from "
    f"{logging.DEBUG} (DEBUG) to {logging.CRITICAL} (CRITICAL)"
)


def _log_level(name: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().upper() in LogLevel.__members__:
        return int(LogLevel[value.strip().upper()])
    level_type = Annotated[int, msgspec.Meta(ge=logging.DEBUG, le=logging.CRITICAL)]
    return int(convert(name, value, level_type, _LOG_LEVEL_ALLOWED, coerce=True))


# -- signals: which ones can do each job ------------------------------------------------------------

#: Signals that would not end a hung rank that has no handler for them, and why (a predicate of the name).
_NOT_TERMINATING: dict[signal.Signals, str] = {
    **dict.fromkeys((signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH), "is ignored by default"),
    signal.SIGCONT: "continues a process instead of ending it",
    **dict.fromkeys((signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU),
                    "stops a process instead of ending it"),
    **dict.fromkeys((signal.SIGPIPE, signal.SIGXFSZ), "is ignored by every Python process"),
    signal.SIGINT: "becomes KeyboardInterrupt in a Python process, which a rank stuck in C code never "
                   "raises",
}
_TERMINATION_ALLOWED = "a signal whose default action ends a process, e.g. SIGKILL or SIGTERM"

#: Signals a rank's faulthandler cannot or must not catch for a stack dump, and why (a predicate of the name).
_NOT_FOR_DUMPS: dict[signal.Signals, str] = {
    **dict.fromkeys((signal.SIGKILL, signal.SIGSTOP), "cannot be caught"),
    **dict.fromkeys((signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGILL),
                    "is reserved by faulthandler for fatal errors"),
    signal.SIGCONT: "is sent by the monitor to every hung rank before the dump and the termination signal",
    **dict.fromkeys((signal.SIGTERM, signal.SIGINT),
                    "stops workers: a dump handler would keep them running"),
    signal.SIGCHLD: "is delivered whenever a child process (e.g. a data-loader worker) exits",
}
_DUMP_ALLOWED = "a signal a rank can catch and does not otherwise use, e.g. SIGUSR2 or SIGUSR1, or none"
#: The dump signal when none was chosen: the first of these that is not the termination signal.
_AUTO_DUMP_SIGNALS = (signal.SIGUSR2, signal.SIGUSR1)


class _DefaultDumpSignal:
    """``stack_dump_signal``'s default until ``__post_init__`` resolves it (see :data:`_AUTO_DUMP_SIGNALS`).

    Whether the dump signal was chosen decides what a clash with the termination
    signal means (move it, or refuse the config); a default value cannot tell,
    this marker can.
    """

    def __repr__(self) -> str:
        return _AUTO_DUMP_SIGNALS[0].name


_DEFAULT_DUMP_SIGNAL: Any = _DefaultDumpSignal()


def _signal_for(name: str, value: Any, unsuitable: Mapping[signal.Signals, str], allowed: str,
                allow_none: bool) -> Optional[signal.Signals]:
    sig = signal_or_none(name, value, allow_none=allow_none)
    if sig is not None and sig in unsuitable:
        raise ValidationError(name, value, allowed, problem=f"invalid value {value!r}: {sig.name} {unsuitable[sig]}")
    return sig


# -- the other checks ---------------------------------------------------------------------------------

#: Counts travel in msgpack and JSON to every rank: keep them in a range every format holds.
_MAX_COUNT = 2**31 - 1
#: The monitor sleeps at most this long between checks; epoll cannot wait much longer than 24 days.
_MAX_CHECK_INTERVAL = 86400.0


def _section_timeouts(name: str, value: Any) -> dict[str, Optional[float]]:
    """``{"step": 30}`` or the CLI form ``"step:30,checkpointing:none"``; None/"none" = no sections."""
    if is_none_word(value):
        return {}
    if isinstance(value, str):
        if not value.strip():
            raise ValidationError(name, value, "'name:seconds,name:none' pairs, or none for no sections")
        parsed: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in value.split(","))):
            section, sep, seconds = item.partition(":")
            if not sep or not section.strip():
                raise ValidationError(name, value, "a mapping or 'name:seconds,name:none' pairs")
            parsed[section.strip()] = seconds
        value = parsed
    if not isinstance(value, Mapping):
        raise ValidationError(name, value, "a mapping of section name to seconds/none, or 'name:seconds,...'")
    result: dict[str, Optional[float]] = {}
    for section, seconds in value.items():
        if not isinstance(section, str) or not section:
            raise ValidationError(name, section, "section names are non-empty strings")
        result[section] = positive_seconds(f"{name}.{section}", seconds, allow_none=True, coerce=True)
    return result


def _optional_file(name: str, value: Any) -> Optional[str]:
    """A path to a file (which need not exist yet), or None/"none"; never empty, never a directory."""
    if is_none_word(value):
        return None
    allowed = "a file path, or none"
    if not isinstance(value, (str, os.PathLike)):
        raise ValidationError(name, value, allowed)
    path = os.fspath(value)
    if not isinstance(path, str) or not path.strip():
        raise ValidationError(name, value, allowed, problem=f"invalid value {value!r}: empty path")
    if os.path.isdir(path):
        raise ValidationError(name, value, allowed, problem=f"{path!r} is a directory")
    return path


def _seconds(*, allow_none: bool = False, maximum: Optional[float] = None) -> Callable[[str, Any], Any]:
    if maximum is None:
        return functools.partial(positive_seconds, allow_none=allow_none, coerce=True)
    bounded = Annotated[float, msgspec.Meta(gt=0, le=maximum)]
    return functools.partial(convert, type_=bounded, allowed=f"a positive number of seconds up to {maximum:g}",
                             coerce=True)


def _count(minimum: int, maximum: int = _MAX_COUNT) -> Callable[[str, Any], int]:
    return functools.partial(int_in_range, minimum=minimum, maximum=maximum, coerce=True)


def _score_threshold(name: str, value: Any) -> float:
    threshold: float = convert(name, value, Annotated[float, msgspec.Meta(gt=0, le=1)],
                               "a score in (0, 1], e.g. 0.75 (about 33 % slower than typical)", coerce=True)
    return threshold


def _min_phase_seconds(name: str, value: Any) -> float:
    seconds: float = convert(name, value, Annotated[float, msgspec.Meta(ge=0, le=3600)],
                             "a number of seconds from 0 to 3600 (0: only the 5 % of the step floor)", coerce=True)
    return seconds


def _cap_or_none(name: str, value: Any) -> Optional[float]:
    """A factor >= 1 (how many times its timeout a section may run while its rank moves bytes), or none."""
    if is_none_word(value):
        return None
    cap: float = convert(name, value, Annotated[float, msgspec.Meta(ge=1, le=1e6)],
                         "a factor from 1 to 1e6 (times the section's timeout), or none", coerce=True)
    return cap


def _port_or_none(name: str, value: Any) -> Optional[int]:
    """A TCP port (0: any free one), or None/"none" for no endpoint."""
    if is_none_word(value):
        return None
    return int_in_range(name, value, 0, 65535, coerce=True)


#: How each field is checked and converted; values from YAML and the command line arrive as text.
_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "workload_check_interval": _seconds(maximum=_MAX_CHECK_INTERVAL),
    "initial_rank_heartbeat_timeout": _seconds(allow_none=True),
    "rank_heartbeat_timeout": _seconds(allow_none=True),
    "rank_section_timeouts": _section_timeouts,
    "rank_out_of_section_timeout": _seconds(allow_none=True),
    "safety_factor": _seconds(),
    "min_calculated_timeout": _seconds(),
    "rank_termination_signal": functools.partial(
        _signal_for, unsuitable=_NOT_TERMINATING, allowed=_TERMINATION_ALLOWED, allow_none=False),
    "log_level": _log_level,
    "skip_section_response": functools.partial(boolean, coerce=True),
    "install_exception_hook": functools.partial(boolean, coerce=True),
    "num_warmup_iterations": _count(0),
    "stack_dump_signal": functools.partial(
        _signal_for, unsuitable=_NOT_FOR_DUMPS, allowed=_DUMP_ALLOWED, allow_none=True),
    "stack_dump_timeout": _seconds(),
    "max_frame_bytes": _count(4096, MAX_FRAME_BYTES_LIMIT),
    "max_no_progress_cycles": _count(-1),
    "min_progress_iterations": _count(1),
    "max_identical_faults": _count(0),
    "suspect_checkpoint_steps": _count(0),
    "suspect_node_faults": _count(0),
    "checkpoint_iteration_file": _optional_file,
    "straggler_report_interval": _seconds(allow_none=True),
    "straggler_threshold": _score_threshold,
    "straggler_consecutive_reports": _count(1),
    "straggler_window": _count(1, 100_000),
    "straggler_min_phase_seconds": _min_phase_seconds,
    "straggler_action": functools.partial(enum_member, enum_type=StragglerAction, coerce=True),
    "metrics_port": _port_or_none,
    "io_progress_cap": _cap_or_none,
    "compile_timeout": _seconds(allow_none=True),
}

@dataclasses.dataclass
class FaultToleranceConfig:
    """Settings shared by the launcher, the node monitor and every rank's client.

    Timeouts are in seconds; ``None`` disables a timeout. ``rank_section_timeouts``
    lists the sections the monitor tracks: a name mapped to ``None`` is tracked
    (it counts as "in a section") without a deadline; a name that is absent is
    not tracked at all and costs no IPC.

    The config does not record which keys the user set: the loaders return
    them beside it (:class:`ft_core.config_loading.LoadedConfig`), and
    :func:`ft_core.config_fallback.with_fallback` lets exactly those win over
    a rank's fallback values. ``dataclasses.replace`` makes a validated copy.
    """

    #: Upper bound on the monitor's sleep between checks. Detection is
    #: deadline-driven (within ~0.1 s of a deadline), so this only matters for
    #: housekeeping such as noticing a dead parent.
    workload_check_interval: float = 5.0
    #: Time from ``init_workload_monitoring`` to the first heartbeat.
    initial_rank_heartbeat_timeout: Optional[float] = 3600.0
    #: Maximum time between two heartbeats (any section event counts as one).
    rank_heartbeat_timeout: Optional[float] = 2700.0
    #: Section name -> timeout; see the class docstring.
    rank_section_timeouts: dict[str, Optional[float]] = dataclasses.field(default_factory=dict)
    #: Maximum time a rank may spend outside every tracked section.
    rank_out_of_section_timeout: Optional[float] = None
    #: Calculated timeout = max observed interval * safety_factor.
    safety_factor: float = 5.0
    #: Floor for calculated timeouts: a few fast steps must not yield a
    #: deadline that a GC pause or a scheduler hiccup can miss.
    min_calculated_timeout: float = 1.0
    #: Signal the monitor sends to a hung rank (after SIGCONT).
    rank_termination_signal: signal.Signals = signal.SIGKILL
    #: Level of the fault tolerance loggers, a ``logging`` number (names are accepted and converted).
    log_level: int = LogLevel.INFO
    #: Section open/close are one-way messages (no round trip in the step).
    skip_section_response: bool = True
    #: Install a ``sys.excepthook`` that logs and hard-exits the rank, so an
    #: unhandled exception cannot hang interpreter shutdown on live threads.
    install_exception_hook: bool = False
    #: The first N ``step`` sections of each rank connection are timed by a generous warm-up
    #: budget instead of ``step`` (:func:`ft_core.warmup.warmup_step_timeout`), and not used to
    #: learn ``step`` (compilation, allocator and data-loader warm-up).
    num_warmup_iterations: int = 5
    #: Signal on which each rank's faulthandler dumps all stacks; None disables. When it is not set and
    #: rank_termination_signal is SIGUSR2 (valid in NVRx), SIGUSR1 is used, with one warning.
    stack_dump_signal: Optional[signal.Signals] = _DEFAULT_DUMP_SIGNAL
    #: How long the monitor waits for a stack dump before terminating the rank.
    stack_dump_timeout: float = 2.0
    #: Largest accepted IPC frame; bigger frames close the connection.
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: ft_launcher stops the job (exit code ``--ft-no-restart-exit-code``) after this many
    #: consecutive faulty cycles without progress; 0 or -1 disables the rule.
    max_no_progress_cycles: int = 3
    #: A cycle made progress if the latest checkpointed iteration grew by at least this much.
    min_progress_iterations: int = 1
    #: ft_launcher stops the job (``--ft-no-restart-exit-code``) after the same deterministic fault this many
    #: times in a row with no new checkpoint in between (see :mod:`ft_core.fault_policy`); 0 disables.
    max_identical_faults: int = 2
    #: A fault this many steps or fewer after a resume, twice from the same checkpoint, marks it bad (and the
    #: integrations watch the loss for non-finite values this many steps after a resume); 0 disables.
    suspect_checkpoint_steps: int = 10
    #: This many faults in a row on one node, with different fingerprints, make it a suspect: excluded when a
    #: hot spare waits, else named in the restart's cause; 0 disables.
    suspect_node_faults: int = 3
    #: File holding the latest checkpointed iteration (one integer), read by ft_launcher.
    checkpoint_iteration_file: Optional[str] = None
    #: Seconds between straggler reports (see :mod:`ft_core.straggler_scoring`); None disables detection. Costs
    #: nothing while no rank marks phases.
    straggler_report_interval: Optional[float] = 60.0
    #: A rank whose relative score (typical phase median / its median) stays below this is a straggler.
    straggler_threshold: float = 0.75
    #: ... for this many consecutive reports.
    straggler_consecutive_reports: int = 3
    #: Phase durations kept per rank and phase (the rolling window the medians are taken over).
    straggler_window: int = DEFAULT_WINDOW
    #: Phases whose job-wide median is shorter are never scored: at that scale a rank's own work (a
    #: progress bar, a log line) outweighs any difference in speed.
    straggler_min_phase_seconds: float = DEFAULT_MIN_PHASE_SECONDS
    #: What the launchers do about a straggler: report, restart (the cycle) or exclude-node.
    straggler_action: StragglerAction = StragglerAction.REPORT
    #: Port of the launcher's Prometheus endpoint (0: a free port, logged); None: no endpoint.
    metrics_port: Optional[int] = None
    #: A rank past any deadline whose storage I/O progresses (bytes through the regular files it and its
    #: children have open: a save on slow storage), not hung: its deadline is extended while it does, up
    #: to this many times the timeout in total (see :mod:`ft_core.utils.storage_io`). None: no extension.
    io_progress_cap: Optional[float] = 3.0
    #: Seconds one torch.compile (re)compilation may take on a rank. Ranks open a ``compile`` section
    #: while dynamo compiles (:mod:`ft_core.compile_phase`); meanwhile every other deadline of the rank
    #: is paused, so a recompile after learning is not a hung step. None: compilation is not tracked.
    compile_timeout: Optional[float] = 1800.0

    def __post_init__(self) -> None:
        chosen_dump_signal = self.stack_dump_signal is not _DEFAULT_DUMP_SIGNAL
        if not chosen_dump_signal:
            self.stack_dump_signal = _AUTO_DUMP_SIGNALS[0]
        for name in _FIELD_NAMES:
            setattr(self, name, checked_value(name, getattr(self, name)))
        if not chosen_dump_signal:
            self._move_auto_dump_signal()
        if self.stack_dump_signal is not None and self.stack_dump_signal == self.rank_termination_signal:
            # The rank's dump handler would catch the termination signal too: the hung rank would survive.
            raise ConfigError(
                "fault_tolerance.stack_dump_signal", self.stack_dump_signal.name,
                f"a signal other than rank_termination_signal ({self.rank_termination_signal.name}), or none",
                problem=f"{self.stack_dump_signal.name} is also rank_termination_signal: the rank's dump "
                        "handler would catch it and a hung rank would not end",
            )
        object.__setattr__(self, "_auto_dump_signal", not chosen_dump_signal)

    def __setattr__(self, name: str, value: Any) -> None:
        # NVRx's code assigns fields: a termination signal moves the default dump signal as the constructor does.
        object.__setattr__(self, name, value)
        if self.__dict__.get("_auto_dump_signal"):
            if name == "rank_termination_signal":
                self._move_auto_dump_signal()
            elif name == "stack_dump_signal":
                object.__setattr__(self, "_auto_dump_signal", False)

    def _move_auto_dump_signal(self) -> None:
        """Move the default dump signal out of the termination signal's way (NVRx users may terminate with it)."""
        if self.stack_dump_signal == self.rank_termination_signal:
            moved = next(sig for sig in _AUTO_DUMP_SIGNALS if sig != self.rank_termination_signal)
            log.warning("fault_tolerance: rank_termination_signal is %s, the default stack_dump_signal: stack dumps "
                        "use %s instead (set stack_dump_signal to choose another, or none)",
                        self.stack_dump_signal.name, moved.name)
            object.__setattr__(self, "stack_dump_signal", moved)

    @property
    def is_progress_tracking_enabled(self) -> bool:
        """Whether ft_launcher applies the no-progress rule (``max_no_progress_cycles > 0``), as in NVRx."""
        return self.max_no_progress_cycles > 0

    # -- constructors -----------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return list(_FIELD_NAMES)

    @classmethod
    def from_kwargs(cls, ignore_not_recognized: bool = True, **kwargs: Any) -> FaultToleranceConfig:
        """Build from keyword arguments; see :meth:`from_dict` for ``ignore_not_recognized``."""
        return cls.from_dict(kwargs, ignore_not_recognized)

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any], ignore_not_recognized: bool = True) -> FaultToleranceConfig:
        """Build from a mapping of field names to values.

        With ``ignore_not_recognized`` (the default, as in NVRx) keys that are
        not ours are skipped: keys of NVRx's config that this project does not
        implement (:data:`NVRX_ONLY_KEYS`) with one warning, any other with one
        warning naming the known key it resembles. Without it, either is an
        error with a "did you mean" suggestion (:func:`ft_core.config_sources.recognized`).
        """
        known, nvrx_only = recognized(mapping, _FIELD_NAMES, ignore_not_recognized)
        cfg = cls(**known)
        for key, value in nvrx_only.items():  # readable as given (NVRx code reads them back), with no effect here
            setattr(cfg, key, value)
        return cfg

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> FaultToleranceConfig:
        """Build from a mapping of field names to values; every key must be one of ours."""
        return cls.from_dict(mapping, ignore_not_recognized=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-safe dict (signals as names) that ``from_mapping`` reads back."""
        data = dataclasses.asdict(self)
        for key in ("rank_termination_signal", "stack_dump_signal"):
            data[key] = data[key].name if data[key] is not None else None
        data["straggler_action"] = self.straggler_action.value
        return data

    # -- NVRx's loaders: where the values come from is :mod:`ft_core.config_sources` (below this module) --
    @classmethod
    def from_yaml_file(cls, cfg_path: str | os.PathLike[str],
                       ignore_not_recognized: bool = True) -> FaultToleranceConfig:
        """Read the first ``fault_tolerance:`` mapping found at any depth of a YAML file.

        ``ignore_not_recognized`` as in :meth:`from_dict`.

        Raises:
            FileNotFoundError: ``cfg_path`` does not exist (as NVRx).
            ConfigError: the file cannot be read, is not YAML, repeats a key, has no
                ``fault_tolerance:`` mapping, or holds a bad key or value.
        """
        return cls.from_dict(yaml_section(cfg_path), ignore_not_recognized)

    def to_yaml_file(self, path: str | os.PathLike[str]) -> None:
        """Write ``{"fault_tolerance": {...}}`` atomically (temp file + fsync + rename)."""
        write_yaml(self.to_dict(), path)

    @classmethod
    def add_argparse_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add ``--ft-cfg-path`` and one ``--ft-<field>`` flag per field (:func:`ft_core.config_sources.add_flags`)."""
        return add_flags(parser, dataclasses.fields(cls), FIELD_HELP)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FaultToleranceConfig:
        """Merge defaults < YAML (``args.ft_cfg_path``) < ``--ft-<field>`` flags
        (:func:`ft_core.config_loading.load_args` also returns the keys set)."""
        return cls.from_dict(flag_values(args, _FIELD_NAMES))


#: Each field's one-line documentation: the help of its ``--ft-*`` flag.
FIELD_HELP = {
    "workload_check_interval": "monitor housekeeping interval in seconds",
    "initial_rank_heartbeat_timeout": "seconds from init to the first heartbeat, or none",
    "rank_heartbeat_timeout": "max seconds between heartbeats, or none",
    "rank_section_timeouts": "tracked sections, e.g. 'setup:600,step:180,checkpointing:none'",
    "rank_out_of_section_timeout": "max seconds outside every tracked section, or none",
    "safety_factor": "calculated timeout = observed max * safety factor",
    "min_calculated_timeout": "lower bound in seconds for calculated timeouts",
    "rank_termination_signal": "signal sent to a hung rank, e.g. SIGKILL or SIGTERM",
    "log_level": "DEBUG, INFO, WARNING, ERROR or CRITICAL (any case; also DBG, WARN) or a number",
    "skip_section_response": "one-way section messages (true/false)",
    "install_exception_hook": "hard-exit a rank on an unhandled exception (true/false)",
    "num_warmup_iterations": "'step' sections at the start of each rank timed by the warm-up budget, not 'step'",
    "stack_dump_signal": "signal for faulthandler stack dumps, or none",
    "stack_dump_timeout": "seconds to wait for a hung rank's stack dump",
    "max_frame_bytes": "largest accepted IPC frame in bytes",
    "max_no_progress_cycles": "stop after N consecutive faulty cycles without a newer checkpointed iteration; "
                              "0 or -1 disables",
    "min_progress_iterations": "a cycle made progress if the checkpointed iteration grew by at least N",
    "max_identical_faults": "stop after the same exception (type, place, iteration, rank) N times in a row with "
                            "no new checkpoint in between: restarting cannot help; 0 disables",
    "suspect_checkpoint_steps": "a fault within N steps of a resume, twice from the same checkpoint, marks that "
                                "checkpoint bad (the next resume falls back to an older one); the integrations "
                                "watch the loss for NaN for N steps after a resume; 0 disables",
    "suspect_node_faults": "N faults in a row on one node with different fingerprints make it a suspect: it is "
                           "excluded when a hot spare waits, else named in the restart's cause; 0 disables",
    "checkpoint_iteration_file": "file holding the latest checkpointed iteration (one integer); progress signal "
                                 "in addition to RankMonitorClient.report_checkpoint()",
    "straggler_report_interval": "seconds between straggler reports (medians of the ranks' phase durations), or "
                                 "none to disable straggler detection",
    "straggler_threshold": "a rank whose relative score (typical median / its median) stays below this is a "
                           "straggler",
    "straggler_consecutive_reports": "... for this many consecutive reports",
    "straggler_window": "phase durations kept per rank and phase (the window the medians are taken over)",
    "straggler_min_phase_seconds": "a phase whose job-wide median is shorter, or under 5 percent of the step section's, "
                                   "is never scored (0: only the 5 percent floor)",
    "straggler_action": "what to do about a straggler: report, restart (the cycle) or exclude-node",
    "metrics_port": "port of the launcher's Prometheus endpoint (0: any free port, logged), or none "
                    "(needs the 'metrics' extra: prometheus-client)",
    "io_progress_cap": "a deadline of a rank whose storage I/O progresses (its open regular files) may be extended "
                       "up to this many times its timeout; none: never extended",
    "compile_timeout": "seconds one torch.compile (re)compilation may take (other deadlines pause meanwhile), "
                       "or none (not tracked)",
}


def checked_value(name: str, value: Any) -> Any:
    """``value`` of the field ``name`` checked and converted, as the constructor does.

    Raises:
        ConfigError: naming ``fault_tolerance.<name>``, the value and what is allowed.
    """
    try:
        return _CHECKS[name](f"fault_tolerance.{name}", value)
    except ValidationError as exc:
        raise _config_error(exc) from None


_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(FaultToleranceConfig))
assert set(_CHECKS) == set(_FIELD_NAMES), "every field has exactly one check"
assert set(FIELD_HELP) == set(_FIELD_NAMES), "every field has a flag help text"
assert not NVRX_ONLY_KEYS & set(_FIELD_NAMES), "a key is either implemented or NVRx-only"


def timeouts_of(cfg: FaultToleranceConfig) -> tuple[HeartbeatTimeouts, SectionTimeouts]:
    """The timeouts ``cfg`` sets, none calculated: what the monitor times a new connection by, and the
    client starts from (both then overlay the calculated values of a state dict, :func:`apply_calculated`).

    >>> from ft_core.config import FaultToleranceConfig
    >>> timeouts_of(FaultToleranceConfig(rank_section_timeouts={"step": 30}, rank_out_of_section_timeout=60))
    (HeartbeatTimeouts(initial=3600.0, subsequent=2700.0, were_calculated=False), \
SectionTimeouts(section={'step': 30.0}, out_of_section=60.0, calculated_sections=set(), \
is_out_of_section_calculated=False))
    """
    return (HeartbeatTimeouts(cfg.initial_rank_heartbeat_timeout, cfg.rank_heartbeat_timeout),
            SectionTimeouts(dict(cfg.rank_section_timeouts), cfg.rank_out_of_section_timeout))
