"""FaultToleranceConfig: loaders, precedence and every kind of bad value."""

from __future__ import annotations

import argparse
import logging
import signal

import pytest

from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.config_loading import LoadedConfig, load_json


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
