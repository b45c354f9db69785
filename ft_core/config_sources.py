"""Where a config's values come from, before they are checked: a YAML file, the ``--ft-*`` flags, a mapping.

The values arrive as text or as plain data; :class:`~ft_core.config.FaultToleranceConfig`
checks and converts them (its NVRx classmethods ``from_yaml_file``, ``from_args``,
``from_dict``, ``add_argparse_args``, ``to_yaml_file`` are built on the functions
here), and :mod:`ft_core.config_loading` adds which keys the user set. This module
knows the config's field names only as the arguments it is given, so it sits below
the config: nothing here imports it.

* :func:`yaml_section`: the first ``fault_tolerance:`` mapping found at any depth of a
  YAML file (a small regular UTF-8 file in which no mapping repeats a key);
* :func:`add_flags` and :func:`flag_values`: ``--ft-cfg-path`` and one ``--ft-<field>``
  flag per field, and defaults < YAML < flags as one mapping;
* :func:`recognized`: the keys of a mapping that are fields; keys that are not are
  skipped with ``ignore_not_recognized`` (NVRx's default), with one warning naming
  NVRx's keys this project does not implement (:data:`NVRX_ONLY_KEYS`) and one
  suggesting the known key a misspelling resembles; without it both are an error.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import enum
import errno
import logging
import os
import stat
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from ft_core.utils.validation import ValidationError

if TYPE_CHECKING:
    import argparse

    import yaml

# yaml and argparse are imported where they are used: the node monitor and every rank build a config
# but never read YAML or parse flags, and each import costs memory in every process.

__all__ = ["NVRX_ONLY_KEYS", "ConfigError", "add_flags", "flag_values", "recognized", "write_yaml", "yaml_section"]

log = logging.getLogger("ft_core.config")


class ConfigError(ValidationError):
    """A configuration value is invalid; the message names the key, the value and what is allowed."""



#: Keys of NVRx's ``FaultToleranceConfig`` (releases 0.3 to 0.6 and its main branch) that this
#: project does not implement: accepted and skipped with one warning (``ignore_not_recognized``).
NVRX_ONLY_KEYS = frozenset({
    "node_health_check_interval", "restart_check_interval", "enable_nic_monitor", "enable_nic_healthcheck",
    "pci_topo_file", "link_down_path_template", "link_state_path_template", "enable_dist_storage_healthcheck",
    "storage_healthcheck_path", "use_infra_group_rank", "segment", "numa_bind_strict",
    "gpu_memory_reclaim_timeout", "gpu_memory_tolerance_mb", "gpu_memory_poll_interval",
    "check_remaining_processes", "attribution_endpoint", "attribution_stop_action", "attribution_export_url",
    "cycle_info_dir",
})


def recognized(mapping: Mapping[str, Any], names: Collection[str],
               ignore_not_recognized: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values of ``mapping`` whose keys are in ``names``, and those of :data:`NVRX_ONLY_KEYS`.

    With ``ignore_not_recognized`` (the default, as in NVRx) keys that are
    not in ``names`` are skipped: keys of NVRx's config that this project does
    not implement with one warning, any other with one warning naming the
    known key it resembles. Without it, either is an error with a "did you
    mean" suggestion.
    """
    if not isinstance(mapping, Mapping):
        raise ConfigError("fault_tolerance", mapping, "a mapping of config keys to values")
    unknown = [key for key in mapping if key not in names]
    nvrx_only = sorted(key for key in unknown if key in NVRX_ONLY_KEYS)
    others = [key for key in unknown if key not in NVRX_ONLY_KEYS]
    if unknown and not ignore_not_recognized:
        raise _unknown_keys_error(others, nvrx_only, names)
    if nvrx_only:
        log.warning("fault_tolerance: %d key(s) of NVRx's FaultToleranceConfig that ft-suite does not implement "
                    "are kept as attributes with no effect: %s", len(nvrx_only), ", ".join(nvrx_only))
    if others:
        log.warning("fault_tolerance: ignoring unknown key(s) %s (ignore_not_recognized=False makes them an "
                    "error)", _described_unknown_keys(others, names))
    return ({key: value for key, value in mapping.items() if key in names},
            {key: mapping[key] for key in nvrx_only})


