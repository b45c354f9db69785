"""ft_launcher's command line: torchrun's flags plus the --ft-* flags; bad values fail before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO_ROOT, python_env

from ft_core.launcher.cli import build_parser, main


def test_help_documents_torchrun_and_fault_tolerance_flags():
    text = build_parser().format_help()
    for flag in ("--nnodes", "--nproc-per-node", "--rdzv-endpoint", "--standalone", "--max-restarts",
                 "--monitor-interval", "--no-python", "--log-dir", "--ft-cfg-path", "--ft-rank-heartbeat-timeout",
                 "--term-timeout", "--workers-stop-timeout",
                 "--ft-no-restart-exit-code", "--ft-max-no-progress-cycles", "--ft-checkpoint-iteration-file",
                 "--ft-events-file", "--ft-prewarm", "--ft-no-prewarm", "--ft-prewarm-modules", "exit codes:",
                 "ft_launcher report LOG_DIR"):
        assert flag in text


def test_help_lists_each_flag_once_and_the_other_spellings_still_parse():
    parser = build_parser()
    listing = parser.format_help().split("options:", 1)[1]
    invocations = [line.split()[0] for line in listing.splitlines() if line.startswith("  --")]
    assert invocations and len(invocations) == len(set(invocations))
    assert not [flag for flag in invocations if "_" in flag or flag.startswith("--ft-param-")]
    assert "--ft-rank-heartbeat-timeout VALUE\n" in listing  # one spelling, then the help text
    for spelling in ("--ft-param-rank-heartbeat-timeout", "--ft_rank_heartbeat_timeout",
                     "--ft-rank_heartbeat_timeout"):
        assert parser.parse_args([f"{spelling}=7", "train.py"]).ft_rank_heartbeat_timeout == "7"


def _listed_spellings(help_text: str) -> set[str]:
    """Every option spelling ``--help`` lists (the invocation column of the options' lines)."""
    listed = set()
    for line in help_text.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            invocation = line[2:].split("  ", 1)[0]
            listed.update(part.split()[0] for part in invocation.split(", "))
    return listed


def test_help_shows_every_spelling_torchrun_shows_less_the_underscore_aliases():
    from torch.distributed.run import get_args_parser

    torchrun = {name for action in get_args_parser()._actions for name in action.option_strings}
    listed = _listed_spellings(build_parser().format_help())
    assert {"-h", "--help", "-m", "--module", "-r", "--redirects", "-t", "--tee"} <= listed
    assert {name for name in torchrun if "_" not in name} <= listed
    assert not {name for name in listed if "_" in name or name.startswith("--ft-param-")}


def test_help_and_the_docs_give_the_same_exit_codes():
    """One list: ``--help``'s rows and docs/launcher.md's table name the same codes with the same words."""
    import re

    help_text = build_parser().format_help().split("\nexit codes:\n", 1)[1]
    help_rows = re.findall(r"^  (\S+) +(.+(?:\n {9}.+)*)", help_text, flags=re.M)
    with open(f"{REPO_ROOT}/docs/launcher.md", encoding="utf-8") as handle:
        table = handle.read().split("## Exit codes\n", 1)[1].split("\n\n**", 1)[0]
    doc_rows = re.findall(r"^\| (\S+) \| (.+) \|$", table, flags=re.M)[1:]  # [0] is the header row
    assert [code for code, _ in help_rows] == [code for code, _ in doc_rows] == ["0", "1", "75", "93", "128+N"]
    for (_, said), (_, written) in zip(help_rows, doc_rows):
        assert " ".join(said.split()) == re.sub(r"\*\*|`", "", written)


def test_help_shows_an_enum_default_as_the_value_the_flag_takes():
    text = " ".join(build_parser().format_help().split())
    assert "or exclude-node (default: report)" in text
    assert "(default: REPORT)" not in text


@pytest.mark.parametrize(("flag", "named"), [
    ("--ft-rank-heartbeat-timeout=-1", "rank_heartbeat_timeout"),
    ("--ft-param-rank-termination-signal=SIGNOPE", "rank_termination_signal"),
    ("--term-timeout=soon", "--term-timeout"),
    ("--workers-stop-timeout=-2", "--workers-stop-timeout"),
    ("--ft-no-restart-exit-code=300", "--ft-no-restart-exit-code"),
    ("--ft-max-no-progress-cycles=-2", "max_no_progress_cycles"),
    ("--ft-rank-heartbeat-timeout=", "rank_heartbeat_timeout"),  # empty: an error, not "no timeout"
    ("--nnodes=two", "--nnodes"),
    ("--max-restarts=-1", "max_restarts"),
    ("--ft-prewarm=maybe", "--ft-prewarm"),
    ("--ft-prewarm-modules=torch,light ning", "--ft-prewarm-modules"),
    ("--ft-prewarm-modules=torch,.core", "--ft-prewarm-modules"),
    ("--rdzv-conf=lost_after=1", "--rdzv-conf lost_after: invalid value '1'"),
    ("--rdzv-conf=members_first=maybe", "--rdzv-conf members_first: invalid value 'maybe'"),
    ("--rdzv-conf=wake_on_change=2", "--rdzv-conf wake_on_change: invalid value '2'"),
])
def test_bad_values_fail_fast_naming_the_flag(flag, named, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([flag, f"--log-dir={tmp_path}", "train.py"])
    assert exc.value.code == 2
    assert named in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing was started, not even the event log


def test_missing_config_file_is_reported(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main([f"--ft-cfg-path={tmp_path / 'nope.yaml'}", "train.py"])
    assert "nope.yaml" in capsys.readouterr().err


def _launcher(*argv: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m ft_core.launcher argv...`` as a user runs it, with ``env`` added to the environment."""
    return subprocess.run([sys.executable, "-m", "ft_core.launcher", *argv], env=python_env(**env), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_help_says_which_grace_period_applies_after_sigterm(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag: no hyphenated breaks
    text = build_parser().format_help()
    assert ("SIGKILL them after this many seconds: the time a rank has to save before preemption (default: "
            "--shutdown-timeout, else $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 1800 as in NVRx)") in text
    assert ("torchrun's grace period from SIGTERM to SIGKILL when the job ends (default: "
            "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else torch's 30), and the default of --term-timeout") in text


def test_a_bad_torch_elastic_shutdown_timeout_is_one_line_before_torch_reads_it(tmp_path):
    result = _launcher(f"--log-dir={tmp_path}", "--nproc-per-node=1", "train.py",
                       TORCH_ELASTIC_SHUTDOWN_TIMEOUT="-5")
    assert result.returncode == 2
    assert result.stderr == ("ft_launcher: error: TORCH_ELASTIC_SHUTDOWN_TIMEOUT: invalid value '-5'; allowed: a "
                             "whole number of seconds >= 0 (torch reads it with int())\n")
    assert not list(tmp_path.iterdir())  # nothing was started


@pytest.mark.parametrize(("argv", "message"), [
    (["--ft-cfg-path=/tmp"], "--ft-cfg-path: '/tmp' is a directory; allowed: a YAML file with a "
                             "'fault_tolerance:' mapping (at any depth)"),
    (["--ft-cfg-path=/nonexistent/ft.yaml"], "--ft-cfg-path: '/nonexistent/ft.yaml' does not exist; allowed: "),
    (["--ft-rank-heartbeat-timeout="], "fault_tolerance.rank_heartbeat_timeout: invalid value ''; allowed: a "
                                       "positive number of seconds or none/null"),
    (["--ft-stack-dump-signal=SIGKILL"], "fault_tolerance.stack_dump_signal: invalid value 'SIGKILL': SIGKILL "
                                         "cannot be caught; allowed: "),
])
def test_a_bad_config_is_one_line_on_stderr_and_exit_code_2(argv, message, tmp_path):
    result = _launcher(*argv, f"--log-dir={tmp_path}", "--nproc-per-node=1", "train.py")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr  # no traceback, no usage
    assert result.stderr.startswith(f"ft_launcher: error: {message}"), result.stderr
    assert not list(tmp_path.iterdir())  # nothing was started


def test_a_duplicate_key_in_the_config_file_is_one_line(tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 30\n  rank_heartbeat_timeout: 3000\n")
    result = _launcher(f"--ft-cfg-path={path}", "--nproc-per-node=1", "train.py")
    assert result.returncode == 2
    assert result.stderr == (f"ft_launcher: error: --ft-cfg-path: '{path}' line 3: duplicate key "
                             "'rank_heartbeat_timeout'; allowed: a YAML file in which no mapping repeats a key\n")


def test_help_lists_the_progress_keys_and_hides_nvrx_only_flags():
    text = build_parser().format_help()
    for flag in ("--ft-max-no-progress-cycles", "--ft-min-progress-iterations", "--ft-checkpoint-iteration-file",
                 "--ft-num-warmup-iterations"):
        assert flag in text
    assert "--ft-enable-nic-monitor" not in text


def test_prewarm_flags_are_parsed():
    from ft_core.config import FaultToleranceConfig
    from ft_core.launcher.options import LauncherOptions

    def options(*flags: str) -> LauncherOptions:
        args = build_parser().parse_args([*flags, "train.py"])
        return LauncherOptions.from_args(args, FaultToleranceConfig.from_args(args))

    assert options().prewarm and options().prewarm_modules == ("torch",)
    assert not options("--ft-no-prewarm").prewarm
    assert not options("--ft-prewarm=OFF").prewarm
    assert options("--ft-prewarm-modules= torch, lightning ,megatron.core").prewarm_modules == (
        "torch", "lightning", "megatron.core")
    assert options("--ft-prewarm-modules=").prewarm_modules == ()


def test_the_command_nemo_run_renders_for_its_fault_tolerance_launcher_parses():
    """NeMo-Run's ``run.FaultTolerance`` launcher starts ``ft_launcher`` with NVRx's spellings (docs/nemo.md)."""
    from ft_core.config import FaultToleranceConfig

    rendered = ["--ft-param-workload_check_interval", "10", "--ft-param-initial_rank_heartbeat_timeout", "5",
                "--ft-param-rank_heartbeat_timeout", "5", "--ft-param-rank_termination_signal", "SIGTERM",
                "--ft-param-log_level", "INFO", "--max-restarts", "3", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", "localhost:0", "--rdzv-id", "1", "--nnodes", "1", "--nproc-per-node", "1",
                "--node-rank", "0", "--tee", "3", "--no-python", "test.py", "arg1", "arg2"]
    args = build_parser().parse_args(rendered)
    cfg = FaultToleranceConfig.from_args(args)
    assert (cfg.workload_check_interval, cfg.initial_rank_heartbeat_timeout, cfg.rank_heartbeat_timeout) == (10, 5, 5)
    assert cfg.rank_termination_signal.name == "SIGTERM" and args.max_restarts == 3
    assert (args.training_script, args.training_script_args) == ("test.py", ["arg1", "arg2"])
    # Without fault-tolerance settings NeMo-Run renders NVRx's "no config file needed" flag instead.
    assert build_parser().parse_args(["--ignore-missing-fault-tol-cfg", "test.py"]).training_script == "test.py"
