"""ft_launcher's command line: torchrun's flags plus the --ft-* flags; bad values fail before anything starts."""

from __future__ import annotations

import pytest

from ft_core.launcher.cli import build_parser, main


def test_help_documents_torchrun_and_fault_tolerance_flags():
    text = build_parser().format_help()
    for flag in ("--nnodes", "--nproc-per-node", "--rdzv-endpoint", "--standalone", "--max-restarts",
                 "--monitor-interval", "--no-python", "--log-dir", "--ft-cfg-path", "--ft-rank-heartbeat-timeout",
                 "--ft-param-rank-heartbeat-timeout", "--term-timeout", "--workers-stop-timeout",
                 "--ft-no-restart-exit-code", "--ft-max-no-progress-cycles", "--ft-checkpoint-iteration-file",
                 "--ft-events-file", "--ft-prewarm", "--ft-no-prewarm", "--ft-prewarm-modules", "exit codes:"):
        assert flag in text


@pytest.mark.parametrize(("flag", "named"), [
    ("--ft-rank-heartbeat-timeout=-1", "rank_heartbeat_timeout"),
    ("--ft-param-rank-termination-signal=SIGNOPE", "rank_termination_signal"),
    ("--term-timeout=soon", "--term-timeout"),
    ("--workers-stop-timeout=-2", "--workers-stop-timeout"),
    ("--ft-no-restart-exit-code=300", "--ft-no-restart-exit-code"),
    ("--ft-max-no-progress-cycles=-1", "--ft-max-no-progress-cycles"),
    ("--nnodes=two", "--nnodes"),
    ("--max-restarts=-1", "max_restarts"),
    ("--ft-prewarm=maybe", "--ft-prewarm"),
    ("--ft-prewarm-modules=torch,light ning", "--ft-prewarm-modules"),
    ("--ft-prewarm-modules=torch,.core", "--ft-prewarm-modules"),
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


def test_prewarm_flags_are_parsed():
    from ft_core.launcher.options import LauncherOptions

    def options(*flags: str) -> LauncherOptions:
        return LauncherOptions.from_args(build_parser().parse_args([*flags, "train.py"]))

    assert options().prewarm and options().prewarm_modules == ("torch",)
    assert not options("--ft-no-prewarm").prewarm
    assert not options("--ft-prewarm=OFF").prewarm
    assert options("--ft-prewarm-modules= torch, lightning ,megatron.core").prewarm_modules == (
        "torch", "lightning", "megatron.core")
    assert options("--ft-prewarm-modules=").prewarm_modules == ()
