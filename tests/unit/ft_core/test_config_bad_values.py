"""Every FaultToleranceConfig field rejects a bad value of each kind, and hostile config files fail clearly.

The table has, for every field, a value of the wrong type, one out of range, an
empty one and a non-finite one; each must raise :class:`ConfigError` naming the
key, the value and what is allowed, given in Python or (when it is text) as a
``--ft-*`` flag.
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import time

import pytest

from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.protocol import MAX_FRAME_BYTES_LIMIT

INF, NAN = math.inf, math.nan
SECONDS = "a positive number of seconds"
SIGNAL = "a signal name like 'SIGKILL' or 'SIGTERM', or a signal number"
TERMINATING = "a signal whose default action ends a process"
DUMPABLE = "a signal a rank can catch and does not otherwise use"
LEVEL = "a level name (DEBUG, DBG, INFO, WARNING, WARN, ERROR, CRITICAL; any case) or a number from 10"
COUNT = "an integer from {} to 2147483647"

#: (key, kind, value, what the message must say is allowed)
BAD_VALUES = [
    ("workload_check_interval", "type", [5], "a positive number of seconds up to 86400"),
    ("workload_check_interval", "range", 0, "a positive number of seconds up to 86400"),
    ("workload_check_interval", "range", 1e7, "a positive number of seconds up to 86400"),  # epoll's limit
    ("workload_check_interval", "empty", "", "a positive number of seconds up to 86400"),
    ("workload_check_interval", "non-finite", INF, "a positive number of seconds up to 86400"),
    ("workload_check_interval", "non-finite", "nan", "a positive number of seconds up to 86400"),
    ("initial_rank_heartbeat_timeout", "type", "soon", SECONDS + " or none/null"),
    ("initial_rank_heartbeat_timeout", "range", -1, SECONDS + " or none/null"),
    ("initial_rank_heartbeat_timeout", "empty", "", SECONDS + " or none/null"),
    ("initial_rank_heartbeat_timeout", "non-finite", NAN, SECONDS + " or none/null"),
    ("rank_heartbeat_timeout", "type", True, SECONDS + " or none/null"),
    ("rank_heartbeat_timeout", "range", 0, SECONDS + " or none/null"),
    ("rank_heartbeat_timeout", "empty", "", SECONDS + " or none/null"),
    ("rank_heartbeat_timeout", "empty", "  ", SECONDS + " or none/null"),
    ("rank_heartbeat_timeout", "non-finite", "inf", SECONDS + " or none/null"),
    ("rank_section_timeouts", "type", [1, 2], "a mapping of section name to seconds/none"),
    ("rank_section_timeouts", "type", "step=3", "a mapping or 'name:seconds,name:none' pairs"),
    ("rank_section_timeouts", "range", {"step": -2}, SECONDS + " or none/null"),
    ("rank_section_timeouts", "empty", "", "'name:seconds,name:none' pairs, or none for no sections"),
    ("rank_section_timeouts", "empty", {"": 3}, "section names are non-empty strings"),
    ("rank_section_timeouts", "empty", {"step": ""}, SECONDS + " or none/null"),
    ("rank_section_timeouts", "non-finite", {"step": INF}, SECONDS + " or none/null"),
    ("rank_section_timeouts", "non-finite", "step:nan", SECONDS + " or none/null"),
    ("rank_out_of_section_timeout", "type", {"a": 1}, SECONDS + " or none/null"),
    ("rank_out_of_section_timeout", "range", -5, SECONDS + " or none/null"),
    ("rank_out_of_section_timeout", "empty", "", SECONDS + " or none/null"),
    ("rank_out_of_section_timeout", "non-finite", -INF, SECONDS + " or none/null"),
    ("safety_factor", "type", None, SECONDS),
    ("safety_factor", "range", 0, SECONDS),
    ("safety_factor", "empty", "", SECONDS),
    ("safety_factor", "non-finite", INF, SECONDS),
    ("min_calculated_timeout", "type", "x", SECONDS),
    ("min_calculated_timeout", "range", -1, SECONDS),
    ("min_calculated_timeout", "empty", "", SECONDS),
    ("min_calculated_timeout", "non-finite", "inf", SECONDS),
    ("rank_termination_signal", "type", 2.5, SIGNAL),
    ("rank_termination_signal", "type", None, SIGNAL),
    ("rank_termination_signal", "range", 999, SIGNAL),
    ("rank_termination_signal", "range", 0, SIGNAL),
    ("rank_termination_signal", "range", "SIGNOPE", SIGNAL),
    ("rank_termination_signal", "range", "SIGCHLD", TERMINATING),  # ignored by default
    ("rank_termination_signal", "range", "winch", TERMINATING),
    ("rank_termination_signal", "range", "SIGURG", TERMINATING),
    ("rank_termination_signal", "range", "SIGCONT", TERMINATING),
    ("rank_termination_signal", "range", 19, TERMINATING),  # SIGSTOP
    ("rank_termination_signal", "range", "SIGTSTP", TERMINATING),
    ("rank_termination_signal", "range", "SIGINT", TERMINATING),  # KeyboardInterrupt in a Python rank
    ("rank_termination_signal", "range", "SIGPIPE", TERMINATING),  # ignored by CPython
    ("rank_termination_signal", "empty", "", SIGNAL),
    ("rank_termination_signal", "non-finite", INF, SIGNAL),
    ("log_level", "type", [10], LEVEL),
    ("log_level", "type", "loud", LEVEL),
    ("log_level", "range", 5, LEVEL),
    ("log_level", "range", 51, LEVEL),
    ("log_level", "empty", "", LEVEL),
    ("log_level", "non-finite", INF, LEVEL),
    ("skip_section_response", "type", "maybe", "true or false"),
    ("skip_section_response", "range", 2, "true or false"),
    ("skip_section_response", "empty", "", "true or false"),
    ("skip_section_response", "non-finite", NAN, "true or false"),
    ("install_exception_hook", "type", [True], "true or false"),
    ("install_exception_hook", "range", -1, "true or false"),
    ("install_exception_hook", "empty", "", "true or false"),
    ("install_exception_hook", "non-finite", "inf", "true or false"),
    ("num_warmup_iterations", "type", 1.5, COUNT.format(0)),
    ("num_warmup_iterations", "range", -1, COUNT.format(0)),
    ("num_warmup_iterations", "range", 2**64, COUNT.format(0)),  # msgpack cannot carry it to a rank
    ("num_warmup_iterations", "empty", "", COUNT.format(0)),
    ("num_warmup_iterations", "non-finite", INF, COUNT.format(0)),  # OverflowError before msgspec
    ("num_warmup_iterations", "non-finite", "nan", COUNT.format(0)),
    ("stack_dump_signal", "type", 2.5, SIGNAL + ", or none"),
    ("stack_dump_signal", "range", "KILL", DUMPABLE),  # cannot be caught
    ("stack_dump_signal", "range", "SIGSTOP", DUMPABLE),
    ("stack_dump_signal", "range", "SIGSEGV", DUMPABLE),  # faulthandler refuses it
    ("stack_dump_signal", "range", "SIGCONT", DUMPABLE),  # the monitor sends it before every dump
    ("stack_dump_signal", "range", "SIGTERM", DUMPABLE),  # how workers are stopped
    ("stack_dump_signal", "range", "SIGCHLD", DUMPABLE),
    ("stack_dump_signal", "range", 0, SIGNAL + ", or none"),
    ("stack_dump_signal", "empty", "", SIGNAL + ", or none"),
    ("stack_dump_signal", "non-finite", NAN, SIGNAL + ", or none"),
    ("stack_dump_timeout", "type", None, SECONDS),
    ("stack_dump_timeout", "range", 0, SECONDS),
    ("stack_dump_timeout", "empty", "", SECONDS),
    ("stack_dump_timeout", "non-finite", INF, SECONDS),
    ("max_frame_bytes", "type", "big", "an integer from 4096 to 4294967295"),
    ("max_frame_bytes", "range", 10, "an integer from 4096 to 4294967295"),
    ("max_frame_bytes", "range", 2**32, "an integer from 4096 to 4294967295"),  # the 4-byte length prefix
    ("max_frame_bytes", "empty", "", "an integer from 4096 to 4294967295"),
    ("max_frame_bytes", "non-finite", INF, "an integer from 4096 to 4294967295"),
    ("max_frame_bytes", "non-finite", "inf", "an integer from 4096 to 4294967295"),
    ("max_no_progress_cycles", "type", 1.5, COUNT.format(-1)),
    ("max_no_progress_cycles", "range", -2, COUNT.format(-1)),
    ("max_no_progress_cycles", "empty", "", COUNT.format(-1)),
    ("max_no_progress_cycles", "non-finite", "inf", COUNT.format(-1)),
    ("min_progress_iterations", "type", "x", COUNT.format(1)),
    ("min_progress_iterations", "range", 0, COUNT.format(1)),
    ("min_progress_iterations", "empty", "", COUNT.format(1)),
    ("min_progress_iterations", "non-finite", NAN, COUNT.format(1)),
    ("max_identical_faults", "type", "twice", COUNT.format(0)),
    ("max_identical_faults", "range", -1, COUNT.format(0)),
    ("max_identical_faults", "empty", "", COUNT.format(0)),
    ("max_identical_faults", "non-finite", INF, COUNT.format(0)),
    ("suspect_checkpoint_steps", "type", "few", COUNT.format(0)),
    ("suspect_checkpoint_steps", "range", -1, COUNT.format(0)),
    ("suspect_checkpoint_steps", "empty", "", COUNT.format(0)),
    ("suspect_checkpoint_steps", "non-finite", NAN, COUNT.format(0)),
    ("suspect_node_faults", "type", 2.5, COUNT.format(0)),
    ("suspect_node_faults", "range", -3, COUNT.format(0)),
    ("suspect_node_faults", "empty", "", COUNT.format(0)),
    ("suspect_node_faults", "non-finite", INF, COUNT.format(0)),
    ("checkpoint_iteration_file", "type", 3, "a file path, or none"),
    ("checkpoint_iteration_file", "range", os.sep, "a file path, or none"),  # a directory
    ("checkpoint_iteration_file", "empty", "", "a file path, or none"),
    ("checkpoint_iteration_file", "non-finite", INF, "a file path, or none"),
    ("straggler_report_interval", "type", "soon", SECONDS + " or none/null"),
    ("straggler_report_interval", "range", 0, SECONDS + " or none/null"),
    ("straggler_report_interval", "empty", "", SECONDS + " or none/null"),
    ("straggler_report_interval", "non-finite", INF, SECONDS + " or none/null"),
    ("straggler_threshold", "type", "high", "a score in (0, 1]"),
    ("straggler_threshold", "range", 1.5, "a score in (0, 1]"),
    ("straggler_threshold", "empty", "", "a score in (0, 1]"),
    ("straggler_threshold", "non-finite", NAN, "a score in (0, 1]"),
    ("straggler_consecutive_reports", "type", 2.5, COUNT.format(1)),
    ("straggler_consecutive_reports", "range", 0, COUNT.format(1)),
    ("straggler_consecutive_reports", "empty", "", COUNT.format(1)),
    ("straggler_consecutive_reports", "non-finite", INF, COUNT.format(1)),
    ("straggler_window", "type", "big", "an integer from 1 to 100000"),
    ("straggler_window", "range", 100_001, "an integer from 1 to 100000"),
    ("straggler_window", "empty", "", "an integer from 1 to 100000"),
    ("straggler_window", "non-finite", INF, "an integer from 1 to 100000"),
    ("straggler_min_phase_seconds", "type", "tiny", "a number of seconds from 0 to 3600"),
    ("straggler_min_phase_seconds", "range", -0.001, "a number of seconds from 0 to 3600"),
    ("straggler_min_phase_seconds", "empty", "", "a number of seconds from 0 to 3600"),
    ("straggler_min_phase_seconds", "non-finite", INF, "a number of seconds from 0 to 3600"),
    ("straggler_action", "type", 3, "one of report, restart, exclude-node"),
    ("straggler_action", "range", "kill", "one of report, restart, exclude-node"),
    ("straggler_action", "empty", "", "one of report, restart, exclude-node"),
    ("straggler_action", "non-finite", INF, "one of report, restart, exclude-node"),
    ("metrics_port", "type", "http", "an integer from 0 to 65535"),
    ("metrics_port", "range", 65536, "an integer from 0 to 65535"),
    ("metrics_port", "empty", "", "an integer from 0 to 65535"),
    ("metrics_port", "non-finite", INF, "an integer from 0 to 65535"),
    ("io_progress_cap", "type", "lots", "a factor from 1 to 1e6"),
    ("io_progress_cap", "range", 0.5, "a factor from 1 to 1e6"),
    ("io_progress_cap", "empty", "", "a factor from 1 to 1e6"),
    ("io_progress_cap", "non-finite", INF, "a factor from 1 to 1e6"),
    ("compile_timeout", "type", "slow", SECONDS + " or none/null"),
    ("compile_timeout", "range", -1, SECONDS + " or none/null"),
    ("compile_timeout", "empty", "", SECONDS + " or none/null"),
    ("compile_timeout", "non-finite", INF, SECONDS + " or none/null"),
]
KINDS = ("type", "range", "empty", "non-finite")


def test_every_field_has_a_bad_value_of_every_kind():
    covered = {(key, kind) for key, kind, _, _ in BAD_VALUES}
    assert covered == {(key, kind) for key in FaultToleranceConfig.field_names() for kind in KINDS}


def _check(error: ConfigError, key: str, value, allowed: str) -> None:
    message = str(error)
    # A section's bad value is named with its section: fault_tolerance.rank_section_timeouts.step.
    assert message.startswith(f"fault_tolerance.{key}"), message
    if isinstance(value, dict):
        ((section, value),) = value.items()
        value = section if not section else value
    elif key == "rank_section_timeouts" and ":" in value:
        value = value.partition(":")[2]  # "step:nan": the seconds of section "step" are shown
    if isinstance(value, float) and math.isnan(value):
        assert "nan" in message, message
    else:
        assert repr(value) in message, message
    assert f"; allowed: {allowed}" in message, message


@pytest.mark.parametrize(("key", "kind", "value", "allowed"), BAD_VALUES,
                         ids=[f"{key}-{kind}-{value!r}" for key, kind, value, _ in BAD_VALUES])
def test_bad_value_names_the_key_the_value_and_what_is_allowed(key, kind, value, allowed):
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig(**{key: value})
    _check(info.value, key, value, allowed)


TEXT_VALUES = [row for row in BAD_VALUES if isinstance(row[2], str)]


@pytest.mark.parametrize(("key", "kind", "value", "allowed"), TEXT_VALUES,
                         ids=[f"{key}-{kind}-{value!r}" for key, kind, value, _ in TEXT_VALUES])
def test_bad_flag_value_is_rejected_the_same_way(key, kind, value, allowed):
    # e.g. --ft-rank-heartbeat-timeout= (an unset shell variable): an error, not "no timeout".
    parser = FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser())
    args = parser.parse_args([f"--ft-{key.replace('_', '-')}={value}"])
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig.from_args(args)
    _check(info.value, key, value, allowed)


def test_a_signal_message_says_why_it_cannot_do_the_job():
    with pytest.raises(ConfigError, match=r"^fault_tolerance.rank_termination_signal: invalid value 'SIGCHLD': "
                                          r"SIGCHLD is ignored by default; allowed: a signal whose default"):
        FaultToleranceConfig(rank_termination_signal="SIGCHLD")
    with pytest.raises(ConfigError, match=r"^fault_tolerance.stack_dump_signal: invalid value 'KILL': SIGKILL "
                                          r"cannot be caught; allowed: a signal a rank can catch"):
        FaultToleranceConfig(stack_dump_signal="KILL")


def test_the_dump_signal_cannot_be_the_termination_signal():
    # The rank's dump handler would catch the termination signal too: a hung rank would survive.
    with pytest.raises(ConfigError, match=r"^fault_tolerance.stack_dump_signal: SIGUSR1 is also "
                                          r"rank_termination_signal: .* allowed: a signal other than"):
        FaultToleranceConfig(rank_termination_signal="SIGUSR1", stack_dump_signal="SIGUSR1")
    FaultToleranceConfig(rank_termination_signal="SIGUSR1", stack_dump_signal=None)  # no dump: fine


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGALRM", "SIGABRT"])
def test_signals_that_end_a_process_are_accepted_for_termination(signal_name):
    assert FaultToleranceConfig(rank_termination_signal=signal_name).rank_termination_signal.name == signal_name


def test_max_frame_bytes_limit_is_what_the_length_prefix_can_carry():
    assert FaultToleranceConfig(max_frame_bytes=MAX_FRAME_BYTES_LIMIT).max_frame_bytes == 2**32 - 1
    with pytest.raises(struct.error):
        struct.pack(">I", MAX_FRAME_BYTES_LIMIT + 1)


def test_none_and_off_still_disable_a_timeout():
    cfg = FaultToleranceConfig.from_dict({"rank_heartbeat_timeout": "none", "initial_rank_heartbeat_timeout": "off",
                                          "rank_out_of_section_timeout": "NULL", "stack_dump_signal": "none",
                                          "rank_section_timeouts": "none", "checkpoint_iteration_file": "null"})
    assert cfg.rank_heartbeat_timeout is cfg.initial_rank_heartbeat_timeout is cfg.rank_out_of_section_timeout is None
    assert cfg.stack_dump_signal is None and cfg.checkpoint_iteration_file is None
    assert cfg.rank_section_timeouts == {}


# -- hostile and broken config files ----------------------------------------------------------------


def _yaml(tmp_path, text: str, name: str = "ft.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _from_flag(path) -> FaultToleranceConfig:
    parser = FaultToleranceConfig.add_argparse_args(argparse.ArgumentParser())
    return FaultToleranceConfig.from_args(parser.parse_args([f"--ft-cfg-path={path}"]))


@pytest.mark.parametrize(("text", "key", "line"), [
    ("fault_tolerance:\n  rank_heartbeat_timeout: 30\n  safety_factor: 2\n  rank_heartbeat_timeout: 3000\n",
     "rank_heartbeat_timeout", 4),
    ("fault_tolerance:\n  rank_section_timeouts:\n    step: 10\n    step: 20\n", "step", 4),
    ("trainer: {max_steps: 3}\ntrainer: {max_steps: 4}\nfault_tolerance: {safety_factor: 2}\n", "trainer", 2),
    ("fault_tolerance: {}\nfault_tolerance:\n  rank_heartbeat_timeout: 5\n", "fault_tolerance", 2),
])
def test_a_duplicate_key_is_an_error_naming_the_key_and_the_file(tmp_path, text, key, line):
    # YAML keeps the last value silently: a timeout set twice would be whichever came last.
    path = _yaml(tmp_path, text)
    expected = rf"^--ft-cfg-path: '{path}' line {line}: duplicate key '{key}'; allowed: a YAML file in which no "
    with pytest.raises(ConfigError, match=expected):
        _from_flag(path)
    with pytest.raises(ConfigError, match=rf"^cfg_path: '{path}' line {line}: duplicate key '{key}'"):
        FaultToleranceConfig.from_yaml_file(path)


def test_merge_keys_and_anchors_are_not_duplicates(tmp_path):
    path = _yaml(tmp_path, "base: &base\n  rank_heartbeat_timeout: 30\n  safety_factor: 2\n"
                           "fault_tolerance:\n  <<: *base\n  rank_heartbeat_timeout: 60\n")
    cfg = FaultToleranceConfig.from_yaml_file(path)
    assert (cfg.rank_heartbeat_timeout, cfg.safety_factor) == (60.0, 2.0)


@pytest.mark.parametrize("kind", ["directory", "fifo", "device", "not_a_directory"])
def test_a_path_that_is_not_a_readable_file_is_one_clear_error(tmp_path, kind):
    if kind == "directory":
        path, problem = str(tmp_path), "is a directory"
    elif kind == "fifo":
        path, problem = str(tmp_path / "pipe"), "is not a regular file"
        os.mkfifo(path)  # opening it must not wait for a writer
    elif kind == "device":
        path, problem = os.devnull, "is not a regular file"  # a device would be read forever (/dev/zero)
    else:
        (tmp_path / "file").write_text("x")
        path, problem = str(tmp_path / "file" / "ft.yaml"), "cannot be read: Not a directory"
    with pytest.raises(ConfigError) as info:
        _from_flag(path)
    assert str(info.value) == (f"--ft-cfg-path: {path!r} {problem}; allowed: a YAML file with a "
                               "'fault_tolerance:' mapping (at any depth)")
    assert "\n" not in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file_is_one_clear_error(tmp_path):
    path = _yaml(tmp_path, "fault_tolerance: {}\n")
    path.chmod(0)
    with pytest.raises(ConfigError, match=rf"^--ft-cfg-path: '{path}' cannot be read: Permission denied; allowed"):
        _from_flag(path)


def test_binary_broken_and_huge_files_are_clear_errors(tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=r"'.*model.bin' is not UTF-8 text"):
        _from_flag(binary)
    broken = _yaml(tmp_path, "fault_tolerance: [unclosed\n", "broken.yaml")
    with pytest.raises(ConfigError) as info:
        _from_flag(broken)
    assert "is not valid YAML: " in str(info.value) and "\n" not in str(info.value)
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as handle:
        handle.truncate((16 << 20) + 1)  # sparse: costs no disk
    with pytest.raises(ConfigError, match=r"'.*huge.yaml' is larger than 16 MiB"):
        _from_flag(huge)


@pytest.mark.timeout(60)
def test_alias_bomb_is_read_without_exploding(tmp_path):
    # Each level refers to the previous one nine times: 9**9 leaves if walked naively.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    path = _yaml(tmp_path, "\n".join(lines) + "\nnested: {deep: *a9}\nfault_tolerance: {safety_factor: 3}\n")
    started = time.monotonic()
    assert _from_flag(path).safety_factor == 3.0
    assert FaultToleranceConfig.from_yaml_file(path).safety_factor == 3.0
    without = _yaml(tmp_path, "\n".join(lines) + "\n", "bomb_only.yaml")
    assert _from_flag(without) == FaultToleranceConfig()  # no section: the defaults, with a warning
    assert time.monotonic() - started < 30  # a generous bound: the naive walk never finishes
