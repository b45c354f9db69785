"""Loading a ``FaultToleranceConfig``: YAML files, ``--ft-*`` flags, mappings, and the monitor's JSON.

Each loader returns a :class:`LoadedConfig`: the config and, beside it, the
keys the user set (:attr:`LoadedConfig.explicit_keys`: YAML keys, ``--ft-*``
flags, mapping keys, even when a value equals the default). The config itself
does not record them; the :class:`LoadedConfig` travels whole from the loader to
the node monitor (``ft_launcher``'s command line, ``launch``, ``NodeMonitor``,
``run_in_subprocess``, ``python -m ft_core.monitor --config-json``), where
:func:`ft_core.config_fallback.with_fallback` lets exactly those win over a
rank's fallback values.

    >>> loaded = load_mapping({"rank_heartbeat_timeout": "none", "rank_section_timeouts": "step:30"})
    >>> loaded.cfg.rank_heartbeat_timeout is None, sorted(loaded.explicit_keys)
    (True, ['rank_heartbeat_timeout', 'rank_section_timeouts'])

NVRx's loaders (``FaultToleranceConfig.from_yaml_file``, ``from_args``,
``from_kwargs``, ``from_dict``) return the config alone; these call them and add
the keys given. Where the values come from (YAML, flags) and which keys are
recognized is :mod:`ft_core.config_sources`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.config_sources import flag_values, yaml_section

if TYPE_CHECKING:
    import argparse

__all__ = ["LoadedConfig", "load_args", "load_json", "load_mapping", "load_yaml_file"]


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
    def of(cls, config: FaultToleranceConfig | LoadedConfig) -> LoadedConfig:
        """A config as loaded, as it is; a config given alone, with every key set at launch (it is taken
        as it is, so a rank's fallback values fill in nothing but section names)."""
        return config if isinstance(config, LoadedConfig) else cls(config, frozenset(config.field_names()))

    def replace(self, **changes: Any) -> LoadedConfig:
        """A validated copy with ``changes``, which become set at launch; the other keys keep their status."""
        return LoadedConfig(dataclasses.replace(self.cfg, **changes), self.explicit_keys | frozenset(changes))

    def to_json(self) -> str:
        """The values and the keys set, as JSON, for :func:`load_json` in another process (the node monitor)."""
        return json.dumps({"config": self.cfg.to_dict(), "explicit_keys": sorted(self.explicit_keys)})


def load_mapping(mapping: Mapping[str, Any], ignore_not_recognized: bool = True) -> LoadedConfig:
    """Build from a mapping of field names to values; the keys given that are fields are set at launch.

    ``ignore_not_recognized`` as in :meth:`FaultToleranceConfig.from_dict`, which builds the config.
    """
    cfg = FaultToleranceConfig.from_dict(mapping, ignore_not_recognized)
    return LoadedConfig(cfg, frozenset(key for key in mapping if key in _FIELD_NAMES))


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
    """Read the first ``fault_tolerance:`` mapping found at any depth of a YAML file; its keys are set at launch.

    ``ignore_not_recognized`` and the errors as in :meth:`FaultToleranceConfig.from_yaml_file`.
    """
    return load_mapping(yaml_section(cfg_path), ignore_not_recognized)


def load_args(args: argparse.Namespace) -> LoadedConfig:
    """Merge defaults < YAML (``args.ft_cfg_path``) < ``--ft-<field>`` flags
    (:func:`ft_core.config_sources.flag_values`); the YAML keys and the flags given are set at launch."""
    return load_mapping(flag_values(args, _FIELD_NAMES))


_FIELD_NAMES = frozenset(FaultToleranceConfig.field_names())
