"""ft_launcher's own flags: parsing, defaults, and a clear error for a bad value of every flag.

A bare ``argparse`` parser with ``add_launcher_args`` (no torch import); the
whole command line (torchrun's parser, exit code 2) is covered by
tests/integration/ft_core/launcher/test_cli.py.
"""

from __future__ import annotations

import argparse

import pytest

from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.launcher.options import DEFAULT_NO_RESTART_EXIT_CODE, LauncherOptions, add_launcher_args
from ft_core.utils.validation import ValidationError


@pytest.fixture(autouse=True)
def _no_torch_shutdown_timeout(monkeypatch):
    """The defaults users get: torch's variable only where a test sets it."""
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)


def _options(*argv: str) -> LauncherOptions:
    """Parse with the launcher's flags and the config's ``--ft-*`` flags, as ft_launcher does."""
    parser = argparse.ArgumentParser()
    FaultToleranceConfig.add_argparse_args(parser)
    add_launcher_args(parser)
    args = parser.parse_args(list(argv))
    return LauncherOptions.from_args(args, FaultToleranceConfig.from_args(args))


def test_defaults_match_the_dataclass():
    assert _options() == LauncherOptions()
    assert LauncherOptions().no_restart_exit_code == DEFAULT_NO_RESTART_EXIT_CODE == 93


def test_values_and_both_spellings_are_parsed(tmp_path):
    options = _options("--term-timeout=0", "--workers_stop_timeout", " 2.5", "--ft-no-restart-exit-code=3",
                       "--ft_max_no_progress_cycles=0", f"--ft-checkpoint-iteration-file={tmp_path / 'it'}",
                       f"--ft-events-file={tmp_path / 'logs' / 'ev.jsonl'}")
    assert options == LauncherOptions(
        term_timeout=0.0, workers_stop_timeout=2.5, no_restart_exit_code=3, max_no_progress_cycles=0,
        checkpoint_iteration_file=str(tmp_path / "it"), events_file=str(tmp_path / "logs" / "ev.jsonl"))
    # --ft-events-file= means "the default path"; an empty config flag is an error (test_config_bad_values).
    assert _options("--ft-events-file=").events_file is None


@pytest.mark.parametrize(("flag", "value", "allowed"), [
    ("--term-timeout", "soon", "a number of seconds >= 0"),
    ("--term-timeout", "-1", "a number of seconds >= 0"),
    ("--term-timeout", "inf", "a number of seconds >= 0"),
    ("--workers-stop-timeout", "-2", "a number of seconds >= 0"),
    ("--workers-stop-timeout", "nan", "a number of seconds >= 0"),
    ("--ft-no-restart-exit-code", "0", "an integer from 1 to 255"),
    ("--ft-no-restart-exit-code", "256", "an integer from 1 to 255"),
    ("--ft-no-restart-exit-code", "9.5", "an integer from 1 to 255"),
])
def test_bad_value_of_every_flag_names_the_flag_the_value_and_what_is_allowed(flag, value, allowed):
    with pytest.raises(ValidationError) as info:
        _options(f"{flag}={value}")
    assert str(info.value) == f"{flag}: invalid value {value!r}; allowed: {allowed}"


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(ValidationError, match="^--ft-events-file: '.*' is a directory; allowed: a file path$"):
        _options(f"--ft-events-file={tmp_path}")
    with pytest.raises(ConfigError, match="^fault_tolerance.checkpoint_iteration_file: '.*' is a directory; "
                                          "allowed: a file path, or none$"):
        _options(f"--ft-checkpoint-iteration-file={tmp_path}")


# -- the no-progress rule: config keys, from the YAML file or the --ft-* flags -------------------


@pytest.mark.parametrize("flag", ["--ft-max-no-progress-cycles", "--ft-max_no_progress_cycles",
                                  "--ft_max_no_progress_cycles", "--ft-param-max-no-progress-cycles"])
def test_progress_flags_keep_every_spelling(flag):
    assert _options(f"{flag}=7").max_no_progress_cycles == 7


