"""``FaultToleranceCallback(config=...)``: its forms, the config a mode starts from, and whether a config fits the mode."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional, Union

from ft_core.config import FaultToleranceConfig
from ft_core.utils.validation import ValidationError
from ft_integrations.lightning._pl import MisconfigurationException, rank_zero_warn
from ft_integrations.session import MonitoringMode, Section

__all__ = ["DEFAULT_SECTION_CONFIG", "SECTIONS", "coerce_config", "config_problem", "default_config"]

#: The sections the callback opens in ``mode="sections"``.
SECTIONS = (Section.SETUP, Section.STEP, Section.VALIDATION, Section.CHECKPOINTING)

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


def config_problem(cfg: FaultToleranceConfig, mode: MonitoringMode, calculate_timeouts: bool) -> Optional[str]:
    """Why the monitor's config ``cfg`` cannot work with ``mode`` (what to change), or None; warns of
    timeouts that have no effect in ``mode``."""
    sections = cfg.rank_section_timeouts
    if mode is MonitoringMode.HEARTBEATS:
        if cfg.rank_out_of_section_timeout is not None:
            return (f"rank_out_of_section_timeout={cfg.rank_out_of_section_timeout} is set, but "
                    "mode='heartbeats' opens no sections, so every rank would be killed that long after "
                    "it starts. Use mode='sections', or set --ft-rank-out-of-section-timeout=none")
        if cfg.initial_rank_heartbeat_timeout is None and cfg.rank_heartbeat_timeout is None and not calculate_timeouts:
            return ("mode='heartbeats' but initial_rank_heartbeat_timeout and rank_heartbeat_timeout are "
                    "both none and calculate_timeouts=False: nothing would be detected. Set "
                    "--ft-rank-heartbeat-timeout, or enable calculate_timeouts")
        if sections:
            rank_zero_warn(f"FaultToleranceCallback(mode='heartbeats') opens no sections; "
                           f"rank_section_timeouts {sorted(sections)} have no effect")
        return None
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        opened = [str(section) for section in SECTIONS]
        rank_zero_warn(f"FaultToleranceCallback(mode='sections') opens only {opened}; "
                       f"rank_section_timeouts {unknown} are never opened by it")
    if Section.STEP not in sections:
        return (f"mode='sections' needs 'step' in rank_section_timeouts (got {dict(sections)}); "
                "e.g. --ft-rank-section-timeouts=setup:600,step:180,validation:600,checkpointing:600")
    return None
