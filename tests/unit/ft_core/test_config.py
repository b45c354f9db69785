"""FaultToleranceConfig: loaders, precedence and every kind of bad value."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal

import pytest

from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.config_fallback import with_fallback
from ft_core.config_loading import LoadedConfig, load_args, load_json, load_mapping, load_yaml_file


def test_defaults_match_the_design():
    cfg = FaultToleranceConfig()
    assert cfg.initial_rank_heartbeat_timeout == 3600.0
    assert cfg.rank_heartbeat_timeout == 2700.0
    assert cfg.safety_factor == 5.0
    assert cfg.rank_termination_signal is signal.SIGKILL
    assert cfg.skip_section_response is True
    assert cfg.rank_section_timeouts == {}
    assert cfg.rank_out_of_section_timeout is None
    assert cfg.num_warmup_iterations == 5  # as NVRx
    assert cfg.log_level == logging.INFO and type(cfg.log_level) is int
    assert (cfg.max_no_progress_cycles, cfg.min_progress_iterations, cfg.checkpoint_iteration_file) == (3, 1, None)


def test_from_kwargs_parses_strings_none_and_signals():
    cfg = FaultToleranceConfig.from_kwargs(
        rank_heartbeat_timeout="none", initial_rank_heartbeat_timeout="12.5",
        rank_section_timeouts="step:30, checkpointing:null", rank_termination_signal="term",
        stack_dump_signal=None, log_level="debug", skip_section_response="false", num_warmup_iterations="3",
    )
    assert cfg.rank_heartbeat_timeout is None
    assert cfg.initial_rank_heartbeat_timeout == 12.5
    assert cfg.rank_section_timeouts == {"step": 30.0, "checkpointing": None}
    assert cfg.rank_termination_signal is signal.SIGTERM
    assert cfg.stack_dump_signal is None
    assert cfg.log_level == logging.DEBUG
    assert cfg.skip_section_response is False
    assert cfg.num_warmup_iterations == 3
    assert FaultToleranceConfig(rank_termination_signal=15).rank_termination_signal is signal.SIGTERM
    assert FaultToleranceConfig(rank_termination_signal=signal.SIGHUP).rank_termination_signal is signal.SIGHUP


def test_unknown_key_is_rejected_with_a_suggestion_and_the_allowed_keys_when_not_ignored():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'rank_hearbeat_timeout' \(did you mean "
                                          r"'rank_heartbeat_timeout'\?\); allowed: keys .*rank_heartbeat_timeout"):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, rank_hearbeat_timeout=3)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'something_else'; allowed"):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, something_else=1)


def test_unknown_keys_are_skipped_by_default_as_nvrx_does_and_a_misspelling_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="ft_core.config"):
        cfg = FaultToleranceConfig.from_kwargs(rank_hearbeat_timeout=3, something_else=1, safety_factor=2)
    assert cfg == FaultToleranceConfig(safety_factor=2)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning == ("fault_tolerance: ignoring unknown key(s) 'rank_hearbeat_timeout' (did you mean "
                       "'rank_heartbeat_timeout'?), 'something_else' (ignore_not_recognized=False makes them "
                       "an error)")


def test_yaml_finds_first_fault_tolerance_mapping_at_any_depth(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(
        "trainer:\n  max_steps: 10\n"
        "model:\n  callbacks:\n    - name: ft\n      fault_tolerance:\n"
        "        rank_heartbeat_timeout: 42\n        rank_section_timeouts: {step: 7, checkpointing: null}\n"
    )
    cfg = FaultToleranceConfig.from_yaml_file(path)
    assert cfg.rank_heartbeat_timeout == 42.0
    assert cfg.rank_section_timeouts == {"step": 7.0, "checkpointing": None}


def test_yaml_round_trip_is_atomic_and_lossless(tmp_path):
    cfg = FaultToleranceConfig(rank_heartbeat_timeout=None, rank_section_timeouts={"step": 3.0},
                               rank_termination_signal="SIGTERM", stack_dump_signal=None)
    path = tmp_path / "out.yaml"
    cfg.to_yaml_file(path)
    assert FaultToleranceConfig.from_yaml_file(path) == cfg
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]  # no temp file left behind


def test_yaml_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        FaultToleranceConfig.from_yaml_file(tmp_path / "missing.yaml")
    (tmp_path / "no_ft.yaml").write_text("trainer: {max_steps: 3}\n")
    with pytest.raises(ConfigError, match="no 'fault_tolerance:' mapping"):
        FaultToleranceConfig.from_yaml_file(tmp_path / "no_ft.yaml")
    (tmp_path / "broken.yaml").write_text("fault_tolerance: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        FaultToleranceConfig.from_yaml_file(tmp_path / "broken.yaml")
    (tmp_path / "bad_value.yaml").write_text("fault_tolerance: {safety_factor: -3}\n")
    with pytest.raises(ConfigError, match="safety_factor.*-3"):
        FaultToleranceConfig.from_yaml_file(tmp_path / "bad_value.yaml")


def _parse(argv):
    parser = FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser())
    return FaultToleranceConfig.from_args(parser.parse_args(argv))


def test_precedence_defaults_then_yaml_then_cli(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 100\n  safety_factor: 3\n  log_level: WARNING\n")
    cfg = _parse(["--ft-cfg-path", str(path), "--ft-rank-heartbeat-timeout", "7",
                  "--ft-param-safety_factor", "2.5", "--ft_rank_section_timeouts", "step:5"])
    assert cfg.rank_heartbeat_timeout == 7.0  # CLI beats YAML
    assert cfg.safety_factor == 2.5  # legacy NVRx spelling
    assert cfg.log_level == logging.WARNING  # YAML beats default
    assert cfg.initial_rank_heartbeat_timeout == 3600.0  # default
    assert cfg.rank_section_timeouts == {"step": 5.0}


def test_cli_none_disables_a_timeout_and_bad_cli_value_is_named():
    assert _parse(["--ft-rank-heartbeat-timeout", "none"]).rank_heartbeat_timeout is None
    with pytest.raises(ConfigError, match="rank_out_of_section_timeout.*'-4'"):
        _parse(["--ft-rank-out-of-section-timeout", "-4"])


def test_every_field_has_a_flag_and_help():
    parser = FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser())
    help_text = parser.format_help()
    for name in FaultToleranceConfig.field_names():
        assert f"--ft-{name.replace('_', '-')}" in help_text


# -- from_dict, the public API, and how values are written ---------------------------------------


def test_from_dict_reads_the_mapping():
    # It used to be an alias of from_kwargs, which bound the mapping to ``ignore_not_recognized``
    # and silently returned the defaults.
    cfg = FaultToleranceConfig.from_dict({"rank_heartbeat_timeout": 5, "rank_section_timeouts": "step:3"})
    assert cfg.rank_heartbeat_timeout == 5.0
    assert cfg.rank_section_timeouts == {"step": 3.0}
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'rank_hearbeat_timeout'"):
        FaultToleranceConfig.from_dict({"rank_hearbeat_timeout": 5}, ignore_not_recognized=False)
    assert FaultToleranceConfig.from_dict({"rank_hearbeat_timeout": 5}) == FaultToleranceConfig()  # skipped
    assert FaultToleranceConfig.from_dict({"segment": 4}) == FaultToleranceConfig()  # an NVRx key: skipped
    with pytest.raises(ConfigError, match=r"fault_tolerance: invalid value \[1\]; allowed: a mapping"):
        FaultToleranceConfig.from_dict([1])  # type: ignore[arg-type]


def test_from_dict_through_the_package_top():
    from ft_core import FaultToleranceConfig as Exported

    assert Exported is FaultToleranceConfig
    assert Exported.from_dict({"rank_heartbeat_timeout": 5, "log_level": "debug"}).rank_heartbeat_timeout == 5.0


def test_every_accepted_text_form():
    cfg = FaultToleranceConfig.from_dict({
        "rank_heartbeat_timeout": " 7 ", "initial_rank_heartbeat_timeout": "off",
        "rank_out_of_section_timeout": "NULL", "safety_factor": "1e1", "install_exception_hook": "Yes",
        "skip_section_response": "0", "rank_termination_signal": "9", "stack_dump_signal": "usr1",
        "num_warmup_iterations": 2.0, "max_frame_bytes": "8192", "log_level": 30,
        "rank_section_timeouts": {"step": "4", "checkpointing": "none"},
    })
    assert (cfg.rank_heartbeat_timeout, cfg.initial_rank_heartbeat_timeout, cfg.rank_out_of_section_timeout) == (
        7.0, None, None)
    assert cfg.safety_factor == 10.0
    assert (cfg.install_exception_hook, cfg.skip_section_response) == (True, False)
    assert (cfg.rank_termination_signal, cfg.stack_dump_signal) == (signal.SIGKILL, signal.SIGUSR1)
    assert (cfg.num_warmup_iterations, cfg.max_frame_bytes) == (2, 8192)
    assert cfg.log_level == logging.WARNING
    assert cfg.rank_section_timeouts == {"step": 4.0, "checkpointing": None}


@pytest.mark.parametrize(("value", "level"), [
    ("debug", logging.DEBUG), ("DBG", logging.DEBUG), ("Info", logging.INFO), ("warn", logging.WARNING),
    ("WARNING", logging.WARNING), ("error", logging.ERROR), ("critical", logging.CRITICAL),
    (logging.WARNING, logging.WARNING), (15, 15), ("25", 25), (" 50 ", 50),
])
def test_log_level_takes_names_and_numbers_and_holds_the_int(value, level, tmp_path):
    cfg = FaultToleranceConfig(log_level=value)
    assert cfg.log_level == level and type(cfg.log_level) is int  # as NVRx: a plain int
    logger = logging.getLogger("ft_test_config_level")
    logger.setLevel(cfg.log_level)
    assert logger.level == level
    assert cfg.to_dict()["log_level"] == level and type(cfg.to_dict()["log_level"]) is int
    cfg.to_yaml_file(tmp_path / "c.yaml")
    assert FaultToleranceConfig.from_yaml_file(tmp_path / "c.yaml").log_level == level
    assert load_json(LoadedConfig(cfg).to_json()).cfg.log_level == level


# -- which keys the user set: beside the config, not inside it ---------------------------------------


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
