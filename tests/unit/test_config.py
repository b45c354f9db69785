"""FaultToleranceConfig: loaders, precedence and every kind of bad value."""

from __future__ import annotations

import argparse
import signal

import pytest

from ft_core.config import ConfigError, FaultToleranceConfig


def test_defaults_match_the_design():
    cfg = FaultToleranceConfig()
    assert cfg.initial_rank_heartbeat_timeout == 3600.0
    assert cfg.rank_heartbeat_timeout == 2700.0
    assert cfg.safety_factor == 5.0
    assert cfg.rank_termination_signal is signal.SIGKILL
    assert cfg.skip_section_response is True
    assert cfg.rank_section_timeouts == {}
    assert cfg.rank_out_of_section_timeout is None


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
    assert cfg.log_level == "DEBUG"
    assert cfg.skip_section_response is False
    assert cfg.num_warmup_iterations == 3
    assert FaultToleranceConfig(rank_termination_signal=15).rank_termination_signal is signal.SIGTERM
    assert FaultToleranceConfig(rank_termination_signal=signal.SIGINT).rank_termination_signal is signal.SIGINT


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("rank_heartbeat_timeout", -1, "positive number"),
        ("rank_heartbeat_timeout", 0, "positive number"),
        ("initial_rank_heartbeat_timeout", "soon", "positive number"),
        ("rank_out_of_section_timeout", True, "positive number"),
        ("safety_factor", None, "positive number"),
        ("workload_check_interval", "nan", "positive number"),
        ("rank_section_timeouts", "step=3", "name:seconds"),
        ("rank_section_timeouts", {"step": -2}, "positive number"),
        ("rank_section_timeouts", [1, 2], "mapping"),
        ("rank_termination_signal", "SIGNOPE", "signal name"),
        ("rank_termination_signal", 999, "signal name"),
        ("stack_dump_signal", "bogus", "signal name"),
        ("log_level", "LOUD", "DEBUG, INFO"),
        ("skip_section_response", "maybe", "true or false"),
        ("num_warmup_iterations", -1, "integer >= 0"),
        ("num_warmup_iterations", 1.5, "integer >= 0"),
        ("max_frame_bytes", 10, ">= 4096"),
    ],
)
def test_bad_values_name_key_value_and_allowed(key, value, allowed):
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig.from_kwargs(**{key: value})
    message = str(info.value)
    assert key.split(".")[0] in message
    shown = next(iter(value.values())) if isinstance(value, dict) else value
    assert repr(shown) in message
    assert allowed in message


def test_unknown_key_is_rejected_with_the_allowed_keys():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'rank_hearbeat_timeout'.*rank_heartbeat_timeout"):
        FaultToleranceConfig.from_kwargs(rank_hearbeat_timeout=3)
    cfg = FaultToleranceConfig.from_kwargs(ignore_not_recognized=True, something_else=1)
    assert cfg == FaultToleranceConfig()


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
    with pytest.raises(ConfigError, match="does not exist"):
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
    assert cfg.log_level == "WARNING"  # YAML beats default
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
