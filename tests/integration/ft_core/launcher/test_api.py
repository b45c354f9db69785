"""ft_launcher from Python: ``ft_core.launcher.api.run(argv)``, torchrun's in-process contract (returns when every
worker succeeded, raises ``ChildFailedError`` when the job failed and ``ValueError`` on a bad command line), and
``ft_core.launcher.main()``: both leave the caller's signal handlers and environment as they found them."""

from __future__ import annotations

import os
import signal

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ft_core.launcher import main
from ft_core.launcher.api import LauncherFailedError, run
from ft_core.launcher.outcome import DEFAULT_NO_RESTART_EXIT_CODE

pytestmark = pytest.mark.timeout(300)

#: What a launch installs or ignores (torch elastic's signals to handle, SIGHUP and SIGQUIT among them).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
LEAKED_BEFORE = ("FT_MONITOR_TOKEN", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")


def _state() -> tuple[dict[signal.Signals, object], dict[str, str]]:
    return {sig: signal.getsignal(sig) for sig in SIGNALS}, dict(os.environ)


def _argv(tmp_path, exit_code: int, *flags: str) -> list[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(f"import sys\nsys.exit({exit_code})\n")
    return ["--nproc-per-node=2", "--max-restarts=0", f"--log-dir={tmp_path / 'logs'}", *flags, str(script)]


@pytest.fixture
def caller_handler():
    """The caller's own SIGTERM handler, as a framework that launches from Python has one."""
    def on_term(signum, frame):  # pragma: no cover - never called
        raise AssertionError("not expected")

    before = signal.signal(signal.SIGTERM, on_term)
    yield on_term
    signal.signal(signal.SIGTERM, before)


def test_main_called_from_python_leaves_handlers_and_environment_as_they_were(tmp_path, caller_handler, monkeypatch):
    for name in LEAKED_BEFORE:  # an earlier test of this process may have exported one (run_in_subprocess does)
        monkeypatch.delenv(name, raising=False)
    for attempt in range(2):  # twice in one interpreter: the first call's token must not reach the second's
        before = _state()
        assert main(_argv(tmp_path / str(attempt), 0)) == 0
        assert _state() == before
        assert not set(LEAKED_BEFORE) & set(os.environ)
    assert signal.getsignal(signal.SIGTERM) is caller_handler


def test_run_twice_returns_then_raises_child_failed_and_restores_the_caller(tmp_path, caller_handler):
    before = _state()
    assert run(_argv(tmp_path / "ok", 0)) is None
    assert _state() == before
    with pytest.raises(ChildFailedError) as failed:
        run(_argv(tmp_path / "stop", DEFAULT_NO_RESTART_EXIT_CODE + 1))
    assert isinstance(failed.value, LauncherFailedError) and failed.value.exit_code == 1  # restart budget spent
    assert _state() == before


def test_run_raises_value_error_on_a_bad_command_line(tmp_path, caller_handler):
    before = _state()
    with pytest.raises(ValueError, match="--nnodes"):
        run(_argv(tmp_path, 0, "--nnodes=two"))
    with pytest.raises(ValueError):
        run(_argv(tmp_path, 0, "--no-such-flag"))
    assert _state() == before
