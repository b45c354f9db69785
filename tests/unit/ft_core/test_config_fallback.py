"""with_fallback: a rank's values fill in what the user did not set at launch; fallback_of: what a rank offers."""

from __future__ import annotations

import argparse
import signal

import pytest

from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.config_fallback import FALLBACK_FIELDS, fallback_of, with_fallback
from ft_core.config_loading import LoadedConfig, load_args, load_mapping


def _load(argv) -> LoadedConfig:
    return load_args(FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser()).parse_args(argv))


def test_explicit_flag_equal_to_the_default_wins_over_a_rank_fallback():
    launched = _load(["--ft-rank-heartbeat-timeout=2700"])  # the default value, given on purpose
    merged = with_fallback(launched, {"rank_heartbeat_timeout": 5.0})
    assert merged.rank_heartbeat_timeout == 2700.0


def test_unset_key_takes_the_rank_fallback():
    launched = _load(["--ft-rank-heartbeat-timeout=2700"])
    fallback = {"initial_rank_heartbeat_timeout": 60, "safety_factor": "2.5", "num_warmup_iterations": 3,
                "skip_section_response": False, "rank_out_of_section_timeout": 30}
    merged = with_fallback(launched, fallback)
    assert merged.initial_rank_heartbeat_timeout == 60.0
    assert (merged.safety_factor, merged.num_warmup_iterations) == (2.5, 3)
    assert merged.skip_section_response is False and merged.rank_out_of_section_timeout == 30.0
    # A key set to something else than the default still wins, and the input config is unchanged.
    assert with_fallback(load_mapping({"safety_factor": 7}), fallback).safety_factor == 7.0
    assert launched.cfg.safety_factor == 5.0


def test_yaml_key_equal_to_the_default_wins_over_a_rank_fallback(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 2700\n  rank_out_of_section_timeout: null\n")
    launched = _load(["--ft-cfg-path", str(path)])
    merged = with_fallback(launched, {"rank_heartbeat_timeout": 5, "rank_out_of_section_timeout": 9,
                                      "safety_factor": 2})
    assert merged.rank_heartbeat_timeout == 2700.0
    assert merged.rank_out_of_section_timeout is None  # "no timeout", set on purpose
    assert merged.safety_factor == 2.0


def test_sections_merge_per_name_and_the_launch_entry_wins():
    launched = _load(["--ft-rank-section-timeouts=step:9"])
    merged = with_fallback(launched, {"rank_section_timeouts": {"step": 1, "checkpointing": None}})
    assert merged.rank_section_timeouts == {"step": 9.0, "checkpointing": None}
    unset = with_fallback(load_mapping({}), {"rank_section_timeouts": "step:1"})
    assert unset.rank_section_timeouts == {"step": 1.0}


def test_fallback_keys_and_values_are_checked():
    with pytest.raises(ConfigError, match=r"fallback config: keys \['rank_termination_signal'\] cannot come from a "
                                          r"rank; allowed: keys initial_rank_heartbeat_timeout"):
        with_fallback(load_mapping({}), {"rank_termination_signal": "SIGTERM"})
    # Checked even where the launcher's value wins: a rank's bad config is reported, not hidden.
    with pytest.raises(ConfigError, match=r"fault_tolerance.safety_factor: invalid value -1"):
        with_fallback(load_mapping({"safety_factor": 5}), {"safety_factor": -1})
    with pytest.raises(ConfigError, match=r"fault_tolerance.rank_section_timeouts.step: invalid value 'x'"):
        with_fallback(load_mapping({}), {"rank_section_timeouts": {"step": "x"}})


def test_a_rank_offers_its_fallback_fields_and_the_monitor_builds_the_merged_config_once(monkeypatch):
    # fallback_of is the one filter of a rank's fields (the callback and the recipes use it); with_fallback
    # checks each offered value and builds the merged config once (it built the rank's and the merged one).
    offered = fallback_of(FaultToleranceConfig(rank_heartbeat_timeout=5, rank_termination_signal="SIGTERM"))
    assert sorted(offered) == sorted(FALLBACK_FIELDS) and offered["rank_heartbeat_timeout"] == 5.0
    built = []
    post_init = FaultToleranceConfig.__post_init__
    monkeypatch.setattr(FaultToleranceConfig, "__post_init__", lambda self: (built.append(1), post_init(self)))
    launched = load_mapping({"safety_factor": 7})
    built.clear()
    merged = with_fallback(launched, offered)
    assert len(built) == 1
    assert (merged.rank_heartbeat_timeout, merged.safety_factor) == (5.0, 7.0)
    assert merged.rank_termination_signal is signal.SIGKILL  # not a fallback field: never offered