def yaml_section(cfg_path: str | os.PathLike[str]) -> dict[Any, Any]:
    """The first ``fault_tolerance:`` mapping found at any depth of a YAML file.

    Raises:
        FileNotFoundError: ``cfg_path`` does not exist (as NVRx).
        ConfigError: the file cannot be read, is not YAML, repeats a key, has no
            ``fault_tolerance:`` mapping.
    """
    section = _load_yaml_section(cfg_path, "cfg_path")
    if section is None:
        raise ConfigError("cfg_path", os.fspath(cfg_path), _YAML_ALLOWED,
                          problem=f"{os.fspath(cfg_path)!r} has no 'fault_tolerance:' mapping")
    return section


def write_yaml(values: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``{"fault_tolerance": values}`` atomically (temp file + fsync + rename)."""
    import yaml

    from ft_core.utils.fileutil import atomic_write_text

    atomic_write_text(path, yaml.safe_dump({"fault_tolerance": dict(values)}, sort_keys=False))


# -- argparse -----------------------------------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser, fields: Iterable[dataclasses.Field[Any]],
              help_texts: Mapping[str, str]) -> argparse.ArgumentParser:
    """Add ``--ft-cfg-path`` and one ``--ft-<field>`` flag per field (its help: ``help_texts[name]``).

    ``--ft-rank-heartbeat-timeout``, ``--ft-rank_heartbeat_timeout`` and the
    NVRx spelling ``--ft-param-rank-heartbeat-timeout`` all set the same field.
    The keys of :data:`NVRX_ONLY_KEYS` get hidden flags of the same forms, so an
    NVRx command line works (they are skipped with a warning). Values are
    strings here; the config checks them.
    """
    import argparse

    group = parser.add_argument_group("fault tolerance", "Override fields of FaultToleranceConfig.")
    group.add_argument(
        "--ft-cfg-path", "--ft_cfg_path", dest="ft_cfg_path", default=None,
        help="YAML file; its first 'fault_tolerance:' mapping (at any depth) is read.",
    )
    for field in fields:
        group.add_argument(
            *_flag_spellings(field.name), dest=f"ft_{field.name}", default=None, metavar="VALUE",
            help=help_texts[field.name] + f" (default: {_default_text(field)})",
        )
    for key in sorted(NVRX_ONLY_KEYS):
        group.add_argument(*_flag_spellings(key), dest=f"ft_{key}", default=None, help=argparse.SUPPRESS)
    return parser


def flag_values(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """Defaults < YAML (``args.ft_cfg_path``) < ``--ft-<field>`` flags, as the mapping of the keys given.

    A YAML file without a ``fault_tolerance:`` mapping gives the flags alone, with
    a warning (as NVRx); a missing or unreadable file is a :class:`ConfigError`
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
    for name in (*names, *sorted(NVRX_ONLY_KEYS)):
        flag_value = getattr(args, f"ft_{name}", None)
        if flag_value is not None:
            values[name] = flag_value
    return values


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


def _described_unknown_keys(keys: Sequence[Any], names: Collection[str]) -> str:
    """``'rank_heartbeat_timout' (did you mean 'rank_heartbeat_timeout'?), 'zzz'``."""
    described = []
    for key in keys:
        close = difflib.get_close_matches(str(key), [*names, *NVRX_ONLY_KEYS], n=1)
        described.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ", ".join(described)


def _unknown_keys_error(typos: Sequence[Any], nvrx_only: Sequence[str], names: Collection[str]) -> ConfigError:
    problems = []
    if typos:
        problems.append("unknown key(s) " + _described_unknown_keys(typos, names))
    if nvrx_only:
        problems.append("key(s) of NVRx's FaultToleranceConfig that ft-suite does not implement: "
                        + ", ".join(map(repr, nvrx_only)) + " (ignore_not_recognized=True skips them with a warning)")
    return ConfigError("fault_tolerance", [*typos, *nvrx_only], "keys " + ", ".join(sorted(names)),
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
