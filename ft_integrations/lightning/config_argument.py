"""``FaultToleranceCallback(config=...)``: the forms the argument takes, and the config a mode starts from without one."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional, Union

from ft_core.config import FaultToleranceConfig
from ft_core.utils.validation import ValidationError
from ft_integrations.lightning._pl import MisconfigurationException
from ft_integrations.session import MonitoringMode

__all__ = ["DEFAULT_SECTION_CONFIG", "coerce_config", "default_config"]

#: Timeouts of the node monitor the callback starts itself in ``mode="sections"`` (no ``config=``):
#: the heartbeat defaults, moved onto the sections. Learning shrinks them in the first run.
DEFAULT_SECTION_CONFIG: dict[str, Any] = {
    "rank_section_timeouts": {"setup": 3600.0, "step": 2700.0, "validation": 2700.0, "checkpointing": 2700.0},
    "rank_out_of_section_timeout": 2700.0,
    "initial_rank_heartbeat_timeout": None,
    "rank_heartbeat_timeout": None,
}


def coerce_config(
    config: Optional[Union[FaultToleranceConfig, Mapping[str, Any], str, os.PathLike[str]]],
) -> Optional[FaultToleranceConfig]:
    """``config=`` as a FaultToleranceConfig (None stays None: the run uses :func:`default_config`)."""
    name = "FaultToleranceCallback.config"
    try:
        if isinstance(config, FaultToleranceConfig) or config is None:
            return config
        if isinstance(config, Mapping):
            return FaultToleranceConfig.from_mapping(config)
        if isinstance(config, (str, os.PathLike)):
            return FaultToleranceConfig.from_yaml_file(config)
        raise ValidationError(name, config, "a FaultToleranceConfig, a mapping, a YAML path or None")
    except ValidationError as exc:
        raise MisconfigurationException(str(exc) if exc.name == name else f"{name}: {exc}") from None


def default_config(mode: MonitoringMode) -> FaultToleranceConfig:
    """The config of a run without ``config=``: the defaults, with the heartbeat timeouts moved onto the
    sections in ``mode="sections"``."""
    return FaultToleranceConfig.from_mapping(DEFAULT_SECTION_CONFIG) if mode is MonitoringMode.SECTIONS \
        else FaultToleranceConfig()