def test_progress_settings_come_from_the_yaml_when_no_flag_is_given(tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text(f"fault_tolerance:\n  max_no_progress_cycles: 1\n  min_progress_iterations: 50\n"
                    f"  checkpoint_iteration_file: {tmp_path / 'latest.txt'}\n")
    options = _options(f"--ft-cfg-path={path}")
    assert (options.max_no_progress_cycles, options.min_progress_iterations) == (1, 50)
    assert options.checkpoint_iteration_file == str(tmp_path / "latest.txt")
    # A flag wins over the file.
    options = _options(f"--ft-cfg-path={path}", "--ft-max-no-progress-cycles=4",
                       f"--ft-checkpoint-iteration-file={tmp_path / 'other.txt'}")
    assert (options.max_no_progress_cycles, options.min_progress_iterations) == (4, 50)
    assert options.checkpoint_iteration_file == str(tmp_path / "other.txt")


def test_progress_defaults_are_nvrx_defaults():
    options = _options()
    assert (options.max_no_progress_cycles, options.min_progress_iterations) == (3, 1)
    assert options.checkpoint_iteration_file is None


@pytest.mark.parametrize(("flag", "value", "allowed"), [
    ("--ft-max-no-progress-cycles", "-2", "an integer from -1 to 2147483647"),
    ("--ft-max-no-progress-cycles", "many", "an integer from -1 to 2147483647"),
    ("--ft-min-progress-iterations", "0", "an integer from 1 to 2147483647"),
    ("--ft-checkpoint-iteration-file", "", "a file path, or none"),
])
def test_bad_progress_values_name_the_key(flag, value, allowed):
    key = flag.removeprefix("--ft-").replace("-", "_")
    with pytest.raises(ConfigError, match=rf"^fault_tolerance.{key}: .*{value!r}.*; allowed: {allowed}$"):
        _options(f"{flag}={value}")


def test_minus_one_disables_the_rule_as_in_nvrx():
    assert _options("--ft-max-no-progress-cycles=-1").max_no_progress_cycles == -1
    assert not FaultToleranceConfig(max_no_progress_cycles=-1).is_progress_tracking_enabled
    assert not FaultToleranceConfig(max_no_progress_cycles=0).is_progress_tracking_enabled
    assert FaultToleranceConfig().is_progress_tracking_enabled


# -- torchrun's --shutdown-timeout: honoured, never silently replaced ------------------------------


def _options_with_torchrun_shutdown(*argv: str) -> LauncherOptions:
    """As :func:`_options`, plus torchrun's ``--shutdown-timeout`` (default None: not given)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--shutdown-timeout", "--shutdown_timeout", type=int, default=None)
    FaultToleranceConfig.add_argparse_args(parser)
    add_launcher_args(parser)
    args = parser.parse_args(list(argv))
    return LauncherOptions.from_args(args, FaultToleranceConfig.from_args(args))


def test_torchrun_shutdown_timeout_sets_both_grace_periods():
    options = _options_with_torchrun_shutdown("--shutdown-timeout=40")
    assert (options.term_timeout, options.workers_stop_timeout) == (40.0, 40.0)
    untouched = _options_with_torchrun_shutdown()
    assert (untouched.term_timeout, untouched.workers_stop_timeout) == (1800.0, 5.0)


def test_a_flag_of_ours_beside_torchrun_shutdown_timeout_wins_for_its_own_phase():
    options = _options_with_torchrun_shutdown("--shutdown-timeout=40", "--workers-stop-timeout=3")
    assert (options.term_timeout, options.workers_stop_timeout) == (40.0, 3.0)
    with pytest.raises(ValidationError, match="^--shutdown-timeout: invalid value -1"):
        _options_with_torchrun_shutdown("--shutdown-timeout=-1")


def test_a_preemption_save_gets_nvrx_s_grace_period_by_default():
    # A rank saving for minutes after SIGTERM must not be killed mid-save; SLURM's KillWait and
    # Kubernetes' grace period bound the wait anyway.
    assert _options().term_timeout == LauncherOptions().term_timeout == 1800.0


def test_torch_elastic_shutdown_timeout_is_the_default_of_torchrun_s_flag(monkeypatch):
    # Precedence: --term-timeout > --shutdown-timeout > $TORCH_ELASTIC_SHUTDOWN_TIMEOUT > 1800 (as torch reads it).
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "45")
    options = _options_with_torchrun_shutdown()
    assert (options.term_timeout, options.workers_stop_timeout) == (45.0, 45.0)
    options = _options_with_torchrun_shutdown("--shutdown-timeout=40")
    assert (options.term_timeout, options.workers_stop_timeout) == (40.0, 40.0)
    options = _options_with_torchrun_shutdown("--shutdown-timeout=40", "--term-timeout=20")
    assert (options.term_timeout, options.workers_stop_timeout) == (20.0, 40.0)
    options = _options_with_torchrun_shutdown("--term-timeout=20", "--workers-stop-timeout=2")
    assert (options.term_timeout, options.workers_stop_timeout) == (20.0, 2.0)


@pytest.mark.parametrize("value", ["-1", "abc", "", "2.5", "inf"])
def test_a_bad_torch_elastic_shutdown_timeout_names_the_variable(monkeypatch, value):
    # torch itself reads the variable with int() (and accepts -1): only whole seconds >= 0 are allowed.
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", value)
    with pytest.raises(ValidationError, match=rf"^TORCH_ELASTIC_SHUTDOWN_TIMEOUT: invalid value {value!r}; "
                                              r"allowed: a whole number of seconds >= 0"):
        _options_with_torchrun_shutdown()
    # Given, torchrun's flag is used instead: the variable is not read (as in torch).
    assert _options_with_torchrun_shutdown("--shutdown-timeout=7").term_timeout == 7.0


def test_the_fault_policy_rules_are_flags_and_zero_switches_each_off():
    assert (_options().suspect_checkpoint_steps, _options().suspect_node_faults) == (10, 3)
    options = _options("--ft-suspect-checkpoint-steps=0", "--ft-suspect-node-faults=5", "--ft-max-identical-faults=0")
    assert (options.max_identical_faults, options.suspect_checkpoint_steps, options.suspect_node_faults) == (0, 0, 5)
