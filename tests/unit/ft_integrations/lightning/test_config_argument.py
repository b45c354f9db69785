"""``FaultToleranceCallback(config=...)``: each form the argument takes, and the config of a run without one."""

from __future__ import annotations

import pytest

from ft_core.config import FaultToleranceConfig
from ft_integrations.lightning._pl import MisconfigurationException
from ft_integrations.lightning.config_argument import DEFAULT_SECTION_CONFIG, coerce_config, default_config
from ft_integrations.session import MonitoringMode


def test_every_form_becomes_a_config(tmp_path):
    cfg = FaultToleranceConfig(rank_heartbeat_timeout=30)
    assert coerce_config(cfg) is cfg and coerce_config(None) is None
    assert coerce_config({"rank_heartbeat_timeout": "30"}) == cfg
    path = tmp_path / "ft.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 30\n")
    assert coerce_config(path) == cfg and coerce_config(str(path)) == cfg


def test_a_bad_config_is_a_lightning_misconfiguration_naming_the_argument(tmp_path):
    with pytest.raises(MisconfigurationException, match=r"^FaultToleranceCallback\.config: invalid value 5; "
                                                        r"allowed: a FaultToleranceConfig, a mapping"):
        coerce_config(5)  # type: ignore[arg-type]
    with pytest.raises(MisconfigurationException,
                       match=r"^FaultToleranceCallback\.config: .*safety_factor: invalid value -1"):
        coerce_config({"safety_factor": -1})


def test_without_config_sections_mode_moves_the_heartbeat_timeouts_onto_the_sections():
    assert default_config(MonitoringMode.HEARTBEATS) == FaultToleranceConfig()
    sections = default_config(MonitoringMode.SECTIONS)
    assert (sections.rank_heartbeat_timeout, sections.initial_rank_heartbeat_timeout) == (None, None)
    assert sections.rank_section_timeouts == DEFAULT_SECTION_CONFIG["rank_section_timeouts"]
    assert sections.rank_out_of_section_timeout == FaultToleranceConfig().rank_heartbeat_timeout
    assert sections.rank_section_timeouts["setup"] == FaultToleranceConfig().initial_rank_heartbeat_timeout
