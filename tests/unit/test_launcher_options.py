"""ft_launcher's own flags: parsing, defaults, and a clear error for a bad value of every flag.

A bare ``argparse`` parser with ``add_launcher_args`` (no torch import); the
whole command line (torchrun's parser, exit code 2) is covered by
tests/integration/test_launcher_cli.py.
"""

from __future__ import annotations

import argparse

import pytest

from ft_core.launcher.options import DEFAULT_NO_RESTART_EXIT_CODE, LauncherOptions, add_launcher_args
from ft_core.validation import ValidationError


def _options(*argv: str) -> LauncherOptions:
    parser = argparse.ArgumentParser()
    add_launcher_args(parser)
    return LauncherOptions.from_args(parser.parse_args(list(argv)))


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
    ("--ft-max-no-progress-cycles", "-1", "an integer >= 0"),
    ("--ft-max-no-progress-cycles", "many", "an integer >= 0"),
])
def test_bad_value_of_every_flag_names_the_flag_the_value_and_what_is_allowed(flag, value, allowed):
    with pytest.raises(ValidationError) as info:
        _options(f"{flag}={value}")
    assert str(info.value) == f"{flag}: invalid value {value!r}; allowed: {allowed}"


@pytest.mark.parametrize("flag", ["--ft-checkpoint-iteration-file", "--ft-events-file"])
def test_a_directory_is_not_a_file(flag, tmp_path):
    with pytest.raises(ValidationError, match=f"^{flag}: '.*' is a directory; allowed: a file path$"):
        _options(f"{flag}={tmp_path}")
