"""NVRx compatibility of FaultToleranceConfig: NVRx's YAML files, parameters, flags, log levels and defaults.

``tests/fixtures/nvrx_ft_config.yaml`` is written in NVRx's format with every key
of NVRx's ``FaultToleranceConfig``; NVRx itself loads it (checked by hand against
its ``config.py``: it reads every key and ignores ``use_infra_group_rank``, a
0.5-only key, by its default ``ignore_not_recognized=True``).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
import os
import signal

import pytest
import yaml
from helpers import REPO_ROOT

from ft_core.config import NVRX_ONLY_KEYS, ConfigError, FaultToleranceConfig
from ft_core.config_loading import LoadedConfig, load_args, load_json, load_mapping, load_yaml_file

FIXTURE = os.path.join(REPO_ROOT, "tests", "fixtures", "nvrx_ft_config.yaml")
CONFIG_LOGGER = "ft_core.config"


def _fixture_section() -> dict:
    with open(FIXTURE, encoding="utf-8") as handle:
        return yaml.safe_load(handle)["fault_tolerance"]


def _config_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == CONFIG_LOGGER and r.levelno == logging.WARNING]


def _parse(argv: list[str]) -> FaultToleranceConfig:
    parser = FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser())
    return FaultToleranceConfig.from_args(parser.parse_args(argv))


def test_the_fixture_has_every_nvrx_key():
    keys = set(_fixture_section())
    assert NVRX_ONLY_KEYS <= keys
    implemented_by_nvrx_too = keys - NVRX_ONLY_KEYS
    assert implemented_by_nvrx_too <= set(FaultToleranceConfig.field_names())
    for key in ("max_no_progress_cycles", "min_progress_iterations", "checkpoint_iteration_file",
                "num_warmup_iterations", "install_exception_hook", "skip_section_response"):
        assert key in implemented_by_nvrx_too


def test_nvrx_yaml_loads_and_the_implemented_keys_take_effect_with_one_warning(caplog):
    caplog.set_level(logging.WARNING, logger=CONFIG_LOGGER)
    loaded = load_yaml_file(FIXTURE)  # FaultToleranceConfig.from_yaml_file's config, and the keys set beside it
    cfg = loaded.cfg
    assert (cfg.initial_rank_heartbeat_timeout, cfg.rank_heartbeat_timeout) == (90.0, 4.0)
    assert cfg.rank_section_timeouts == {"setup": 600.0, "step": 180.0, "checkpointing": None}
    assert cfg.rank_out_of_section_timeout is None
    assert (cfg.safety_factor, cfg.rank_termination_signal, cfg.log_level) == (4.0, signal.SIGKILL, logging.INFO)
    assert (cfg.max_no_progress_cycles, cfg.min_progress_iterations, cfg.checkpoint_iteration_file) == (1, 5, None)
    assert cfg.num_warmup_iterations == 2
    assert loaded.explicit_keys == set(_fixture_section()) - NVRX_ONLY_KEYS
    (warning,) = _config_warnings(caplog)
    listed = set(warning.split(": ", 2)[-1].split(", "))
    assert listed == NVRX_ONLY_KEYS  # each key NVRx has and we do not, once


def test_strict_loading_rejects_the_nvrx_only_keys():
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig.from_yaml_file(FIXTURE, ignore_not_recognized=False)
    message = str(info.value)
    assert "of NVRx's FaultToleranceConfig that ft-suite does not implement" in message
    assert all(repr(key) in message for key in NVRX_ONLY_KEYS)
    with pytest.raises(ConfigError, match=r"does not implement: 'segment'"):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, segment=4)


def test_a_key_neither_knows_is_skipped_as_nvrx_does_with_a_suggestion(tmp_path, caplog):
    # NVRx ignores both typos silently; here they are ignored too, but a misspelt timeout is named.
    path = tmp_path / "typo.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timout: 30\n  enable_nic_monitr: false\n"
                    "  enable_nic_monitor: false\n")
    with caplog.at_level(logging.WARNING, logger="ft_core.config"):
        assert FaultToleranceConfig.from_yaml_file(path) == FaultToleranceConfig()
    unknown = [w for w in _config_warnings(caplog) if "unknown key(s)" in w]
    assert len(unknown) == 1
    assert "'rank_heartbeat_timout' (did you mean 'rank_heartbeat_timeout'?)" in unknown[0]
    assert "'enable_nic_monitr' (did you mean 'enable_nic_monitor'?)" in unknown[0]
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig.from_yaml_file(path, ignore_not_recognized=False)
    assert str(info.value).startswith("fault_tolerance: unknown key(s) 'rank_heartbeat_timout' (did you mean")
    with pytest.raises(ConfigError, match=r"'safety_facter' \(did you mean 'safety_factor'\?\)"):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, safety_facter=2)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'zzz'; allowed: keys "):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, zzz=1)  # nothing close: no suggestion


def test_loaders_take_nvrx_parameters_with_nvrx_defaults():
    for loader, first in ((FaultToleranceConfig.from_yaml_file, "cfg_path"),
                          (FaultToleranceConfig.from_kwargs, "ignore_not_recognized")):
        parameters = inspect.signature(loader).parameters
        assert next(iter(parameters)) == first
        assert parameters["ignore_not_recognized"].default is True


def test_from_kwargs_skips_nvrx_keys_with_one_warning(caplog):
    caplog.set_level(logging.WARNING, logger=CONFIG_LOGGER)
    cfg = FaultToleranceConfig.from_kwargs(rank_heartbeat_timeout=7, enable_nic_monitor=True, segment=4)
    assert cfg.rank_heartbeat_timeout == 7.0
    assert _config_warnings(caplog) == [
        "fault_tolerance: 2 key(s) of NVRx's FaultToleranceConfig that ft-suite does not implement are kept as "
        "attributes with no effect: enable_nic_monitor, segment"]
    assert load_mapping({"rank_heartbeat_timeout": 7, "segment": 4}).explicit_keys == {"rank_heartbeat_timeout"}


def test_nvrx_flags_for_unimplemented_keys_are_accepted_with_the_same_warning(caplog, tmp_path):
    caplog.set_level(logging.WARNING, logger=CONFIG_LOGGER)
    path = tmp_path / "ft.yaml"
    path.write_text("fault_tolerance:\n  restart_check_interval: 30\n")
    cfg = _parse([f"--ft-cfg-path={path}", "--ft-enable-nic-monitor=false", "--ft-param-segment=4",
                  "--ft-gpu_memory_reclaim_timeout=10", "--ft-rank-heartbeat-timeout=5"])
    assert cfg.rank_heartbeat_timeout == 5.0
    (warning,) = _config_warnings(caplog)  # one warning for the file and the flags together
    assert warning.endswith("enable_nic_monitor, gpu_memory_reclaim_timeout, restart_check_interval, segment")
    # They stay out of --help: they do nothing here.
    help_text = FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser()).format_help()
    assert "--ft-enable-nic-monitor" not in help_text


def test_yaml_without_a_fault_tolerance_section(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=CONFIG_LOGGER)
    path = tmp_path / "trainer_only.yaml"
    path.write_text("trainer:\n  max_steps: 10\n")
    # As NVRx's from_args: the defaults plus the flags, with a warning here.
    parser = FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser())
    loaded = load_args(parser.parse_args([f"--ft-cfg-path={path}", "--ft-safety-factor=3"]))
    assert loaded == LoadedConfig(FaultToleranceConfig(safety_factor=3), frozenset({"safety_factor"}))
    (warning,) = _config_warnings(caplog)
    assert str(path) in warning and "no 'fault_tolerance:' mapping" in warning
    # As NVRx's from_yaml_file: an error (a ValueError).
    with pytest.raises(ValueError, match=r"^cfg_path: '.*trainer_only.yaml' has no 'fault_tolerance:' mapping"):
        FaultToleranceConfig.from_yaml_file(path)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError) as info:
        FaultToleranceConfig.from_yaml_file(missing)
    assert info.value.filename == str(missing) and str(missing) in str(info.value)
    with pytest.raises(ConfigError, match=r"^--ft-cfg-path: '.*nope.yaml' does not exist; allowed: a YAML file"):
        _parse([f"--ft-cfg-path={missing}"])


@pytest.mark.parametrize(("value", "level"), [
    ("debug", 10), ("DBG", 10), ("dbg", 10), ("info", 20), ("Warning", 30), ("warn", 30), ("WARN", 30),
    ("error", 40), ("CRITICAL", 50), (10, 10), (35, 35), (50, 50),
])
def test_log_level_accepts_nvrx_names_and_numbers(value, level):
    assert FaultToleranceConfig.from_kwargs(log_level=value).log_level == level
    assert _parse([f"--ft-log-level={value}"]).log_level == level


def test_num_warmup_iterations_defaults_to_nvrx_value():
    assert FaultToleranceConfig().num_warmup_iterations == 5
    assert FaultToleranceConfig(num_warmup_iterations=0).num_warmup_iterations == 0


def test_nvrx_termination_signal_sigusr2_moves_the_default_dump_signal_with_one_warning(caplog):
    # Valid in NVRx; SIGUSR2 is our default dump signal, which must differ from the termination signal.
    with caplog.at_level(logging.WARNING, logger=CONFIG_LOGGER):
        parser = FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser())
        loaded = load_args(parser.parse_args(["--ft-rank-termination-signal", "SIGUSR2"]))
        # What the monitor and the ranks receive carries the moved signal: no second warning there.
        again = load_json(loaded.to_json())
    cfg = loaded.cfg
    assert (cfg.rank_termination_signal, cfg.stack_dump_signal) == (signal.SIGUSR2, signal.SIGUSR1)
    assert again == loaded == LoadedConfig(cfg, frozenset({"rank_termination_signal"}))
    # A copy keeps the moved signal, and the clash check does not fire again.
    assert dataclasses.replace(cfg, log_level="debug").stack_dump_signal is signal.SIGUSR1
    (warning,) = _config_warnings(caplog)
    assert "rank_termination_signal is SIGUSR2" in warning and "stack dumps use SIGUSR1" in warning
    # A dump signal the user chose is kept, and the clash stays an error.
    assert FaultToleranceConfig(rank_termination_signal="SIGUSR2", stack_dump_signal=None).stack_dump_signal is None
    with pytest.raises(ConfigError, match=r"stack_dump_signal: SIGUSR2 is also rank_termination_signal"):
        FaultToleranceConfig(rank_termination_signal="SIGUSR2", stack_dump_signal="SIGUSR2")


def test_from_args_takes_an_nvrx_namespace_keeping_nvrx_only_values_readable():
    # NVRx's add_argparse_args gives ft_<key> for each of its keys; NVRx code reads its own keys back.
    url = "https://dataflow.example.test/index/posting"
    args = argparse.Namespace(ft_cfg_path=None, ft_safety_factor="0.567", ft_attribution_export_url=url,
                              ft_rank_section_timeouts="custom1:111.1,custom2:222.2", ft_not_a_key_anywhere="x")
    cfg = FaultToleranceConfig.from_args(args)
    assert (cfg.safety_factor, cfg.rank_section_timeouts) == (0.567, {"custom1": 111.1, "custom2": 222.2})
    assert cfg.attribution_export_url == url  # kept as given, no effect
    assert not hasattr(cfg, "not_a_key_anywhere")  # a namespace attribute of neither is not used
    assert "attribution_export_url" not in cfg.to_dict()  # nor passed on to the monitor


def test_assigning_sigusr2_termination_moves_the_default_dump_signal_and_the_yaml_round_trips(tmp_path):
    cfg = FaultToleranceConfig()
    cfg.rank_termination_signal = signal.SIGUSR2  # NVRx's tests set fields by assignment
    assert cfg.stack_dump_signal is signal.SIGUSR1  # moved, as the constructor does
    path = tmp_path / "ft.yaml"
    cfg.to_yaml_file(path)
    assert FaultToleranceConfig.from_yaml_file(path) == cfg
    # A dump signal the user assigned is chosen: it is not moved, and the clash stays an error.
    chosen = FaultToleranceConfig()
    chosen.stack_dump_signal = signal.SIGUSR2
    chosen.rank_termination_signal = signal.SIGUSR2
    assert chosen.stack_dump_signal is signal.SIGUSR2
    chosen.to_yaml_file(path)
    with pytest.raises(ConfigError, match=r"stack_dump_signal: SIGUSR2 is also rank_termination_signal"):
        FaultToleranceConfig.from_yaml_file(path)
