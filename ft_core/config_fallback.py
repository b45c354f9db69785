"""The fallback policy: which config keys a rank may offer the node monitor, and how they merge.

A rank's integration (the Lightning callback's ``config=``, a Hydra recipe's
``fault_tolerance`` block) may offer values for the timeout keys
(:data:`FALLBACK_FIELDS`, :func:`fallback_of`) with its handshake; the monitor
completes its own config with them (:func:`with_fallback`), except where the
launcher's user set a key: the keys set at launch travel with the config
(:class:`ft_core.config_loading.LoadedConfig`) and always win.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ft_core.config import ConfigError, FaultToleranceConfig, checked_value
from ft_core.config_loading import LoadedConfig

__all__ = ["FALLBACK_FIELDS", "fallback_of", "with_fallback"]

#: Fields a rank's integration may fill in when the launcher's user did not set them.
FALLBACK_FIELDS = (
    "initial_rank_heartbeat_timeout", "rank_heartbeat_timeout", "rank_section_timeouts",
    "rank_out_of_section_timeout", "safety_factor", "min_calculated_timeout", "num_warmup_iterations",
    "skip_section_response", "compile_timeout",
)


def fallback_of(cfg: FaultToleranceConfig) -> dict[str, Any]:
    """The values of ``cfg`` a rank offers the monitor: its :data:`FALLBACK_FIELDS`, JSON-safe.

    >>> sorted(fallback_of(FaultToleranceConfig())) == sorted(FALLBACK_FIELDS)
    True
    """
    values = cfg.to_dict()
    return {key: values[key] for key in FALLBACK_FIELDS}


def with_fallback(launched: LoadedConfig, fallback: Mapping[str, Any]) -> FaultToleranceConfig:
    """The config of ``launched`` completed by a rank's ``fallback`` values: the keys set at launch win.

    The keys set at launch are :attr:`~ft_core.config_loading.LoadedConfig.explicit_keys`
    (YAML keys, ``--ft-*`` flags, mapping keys), whatever their values; a flag that repeats
    the default still wins. Every other key of ``fallback`` is taken. Sections
    merge per name, the launch-time entry winning. This lets one training
    config (e.g. a Hydra recipe's ``fault_tolerance`` block) drive a launcher
    started without ``--ft-cfg-path``. Every offered value is checked, also
    where the launch value wins: a rank's bad config is reported, not hidden.

    Raises:
        ConfigError: for a key a rank may not set or an invalid value.
    """
    unknown = sorted(set(fallback) - set(FALLBACK_FIELDS))
    if unknown:
        raise ConfigError("fallback config", unknown, "keys " + ", ".join(FALLBACK_FIELDS),
                          problem=f"keys {unknown} cannot come from a rank")
    requested = {key: checked_value(key, value) for key, value in fallback.items()}
    cfg = launched.cfg
    changes = {key: value for key, value in requested.items() if key not in launched.explicit_keys}
    if "rank_section_timeouts" in requested:
        changes["rank_section_timeouts"] = {**requested["rank_section_timeouts"], **cfg.rank_section_timeouts}
    return dataclasses.replace(cfg, **changes) if changes else cfg
