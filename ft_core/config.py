"""Fault tolerance configuration: defaults < YAML file < ``--ft-<field>`` CLI flags.

Example::

    >>> from ft_core.config import FaultToleranceConfig
    >>> cfg = FaultToleranceConfig.from_kwargs(rank_heartbeat_timeout="none",
    ...                                         rank_section_timeouts="step:30,checkpointing:none")
    >>> cfg.rank_heartbeat_timeout is None, cfg.rank_section_timeouts
    (True, {'step': 30.0, 'checkpointing': None})
    >>> sorted(cfg.explicit_keys)  # what the user set: it wins over a rank's fallback values
    ['rank_heartbeat_timeout', 'rank_section_timeouts']

Values are checked and converted by :mod:`ft_core.validation`; a bad one
raises :class:`ConfigError` naming the key, the value and what is allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import json
import logging
import os
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Optional

import yaml

from ft_core.validation import (
    ValidationError,
    boolean,
    enum_member,
    int_in_range,
    non_negative_int,
    positive_seconds,
    signal_or_none,
)

__all__ = [
    "FALLBACK_FIELDS", "ConfigError", "FaultToleranceConfig", "LogLevel", "parse_signal", "with_fallback",
]


class LogLevel(str, enum.Enum):
    """``log_level`` values (the names of the standard ``logging`` levels)."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"

    def __str__(self) -> str:
        # ``logging`` accepts a level name only if ``str(level) == level``.
        return self.value


LOG_LEVELS = tuple(level.value for level in LogLevel)


class ConfigError(ValidationError):
    """A configuration value is invalid; the message names the key, the value and what is allowed."""


def parse_signal(value: Any, key: str = "rank_termination_signal") -> signal.Signals:
    """Turn ``"SIGKILL"``, ``"kill"``, ``9`` or ``signal.SIGKILL`` into ``signal.Signals``."""
    try:
        return signal_or_none(f"fault_tolerance.{key}", value)
    except ValidationError as exc:
        raise _config_error(exc) from None


def _config_error(exc: ValidationError) -> ConfigError:
    return exc if isinstance(exc, ConfigError) else ConfigError(exc.name, exc.value, exc.allowed, exc.problem)


def _section_timeouts(name: str, value: Any) -> dict[str, Optional[float]]:
    """``{"step": 30}`` or the CLI form ``"step:30,checkpointing:none"``."""
    if value is None:
        return {}
    if isinstance(value, str):
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


def _log_level(name: str, value: Any) -> LogLevel:
    if isinstance(value, int) and not isinstance(value, bool) and logging.getLevelName(value) in LOG_LEVELS:
        return LogLevel(logging.getLevelName(value))  # logging.DEBUG and friends
    return enum_member(name, value, LogLevel, coerce=True)


#: How each field is checked and converted; values from YAML and the command line arrive as text.
_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "workload_check_interval": functools.partial(positive_seconds, coerce=True),
    "initial_rank_heartbeat_timeout": functools.partial(positive_seconds, allow_none=True, coerce=True),
    "rank_heartbeat_timeout": functools.partial(positive_seconds, allow_none=True, coerce=True),
    "rank_section_timeouts": _section_timeouts,
    "rank_out_of_section_timeout": functools.partial(positive_seconds, allow_none=True, coerce=True),
    "safety_factor": functools.partial(positive_seconds, coerce=True),
    "min_calculated_timeout": functools.partial(positive_seconds, coerce=True),
    "rank_termination_signal": signal_or_none,
    "log_level": _log_level,
    "skip_section_response": functools.partial(boolean, coerce=True),
    "install_exception_hook": functools.partial(boolean, coerce=True),
    "num_warmup_iterations": functools.partial(non_negative_int, coerce=True),
    "stack_dump_signal": functools.partial(signal_or_none, allow_none=True),
    "stack_dump_timeout": functools.partial(positive_seconds, coerce=True),
    "max_frame_bytes": functools.partial(int_in_range, minimum=4096, coerce=True),
}


