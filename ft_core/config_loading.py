"""Loading a ``FaultToleranceConfig``: YAML files, ``--ft-*`` flags, mappings, and the monitor's JSON.

Each loader returns a :class:`LoadedConfig`: the config and, beside it, the
keys the user set (:attr:`LoadedConfig.explicit_keys`: YAML keys, ``--ft-*``
flags, mapping keys, even when a value equals the default). The config itself
does not record them; they travel beside it from the loader to the node monitor
(``python -m ft_core.monitor --config-json``), where
:func:`ft_core.config_fallback.with_fallback` lets exactly those win over a
rank's fallback values.

    >>> loaded = load_mapping({"rank_heartbeat_timeout": "none", "rank_section_timeouts": "step:30"})
    >>> loaded.cfg.rank_heartbeat_timeout is None, sorted(loaded.explicit_keys)
    (True, ['rank_heartbeat_timeout', 'rank_section_timeouts'])

NVRx's loaders (``FaultToleranceConfig.from_yaml_file``, ``from_args``,
``from_kwargs``, ``from_dict``, ``add_argparse_args``) call these and return the
config alone. Keys that are not ours are skipped with ``ignore_not_recognized``
(NVRx's default), with one warning naming NVRx's keys this project does not
implement and one suggesting the known key a misspelling resembles; without it
both are an error.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import enum
import errno
import json
import logging
import os
import stat
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from ft_core.config import FIELD_HELP, NVRX_ONLY_KEYS, ConfigError, FaultToleranceConfig

if TYPE_CHECKING:
    import argparse

    import yaml

# yaml and argparse are imported where they are used: the node monitor and every rank load a config
# (the monitor from JSON) but never read YAML or parse flags, and each import costs memory in every process.

__all__ = [
    "LoadedConfig", "add_argparse_args", "load_args", "load_json", "load_mapping", "load_yaml_file",
    "write_yaml_file",
]

log = logging.getLogger("ft_core.config")


@dataclasses.dataclass(frozen=True)
class LoadedConfig:
    """A config as loaded, and beside it the keys the user set at launch.

    ``explicit_keys`` are the fields given to the loader (YAML keys, ``--ft-*``
    flags, mapping keys), whatever their values: a flag that repeats the
    default still wins over a rank's fallback value
    (:func:`ft_core.config_fallback.with_fallback`).
    """

    cfg: FaultToleranceConfig
    explicit_keys: frozenset[str] = frozenset()

    @classmethod
    def of(cls, cfg: FaultToleranceConfig, explicit_keys: Optional[Collection[str]] = None) -> LoadedConfig:
        """``cfg`` and the keys set at launch; None: every key (a config given alone is taken as it is,
        so a rank's fallback values fill in nothing but section names)."""
        return cls(cfg, frozenset(cfg.field_names() if explicit_keys is None else explicit_keys))

    def replace(self, **changes: Any) -> LoadedConfig:
        """A validated copy with ``changes``, which become set at launch; the other keys keep their status."""
        return LoadedConfig(dataclasses.replace(self.cfg, **changes), self.explicit_keys | frozenset(changes))

    def to_json(self) -> str:
        """The values and the keys set, as JSON, for :func:`load_json` in another process (the node monitor)."""
        return json.dumps({"config": self.cfg.to_dict(), "explicit_keys": sorted(self.explicit_keys)})


def load_mapping(mapping: Mapping[str, Any], ignore_not_recognized: bool = True) -> LoadedConfig:
    """Build from a mapping of field names to values; the keys given are set at launch.

    With ``ignore_not_recognized`` (the default, as in NVRx) keys that are
    not ours are skipped: keys of NVRx's config that this project does not
    implement (:data:`~ft_core.config.NVRX_ONLY_KEYS`) with one warning, any
    other with one warning naming the known key it resembles. Without it,
    either is an error with a "did you mean" suggestion.
    """
    if not isinstance(mapping, Mapping):
        raise ConfigError("fault_tolerance", mapping, "a mapping of config keys to values")
    names = FaultToleranceConfig.field_names()
    unknown = [key for key in mapping if key not in names]
    nvrx_only = sorted(key for key in unknown if key in NVRX_ONLY_KEYS)
    others = [key for key in unknown if key not in NVRX_ONLY_KEYS]
    if unknown and not ignore_not_recognized:
        raise _unknown_keys_error(others, nvrx_only)
    if nvrx_only:
        log.warning("fault_tolerance: %d key(s) of NVRx's FaultToleranceConfig that ft-suite does not implement "
                    "are kept as attributes with no effect: %s", len(nvrx_only), ", ".join(nvrx_only))
    if others:
        log.warning("fault_tolerance: ignoring unknown key(s) %s (ignore_not_recognized=False makes them an "
                    "error)", _described_unknown_keys(others))
    known = {key: value for key, value in mapping.items() if key in names}
    cfg = FaultToleranceConfig(**known)
    for key in nvrx_only:  # readable as given (NVRx code reads them back), with no effect here
        setattr(cfg, key, mapping[key])
    return LoadedConfig(cfg, frozenset(known))


def load_json(text: str) -> LoadedConfig:
    """Read :meth:`LoadedConfig.to_json` back; a plain JSON object of config keys is read like
    :func:`load_mapping` with ``ignore_not_recognized=False`` (the keys it has are set)."""
    allowed = "a JSON object of config keys, or the output of LoadedConfig.to_json()"
    try:
        data = json.loads(text)
    except ValueError:
        raise ConfigError("fault_tolerance", text, allowed) from None
    if not isinstance(data, dict) or "config" not in data:
        return load_mapping(data, ignore_not_recognized=False)
    explicit = data.get("explicit_keys")
    if not isinstance(explicit, list) or not set(explicit) <= set(FaultToleranceConfig.field_names()):
        raise ConfigError("fault_tolerance.explicit_keys", explicit, "a list of config keys")
    return LoadedConfig(load_mapping(data["config"], ignore_not_recognized=False).cfg, frozenset(explicit))


def load_yaml_file(cfg_path: str | os.PathLike[str], ignore_not_recognized: bool = True) -> LoadedConfig:
    """Read the first ``fault_tolerance:`` mapping found at any depth of a YAML file.

    ``ignore_not_recognized`` as in :func:`load_mapping`.

    Raises:
        FileNotFoundError: ``cfg_path`` does not exist (as NVRx).
        ConfigError: the file cannot be read, is not YAML, repeats a key, has no
            ``fault_tolerance:`` mapping, or holds a bad key or value.
    """
    section = _load_yaml_section(cfg_path, "cfg_path")
    if section is None:
        raise ConfigError("cfg_path", os.fspath(cfg_path), _YAML_ALLOWED,
                          problem=f"{os.fspath(cfg_path)!r} has no 'fault_tolerance:' mapping")
    return load_mapping(section, ignore_not_recognized)


def write_yaml_file(cfg: FaultToleranceConfig, path: str | os.PathLike[str]) -> None:
    """Write ``{"fault_tolerance": {...}}`` atomically (temp file + fsync + rename)."""
    import yaml

    from ft_core.utils.fileutil import atomic_write_text

    atomic_write_text(path, yaml.safe_dump({"fault_tolerance": cfg.to_dict()}, sort_keys=False))


# -- argparse -----------------------------------------------------------------------------------------


def add_argparse_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--ft-cfg-path`` and one ``--ft-<field>`` flag per field.

    ``--ft-rank-heartbeat-timeout``, ``--ft-rank_heartbeat_timeout`` and the
    NVRx spelling ``--ft-param-rank-heartbeat-timeout`` all set the same field.
    The keys of :data:`~ft_core.config.NVRX_ONLY_KEYS` get hidden flags of the
    same forms, so an NVRx command line works (they are skipped with a warning).
    Values are strings here; validation happens in :func:`load_args`.
    """
    import argparse

    group = parser.add_argument_group("fault tolerance", "Override fields of FaultToleranceConfig.")
    group.add_argument(
        "--ft-cfg-path", "--ft_cfg_path", dest="ft_cfg_path", default=None,
        help="YAML file; its first 'fault_tolerance:' mapping (at any depth) is read.",
    )
    for field in dataclasses.fields(FaultToleranceConfig):
        group.add_argument(
            *_flag_spellings(field.name), dest=f"ft_{field.name}", default=None, metavar="VALUE",
            help=FIELD_HELP[field.name] + f" (default: {_default_text(field)})",
        )
    for key in sorted(NVRX_ONLY_KEYS):
        group.add_argument(*_flag_spellings(key), dest=f"ft_{key}", default=None, help=argparse.SUPPRESS)
    return parser


def load_args(args: argparse.Namespace) -> LoadedConfig:
    """Merge defaults < YAML (``args.ft_cfg_path``) < ``--ft-<field>`` flags.

    The YAML keys and the flags given are set at launch. A YAML file without a
    ``fault_tolerance:`` mapping gives the defaults and the flags, with a
    warning (as NVRx); a missing or unreadable file is a :class:`~ft_core.config.ConfigError`
    naming ``--ft-cfg-path``.
    """
    values: dict[Any, Any] = {}
    cfg_path = getattr(args, "ft_cfg_path", None)
    if cfg_path is not None:
        try:
            section = _load_yaml_section(cfg_path, "--ft-cfg-path")
        except FileNotFoundError:
            raise ConfigError("--ft-cfg-path", cfg_path, _YAML_ALLOWED,
                              problem=f"{cfg_path!r} does not exist") from None
        if section is None:
            log.warning("--ft-cfg-path %s has no 'fault_tolerance:' mapping: using the defaults and the "
                        "--ft-* flags", cfg_path)
        else:
            values.update(section)
    for name in (*FaultToleranceConfig.field_names(), *sorted(NVRX_ONLY_KEYS)):
        flag_value = getattr(args, f"ft_{name}", None)
        if flag_value is not None:
            values[name] = flag_value
    return load_mapping(values)


def _flag_spellings(key: str) -> list[str]:
    dashed = key.replace("_", "-")
    return list(dict.fromkeys([f"--ft-{dashed}", f"--ft-{key}", f"--ft_{key}",
                               f"--ft-param-{dashed}", f"--ft-param-{key}", f"--ft_param_{key}"]))


def _default_text(field: dataclasses.Field[Any]) -> str:
    if field.default_factory is not dataclasses.MISSING:
        return str(field.default_factory())
    default = field.default
    if isinstance(default, str) and isinstance(default, enum.Enum):
        return default.value  # a str-enum: the spelling the flag takes (exclude-node, not EXCLUDE_NODE)
    return default.name if isinstance(default, enum.Enum) else str(default)


def _described_unknown_keys(keys: Sequence[Any]) -> str:
    """``'rank_heartbeat_timout' (did you mean 'rank_heartbeat_timeout'?), 'zzz'``."""
    described = []
    for key in keys:
        close = difflib.get_close_matches(str(key), [*FaultToleranceConfig.field_names(), *NVRX_ONLY_KEYS], n=1)
        described.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ", ".join(described)


def _unknown_keys_error(typos: Sequence[Any], nvrx_only: Sequence[str]) -> ConfigError:
    problems = []
    if typos:
        problems.append("unknown key(s) " + _described_unknown_keys(typos))
    if nvrx_only:
        problems.append("key(s) of NVRx's FaultToleranceConfig that ft-suite does not implement: "
                        + ", ".join(map(repr, nvrx_only)) + " (ignore_not_recognized=True skips them with a warning)")
    return ConfigError("fault_tolerance", [*typos, *nvrx_only], "keys " + ", ".join(sorted(FaultToleranceConfig.field_names())),
                       problem="; ".join(problems))


# -- reading a YAML file --------------------------------------------------------------------------------

_YAML_ALLOWED = "a YAML file with a 'fault_tolerance:' mapping (at any depth)"
#: A config file is small; anything bigger is a wrong path (a dataset, a device) and is not read.
_MAX_YAML_BYTES = 16 << 20
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _load_yaml_section(path: str | os.PathLike[str], source: str) -> Optional[dict[Any, Any]]:
    """The first ``fault_tolerance:`` mapping of the YAML file at ``path``, or None if it has none.

    ``source`` names the path in errors (the flag or the argument it came from).

    Raises:
        FileNotFoundError: ``path`` does not exist and ``source`` is an argument (not a flag).
        ConfigError: anything else wrong with the file.
    """
    shown = os.fspath(path)

    def error(problem: str, allowed: str = _YAML_ALLOWED) -> ConfigError:
        return ConfigError(source, shown, allowed, problem=f"{shown!r} {problem}")

    import yaml

    text = _read_small_text_file(shown, error)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        duplicate = _first_duplicate_key(node)
        if duplicate is not None:
            key, mark = duplicate
            raise error(f"line {mark.line + 1}: duplicate key {key!r}",
                        "a YAML file in which no mapping repeats a key")
        document = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise error(f"is not valid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    section = _find_section(document)
    return None if section is None else dict(section)


def _read_small_text_file(path: str, error: Callable[[str], ConfigError]) -> str:
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (regular files ignore the flag).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "config file not found", path) from None
    except OSError as exc:
        raise error(f"cannot be read: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        # A directory, a FIFO or a device (/dev/zero would be read forever).
        raise error("is a directory" if stat.S_ISDIR(info.st_mode) else "is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(_MAX_YAML_BYTES + 1)
        except OSError as exc:
            raise error(f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > _MAX_YAML_BYTES:
        raise error(f"is larger than {_MAX_YAML_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error("is not UTF-8 text") from None


def _first_duplicate_key(root: Optional[yaml.Node]) -> Optional[tuple[str, yaml.Mark]]:
    """A key written twice in one mapping (YAML would silently keep the last one), with where.

    Checked on the composed nodes, before merge keys (``<<``) are expanded: a merged
    key that the mapping overrides is not a duplicate. Each node is visited once,
    so aliases cannot make the walk explode.
    """
    import yaml

    seen: set[int] = set()
    pending: list[yaml.Node] = [root] if root is not None else []
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[tuple[str, str]] = set()
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    if (key_node.tag, key_node.value) in keys:
                        return key_node.value, key_node.start_mark
                    keys.add((key_node.tag, key_node.value))
                pending.extend((value_node, key_node))
        elif isinstance(node, yaml.SequenceNode):
            pending.extend(reversed(node.value))
    return None


def _find_section(node: Any, key: str = "fault_tolerance") -> Optional[Mapping[Any, Any]]:
    """Breadth-first search so the shallowest ``fault_tolerance`` mapping wins.

    Each container is visited once: YAML aliases can share one node many times over.
    """
    queue: collections.deque[Any] = collections.deque([node])
    seen: set[int] = set()
    while queue:
        current = queue.popleft()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, Mapping):
            if isinstance(current.get(key), Mapping):
                return current[key]
            queue.extend(current.values())
        elif isinstance(current, Sequence) and not isinstance(current, (str, bytes)):
            queue.extend(current)
    return None
