"""Which keys the user set at launch (:mod:`ft_core.config_loading`): every loader returns the config with the keys
given, even those equal to the defaults, and they travel whole to the monitor."""

from __future__ import annotations

import argparse
import dataclasses
import logging

import pytest

from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.config_fallback import with_fallback
from ft_core.config_loading import LoadedConfig, load_args, load_json, load_mapping, load_yaml_file


def _parse(argv):
    return FaultToleranceConfig.from_args(FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser()).parse_args(argv))


def _load(argv) -> LoadedConfig:
    return load_args(FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser()).parse_args(argv))


def test_loaders_return_the_keys_that_were_set_even_when_equal_to_the_default(tmp_path):
    assert load_mapping({}).explicit_keys == frozenset()
    assert load_mapping({"rank_heartbeat_timeout": 2700.0}).explicit_keys == {"rank_heartbeat_timeout"}
    assert load_mapping({"log_level": "INFO"}) == LoadedConfig(FaultToleranceConfig(), frozenset({"log_level"}))
    path = tmp_path / "cfg.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 2700\n  safety_factor: 3\n")
    assert load_yaml_file(path).explicit_keys == {"rank_heartbeat_timeout", "safety_factor"}
    loaded = _load(["--ft-cfg-path", str(path), "--ft-initial-rank-heartbeat-timeout=3600"])
    assert loaded.explicit_keys == {"rank_heartbeat_timeout", "safety_factor", "initial_rank_heartbeat_timeout"}
    assert loaded.cfg == _parse(["--ft-cfg-path", str(path), "--ft-initial-rank-heartbeat-timeout=3600"])
    assert _load([]) == LoadedConfig(FaultToleranceConfig())


def test_the_config_itself_records_no_keys_so_a_copy_marks_none_as_set():
    # Issue 20: dataclasses.replace re-ran a constructor that recorded every key given to it as set at
    # launch; the config holds values only, and its copies equal the config they were made from.
    cfg = FaultToleranceConfig(rank_heartbeat_timeout=2700.0)
    assert not hasattr(cfg, "explicit_keys") and not hasattr(cfg, "_explicit_keys")
    assert dataclasses.replace(cfg) == cfg == dataclasses.replace(FaultToleranceConfig(), rank_heartbeat_timeout=2700)
    loaded = load_mapping({"rank_heartbeat_timeout": 2700.0})
    assert loaded.replace(log_level="debug").explicit_keys == {"rank_heartbeat_timeout", "log_level"}
    with pytest.raises(ConfigError, match="fault_tolerance.safety_factor: invalid value -1"):
        loaded.replace(safety_factor=-1)


def test_a_config_given_alone_counts_every_key_as_set():
    # RankMonitorServer(cfg) / run_in_subprocess(cfg) with a plain config: it is taken as it is;
    # a rank's fallback cannot loosen or tighten it, only add section names.
    cfg = FaultToleranceConfig(rank_heartbeat_timeout=50, rank_section_timeouts={"step": 9})
    alone = LoadedConfig.of(cfg)
    assert alone.explicit_keys == set(FaultToleranceConfig.field_names())
    launched = load_mapping({"safety_factor": 5})
    assert LoadedConfig.of(launched) is launched  # a config as loaded keeps the keys set at launch
    merged = with_fallback(alone, {"rank_heartbeat_timeout": 0.5, "safety_factor": 2,
                                   "rank_section_timeouts": {"step": 1, "checkpointing": 30}})
    assert (merged.rank_heartbeat_timeout, merged.safety_factor) == (50.0, 5.0)
    assert merged.rank_section_timeouts == {"step": 9.0, "checkpointing": 30.0}


def test_json_for_the_monitor_process_keeps_the_explicit_keys():
    loaded = _load(["--ft-rank-heartbeat-timeout=2700", "--ft-stack-dump-signal=none"])
    copy = load_json(loaded.to_json())
    assert copy == loaded and copy.explicit_keys == {"rank_heartbeat_timeout", "stack_dump_signal"}
    # A plain JSON object (by hand: python -m ft_core.monitor --config-json '{...}') sets its keys.
    plain = load_json('{"rank_heartbeat_timeout": 9}')
    assert plain.cfg.rank_heartbeat_timeout == 9.0 and plain.explicit_keys == {"rank_heartbeat_timeout"}
    with pytest.raises(ConfigError, match="fault_tolerance: invalid value '{oops'; allowed: a JSON object"):
        load_json("{oops")
    with pytest.raises(ConfigError, match=r"fault_tolerance.explicit_keys: invalid value \['nope'\]"):
        load_json('{"config": {}, "explicit_keys": ["nope"]}')


def test_verbose_launch_keeps_only_the_keys_set_at_launch(monkeypatch):
    # ft_launcher -v used to rebuild the config with dataclasses.replace, which re-ran the constructor and
    # marked every key as set at launch: every fallback value a rank sent was then ignored (issue 20).
    from ft_core.launcher import cli

    launched = {}

    def launch(config, entrypoint, cmd_args, loaded, options, *, head_start):
        launched.update(loaded=loaded)

    monkeypatch.setattr(cli, "launch", launch)
    assert cli.main(["-v", "--ft-rank-heartbeat-timeout=2700", "train.py"]) is None
    loaded = launched["loaded"]  # one value, the config and the keys set at launch, from the CLI to the monitor
    assert loaded.cfg.log_level == logging.DEBUG
    assert loaded.explicit_keys == {"rank_heartbeat_timeout", "log_level"}  # -v sets the log level at launch
    merged = with_fallback(loaded, {"rank_heartbeat_timeout": 0.5, "safety_factor": 2.5})
    assert (merged.rank_heartbeat_timeout, merged.safety_factor) == (2700.0, 2.5)
