"""Fault tolerance configuration: defaults < YAML file < ``--ft-<field>`` CLI flags.

Example::

    >>> from ft_core.config import FaultToleranceConfig
    >>> cfg = FaultToleranceConfig.from_kwargs(rank_heartbeat_timeout="none",
    ...                                         rank_section_timeouts="step:30,checkpointing:none")
    >>> cfg.rank_heartbeat_timeout is None, cfg.rank_section_timeouts
    (True, {'step': 30.0, 'checkpointing': None})
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import argparse

# yaml and argparse are imported where they are used: the node monitor and every rank import
# this module but never read YAML or parse flags, and each import costs memory in every process.

__all__ = ["FALLBACK_FIELDS", "ConfigError", "FaultToleranceConfig", "parse_signal", "with_fallback"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_NONE_WORDS = ("none", "null", "off", "")
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key, the value and what is allowed."""


def _bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"fault_tolerance.{key}: invalid value {value!r}; allowed: {allowed}")


def parse_signal(value: Any, key: str = "rank_termination_signal") -> signal.Signals:
    """Turn ``"SIGKILL"``, ``"kill"``, ``9`` or ``signal.SIGKILL`` into ``signal.Signals``."""
    if isinstance(value, signal.Signals):
        return value
    if isinstance(value, bool):
        raise _bad(key, value, "a signal name like 'SIGKILL' or a signal number")
    try:
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            return signal.Signals(int(value))
        if isinstance(value, str):
            name = value.strip().upper()
            return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError):
        pass
    raise _bad(key, value, "a signal name like 'SIGKILL' or 'SIGTERM', or a signal number")


def _parse_timeout(key: str, value: Any, allow_none: bool = True) -> Optional[float]:
    """A timeout in seconds: a positive finite number, or ``None``/"none"/"null" (no timeout)."""
    allowed = "a positive number of seconds" + (" or none/null (no timeout)" if allow_none else "")
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
        if allow_none:
            return None
        raise _bad(key, value, allowed)
    if isinstance(value, bool):
        raise _bad(key, value, allowed)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise _bad(key, value, allowed) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise _bad(key, value, allowed)
    return seconds


def _parse_section_timeouts(key: str, value: Any) -> dict[str, Optional[float]]:
    """``{"step": 30}`` or the CLI form ``"step:30,checkpointing:none"``."""
    if value is None:
        return {}
    if isinstance(value, str):
        parsed: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in value.split(","))):
            name, sep, seconds = item.partition(":")
            if not sep or not name.strip():
                raise _bad(key, value, "a mapping or 'name:seconds,name:none' pairs")
            parsed[name.strip()] = seconds.strip()
        value = parsed
    if not isinstance(value, Mapping):
        raise _bad(key, value, "a mapping of section name to seconds/none, or 'name:seconds,...'")
    result: dict[str, Optional[float]] = {}
    for name, seconds in value.items():
        if not isinstance(name, str) or not name:
            raise _bad(key, name, "section names are non-empty strings")
        result[name] = _parse_timeout(f"{key}.{name}", seconds)
    return result


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
        return value.strip().lower() in _TRUE_WORDS
    raise _bad(key, value, "true or false")


def _parse_non_negative_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise _bad(key, value, "an integer >= 0")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise _bad(key, value, "an integer >= 0") from None
    if number < 0 or (isinstance(value, float) and not value.is_integer()):
        raise _bad(key, value, "an integer >= 0")
    return number