@dataclasses.dataclass
class FaultToleranceConfig:
    """Settings shared by the launcher, the node monitor and every rank's client.

    Timeouts are in seconds; ``None`` disables a timeout. ``rank_section_timeouts``
    lists the sections the monitor tracks: a name mapped to ``None`` is tracked
    (it counts as "in a section") without a deadline; a name that is absent is
    not tracked at all and costs no IPC.

    :attr:`explicit_keys` records which fields were given (to the constructor
    or a loader: YAML keys, ``--ft-*`` flags, keyword arguments), as opposed to
    left at their defaults; :func:`with_fallback` lets exactly those win.
    """

    # Not a dataclass field (no annotation): set per instance by ``__new__``.
    _explicit_keys = frozenset[str]()

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
    log_level: LogLevel = LogLevel.INFO
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

    def __new__(cls, *args: Any, **kwargs: Any) -> FaultToleranceConfig:
        # The generated __init__ cannot tell a value that was given from a default that equals
        # it; __new__ sees the same arguments, so it records which fields were given.
        self = super().__new__(cls)
        self._explicit_keys = frozenset(_FIELD_NAMES[: len(args)]) | frozenset(kwargs)
        return self

    def __post_init__(self) -> None:
        try:
            for name in _FIELD_NAMES:
                setattr(self, name, _CHECKS[name](f"fault_tolerance.{name}", getattr(self, name)))
        except ValidationError as exc:
            raise _config_error(exc) from None

    @property
    def explicit_keys(self) -> frozenset[str]:
        """The fields that were set (given to the constructor or a loader), not left at their defaults."""
        return self._explicit_keys

    # -- constructors -----------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return list(_FIELD_NAMES)

    @classmethod
    def from_kwargs(cls, ignore_not_recognized: bool = False, **kwargs: Any) -> FaultToleranceConfig:
        """Build from keyword arguments; unknown keys are an error unless ``ignore_not_recognized``."""
        return cls.from_dict(kwargs, ignore_not_recognized)

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any], ignore_not_recognized: bool = False) -> FaultToleranceConfig:
        """Build from a mapping of field names to values; unknown keys are an error unless
        ``ignore_not_recognized``. The keys given become :attr:`explicit_keys`."""
        if not isinstance(mapping, Mapping):
            raise ConfigError("fault_tolerance", mapping, "a mapping of config keys to values")
        known = set(_FIELD_NAMES)
        unknown = sorted(set(mapping) - known, key=str)
        if unknown and not ignore_not_recognized:
            raise ConfigError(
                "fault_tolerance", unknown, "keys " + ", ".join(sorted(known)),
                problem=f"unknown key(s) {', '.join(map(repr, unknown))}",
            )
        return cls(**{key: value for key, value in mapping.items() if key in known})

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> FaultToleranceConfig:
        """Build from a mapping of field names to values; unknown keys are an error."""
        return cls.from_dict(mapping)

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-safe dict (signals as names) that ``from_mapping`` reads back."""
        data = dataclasses.asdict(self)
        for key in ("rank_termination_signal", "stack_dump_signal"):
            data[key] = data[key].name if data[key] is not None else None
        data["log_level"] = self.log_level.value
        return data

    def to_json(self) -> str:
        """The values and :attr:`explicit_keys` as JSON, for :meth:`from_json` in another process."""
        return json.dumps({"config": self.to_dict(), "explicit_keys": sorted(self._explicit_keys)})

    @classmethod
    def from_json(cls, text: str) -> FaultToleranceConfig:
        """Read :meth:`to_json` back, :attr:`explicit_keys` included; a plain JSON object of
        config keys is read like :meth:`from_mapping` (the keys it has are explicit)."""
        allowed = "a JSON object of config keys, or the output of FaultToleranceConfig.to_json()"
        try:
            data = json.loads(text)
        except ValueError:
            raise ConfigError("fault_tolerance", text, allowed) from None
        if not isinstance(data, dict) or "config" not in data:
            return cls.from_mapping(data)
        explicit = data.get("explicit_keys")
        if not isinstance(explicit, list) or not set(explicit) <= set(_FIELD_NAMES):
            raise ConfigError("fault_tolerance.explicit_keys", explicit, "a list of config keys")
        cfg = cls.from_mapping(data["config"])
        cfg._explicit_keys = frozenset(explicit)
        return cfg

    @classmethod
    def from_yaml_file(cls, path: str | os.PathLike[str]) -> FaultToleranceConfig:
        """Read the first ``fault_tolerance:`` mapping found at any depth of a YAML file."""
        return cls.from_mapping(_load_yaml_section(path))

    def to_yaml_file(self, path: str | os.PathLike[str]) -> None:
        """Write ``{"fault_tolerance": {...}}`` atomically (temp file + fsync + rename)."""
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
        """Merge defaults < YAML (``args.ft_cfg_path``) < ``--ft-<field>`` flags.

        The YAML keys and the flags given become :attr:`explicit_keys`.
        """
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
    if field.default_factory is not dataclasses.MISSING:
        return str(field.default_factory())
    default = field.default
    return default.name if isinstance(default, enum.Enum) else str(default)


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
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError("--ft-cfg-path", str(path), _YAML_ALLOWED,
                          problem=f"config file {str(path)!r} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError("--ft-cfg-path", str(path), _YAML_ALLOWED,
                          problem=f"{str(path)!r} is not valid YAML: {exc}") from None
    section = _find_section(document)
    if section is None:
        raise ConfigError("--ft-cfg-path", str(path), _YAML_ALLOWED,
                          problem=f"{str(path)!r} has no 'fault_tolerance:' mapping")
    return dict(section)


_YAML_ALLOWED = "a YAML file with a 'fault_tolerance:' mapping (at any depth)"


#: Fields a rank's integration may fill in when the launcher's user did not set them.
FALLBACK_FIELDS = (
    "initial_rank_heartbeat_timeout", "rank_heartbeat_timeout", "rank_section_timeouts",
    "rank_out_of_section_timeout", "safety_factor", "min_calculated_timeout", "num_warmup_iterations",
    "skip_section_response",
)


def with_fallback(
    cfg: FaultToleranceConfig, fallback: Mapping[str, Any], explicit: Collection[str]
) -> FaultToleranceConfig:
    """``cfg`` completed by a rank's ``fallback`` values: the keys in ``explicit`` win.

    ``explicit`` are the keys the user set at launch (``cfg.explicit_keys``:
    YAML keys, ``--ft-*`` flags, keyword arguments), whatever their values; a
    flag that repeats the default still wins. Every other key of ``fallback``
    is taken. Sections merge per name, the launch-time entry winning. This lets
    one training config (e.g. a Hydra recipe's ``fault_tolerance`` block) drive
    a launcher started without ``--ft-cfg-path``.

    Raises:
        ConfigError: for a key a rank may not set or an invalid value.
    """
    unknown = sorted(set(fallback) - set(FALLBACK_FIELDS))
    if unknown:
        raise ConfigError("fallback config", unknown, "keys " + ", ".join(FALLBACK_FIELDS),
                          problem=f"keys {unknown} cannot come from a rank")
    requested = FaultToleranceConfig.from_dict(fallback)
    merged = cfg.to_dict()
    for key in fallback:
        if key == "rank_section_timeouts":
            merged[key] = {**requested.rank_section_timeouts, **cfg.rank_section_timeouts}
        elif key not in explicit:
            merged[key] = getattr(requested, key)
    return FaultToleranceConfig.from_mapping(merged)


_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(FaultToleranceConfig))
assert set(_CHECKS) == set(_FIELD_NAMES), "every field has exactly one check"