def _parse_log_level(key: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and logging.getLevelName(value) in LOG_LEVELS:
        return logging.getLevelName(value)
    if isinstance(value, str) and value.strip().upper() in LOG_LEVELS:
        return value.strip().upper()
    raise _bad(key, value, "one of " + ", ".join(LOG_LEVELS))


def _parse_optional_signal(key: str, value: Any) -> Optional[signal.Signals]:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
        return None
    return parse_signal(value, key)


def _parse_frame_bytes(key: str, value: Any) -> int:
    number = _parse_non_negative_int(key, value)
    if number < 4096:
        raise _bad(key, value, "an integer >= 4096 (bytes)")
    return number


@dataclasses.dataclass
class FaultToleranceConfig:
    """Settings shared by the launcher, the node monitor and every rank's client.

    Timeouts are in seconds; ``None`` disables a timeout. ``rank_section_timeouts``
    lists the sections the monitor tracks: a name mapped to ``None`` is tracked
    (it counts as "in a section") without a deadline; a name that is absent is
    not tracked at all and costs no IPC.
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
    log_level: str = "INFO"
    #: Section open/close are one-way messages (no round trip in the step).
    skip_section_response: bool = True
    #: Install a ``sys.excepthook`` that logs and hard-exits the rank, so an
    #: unhandled exception cannot hang interpreter shutdown on live threads.
    install_exception_hook: bool = False
    #: The first N ``step`` sections of each rank connection are not timed
    #: (compilation, allocator and data-loader warm-up).
    num_warmup_iterations: int = 0
    #: Signal on which each rank's faulthandler dumps all stacks; None disables.
    stack_dump_signal: Optional[signal.Signals] = signal.SIGUSR2
    #: How long the monitor waits for a stack dump before terminating the rank.
    stack_dump_timeout: float = 2.0
    #: Largest accepted IPC frame; bigger frames close the connection.
    max_frame_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        self._validate()

    # -- validation -------------------------------------------------------
    def _validate(self) -> None:
        check = _parse_timeout
        self.workload_check_interval = check("workload_check_interval", self.workload_check_interval, False)
        self.initial_rank_heartbeat_timeout = check(
            "initial_rank_heartbeat_timeout", self.initial_rank_heartbeat_timeout
        )
        self.rank_heartbeat_timeout = check("rank_heartbeat_timeout", self.rank_heartbeat_timeout)
        self.rank_section_timeouts = _parse_section_timeouts("rank_section_timeouts", self.rank_section_timeouts)
        self.rank_out_of_section_timeout = check("rank_out_of_section_timeout", self.rank_out_of_section_timeout)
        self.safety_factor = check("safety_factor", self.safety_factor, False)
        self.min_calculated_timeout = check("min_calculated_timeout", self.min_calculated_timeout, False)
        self.rank_termination_signal = parse_signal(self.rank_termination_signal, "rank_termination_signal")
        self.log_level = _parse_log_level("log_level", self.log_level)
        self.skip_section_response = _parse_bool("skip_section_response", self.skip_section_response)
        self.install_exception_hook = _parse_bool("install_exception_hook", self.install_exception_hook)
        self.num_warmup_iterations = _parse_non_negative_int("num_warmup_iterations", self.num_warmup_iterations)
        self.stack_dump_signal = _parse_optional_signal("stack_dump_signal", self.stack_dump_signal)
        self.stack_dump_timeout = check("stack_dump_timeout", self.stack_dump_timeout, False)
        self.max_frame_bytes = _parse_frame_bytes("max_frame_bytes", self.max_frame_bytes)

    # -- constructors -----------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_kwargs(cls, ignore_not_recognized: bool = False, **kwargs: Any) -> FaultToleranceConfig:
        """Build from keyword arguments; unknown keys are an error unless ``ignore_not_recognized``."""
        known = set(cls.field_names())
        unknown = sorted(set(kwargs) - known)
        if unknown and not ignore_not_recognized:
            raise ConfigError(
                f"fault_tolerance: unknown key(s) {', '.join(map(repr, unknown))}; "
                f"allowed keys: {', '.join(sorted(known))}"
            )
        return cls(**{k: v for k, v in kwargs.items() if k in known})

    from_dict = from_kwargs

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> FaultToleranceConfig:
        return cls.from_kwargs(**dict(mapping))

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-safe dict (signals as names) that ``from_mapping`` reads back."""
        data = dataclasses.asdict(self)
        for key in ("rank_termination_signal", "stack_dump_signal"):
            data[key] = data[key].name if data[key] is not None else None
        return data

    @classmethod
    def from_yaml_file(cls, path: str | os.PathLike[str]) -> FaultToleranceConfig:
        """Read the first ``fault_tolerance:`` mapping found at any depth of a YAML file."""
        return cls.from_mapping(_load_yaml_section(path))

    def to_yaml_file(self, path: str | os.PathLike[str]) -> None:
        """Write ``{"fault_tolerance": {...}}`` atomically (temp file + fsync + rename)."""
        import yaml

        from ft_core.fileutil import atomic_write_text

        atomic_write_text(path, yaml.safe_dump({"fault_tolerance": self.to_dict()}, sort_keys=False))

    # -- argparse ---------------------------------------------------------
    @classmethod
    def add_argparse_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add ``--ft-cfg-path`` and one ``--ft-<field>`` flag per field.

        ``--ft-rank-heartbeat-timeout``, ``--ft-rank_heartbeat_timeout`` and the
        NVRx spelling ``--ft-param-rank-heartbeat-timeout`` all set the same field.
        Values are strings here; validation happens in :meth:`from_args`.
        """
        group = parser.add_argument_group("fault tolerance", "Override fields of FaultToleranceConfig.")
        group.add_argument(
            "--ft-cfg-path", "--ft_cfg_path", dest="ft_cfg_path", default=None,
            help="YAML file; its first 'fault_tolerance:' mapping (at any depth) is read.",
        )
        for field in dataclasses.fields(cls):
            dashed = field.name.replace("_", "-")
            spellings = dict.fromkeys(
                [f"--ft-{dashed}", f"--ft-{field.name}", f"--ft_{field.name}",
                 f"--ft-param-{dashed}", f"--ft-param-{field.name}", f"--ft_param_{field.name}"]
            )
            group.add_argument(
                *spellings, dest=f"ft_{field.name}", default=None, metavar="VALUE",
                help=_FIELD_HELP.get(field.name, field.name.replace("_", " ")) + f" (default: {_default_text(field)})",
            )
        return parser

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FaultToleranceConfig:
        """Merge defaults < YAML (``args.ft_cfg_path``) < ``--ft-<field>`` flags."""
        values: dict[str, Any] = {}
        cfg_path = getattr(args, "ft_cfg_path", None)
        if cfg_path:
            values.update(_load_yaml_section(cfg_path))
        for name in cls.field_names():
            flag_value = getattr(args, f"ft_{name}", None)
            if flag_value is not None:
                values[name] = flag_value
        return cls.from_kwargs(**values)


_FIELD_HELP = {
    "workload_check_interval": "monitor housekeeping interval in seconds",
    "initial_rank_heartbeat_timeout": "seconds from init to the first heartbeat, or none",
    "rank_heartbeat_timeout": "max seconds between heartbeats, or none",
    "rank_section_timeouts": "tracked sections, e.g. 'setup:600,step:180,checkpointing:none'",
    "rank_out_of_section_timeout": "max seconds outside every tracked section, or none",
    "safety_factor": "calculated timeout = observed max * safety factor",
    "min_calculated_timeout": "lower bound in seconds for calculated timeouts",
    "rank_termination_signal": "signal sent to a hung rank, e.g. SIGKILL",
    "log_level": "one of " + ", ".join(LOG_LEVELS),
    "skip_section_response": "one-way section messages (true/false)",
    "install_exception_hook": "hard-exit a rank on an unhandled exception (true/false)",
    "num_warmup_iterations": "untimed 'step' sections at the start of each rank",
    "stack_dump_signal": "signal for faulthandler stack dumps, or none",
    "stack_dump_timeout": "seconds to wait for a hung rank's stack dump",
    "max_frame_bytes": "largest accepted IPC frame in bytes",
}


def _default_text(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return str(field.default_factory())  # type: ignore[misc]
    default = field.default
    return default.name if isinstance(default, signal.Signals) else str(default)


def _find_section(node: Any, key: str = "fault_tolerance") -> Optional[Mapping[str, Any]]:
    """Breadth-first search so the shallowest ``fault_tolerance`` mapping wins."""
    queue: list[Any] = [node]
    while queue:
        current = queue.pop(0)
        if isinstance(current, Mapping):
            if isinstance(current.get(key), Mapping):
                return current[key]
            queue.extend(current.values())
        elif isinstance(current, Sequence) and not isinstance(current, (str, bytes)):
            queue.extend(current)
    return None


def _load_yaml_section(path: str | os.PathLike[str]) -> dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except FileNotFoundError:
        raise ConfigError(f"--ft-cfg-path: config file {str(path)!r} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--ft-cfg-path: {str(path)!r} is not valid YAML: {exc}") from None
    section = _find_section(document)
    if section is None:
        raise ConfigError(f"--ft-cfg-path: {str(path)!r} has no 'fault_tolerance:' mapping")
    return dict(section)


#: Fields a rank's integration may fill in when the launcher left them at their defaults.
FALLBACK_FIELDS = (
    "initial_rank_heartbeat_timeout", "rank_heartbeat_timeout", "rank_section_timeouts",
    "rank_out_of_section_timeout", "safety_factor", "min_calculated_timeout", "num_warmup_iterations",
    "skip_section_response",
)


def with_fallback(cfg: FaultToleranceConfig, fallback: dict[str, Any]) -> FaultToleranceConfig:
    """``cfg`` completed by a rank's ``fallback`` values: whatever was set at launch wins.

    This lets one training config (e.g. a Hydra recipe's ``fault_tolerance``
    block) drive a launcher started without ``--ft-cfg-path``. A field counts
    as "set at launch" when it differs from the dataclass default; sections
    merge per name, the launch-time entry winning.
    """
    unknown = sorted(set(fallback) - set(FALLBACK_FIELDS))
    if unknown:
        raise ValueError(f"fallback config: keys {unknown} cannot come from a rank; allowed: {list(FALLBACK_FIELDS)}")
    defaults = FaultToleranceConfig()
    merged = cfg.to_dict()
    for key, value in fallback.items():
        if key == "rank_section_timeouts":
            requested = FaultToleranceConfig.from_kwargs(rank_section_timeouts=value).rank_section_timeouts
            merged[key] = {**requested, **cfg.rank_section_timeouts}
        elif getattr(cfg, key) == getattr(defaults, key):
            merged[key] = value
    return FaultToleranceConfig.from_mapping(merged)
