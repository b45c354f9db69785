"""What a client installs in its rank: the report hook, the hard-exit hook and the stack-dump file and signal."""

from __future__ import annotations

import logging
import os
import signal
import sys

import pytest

from ft_core import client_hooks
from ft_core.client_hooks import StackDump, install_exception_hook, install_report_hook
from ft_core.jobdir import JobDir


class Reporter:
    def __init__(self) -> None:
        self.reported: list[BaseException] = []

    def report_exception(self, exc: BaseException) -> None:
        self.reported.append(exc)


@pytest.fixture
def excepthook(monkeypatch):
    """``sys.excepthook`` as a fresh process has it (a recorder of what reaches it), restored afterwards."""
    seen: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "excepthook", lambda exc_type, exc, tb: seen.append(exc_type))
    monkeypatch.setattr(client_hooks, "_report_hook_client", None)
    return seen


def test_an_uncaught_exception_is_reported_to_the_last_client_then_the_previous_hook_runs(excepthook):
    first, last = Reporter(), Reporter()
    install_report_hook(first)
    hook = sys.excepthook
    install_report_hook(last)
    assert sys.excepthook is hook  # chained once per process
    error = ValueError("boom")
    sys.excepthook(ValueError, error, None)
    assert (first.reported, last.reported, excepthook) == ([], [error], [ValueError])


def test_an_interrupt_or_exit_is_not_a_fault_to_report(excepthook):
    reporter = Reporter()
    install_report_hook(reporter)
    sys.excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)
    sys.excepthook(SystemExit, SystemExit(3), None)
    assert reporter.reported == [] and excepthook == [KeyboardInterrupt, SystemExit]


def test_the_exception_hook_exits_hard_after_the_previous_hook(excepthook, monkeypatch):
    exits = []
    # os._exit would end the test process: recorded instead (the hard exit itself is seen by the launcher tests).
    monkeypatch.setattr(client_hooks.os, "_exit", lambda code: exits.append((code, list(excepthook))))
    install_exception_hook()
    sys.excepthook(RuntimeError, RuntimeError("x"), None)
    assert exits == [(1, [RuntimeError])]


@pytest.fixture
def default_usr2():
    """SIGUSR2 at its default disposition (terminate), as in a fresh rank; the test process's own restored after."""
    previous = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGUSR2, previous)


def test_the_stack_dump_signal_writes_every_thread_to_the_rank_file(tmp_path, default_usr2):
    job = JobDir(str(tmp_path / "job")).create()
    dump = StackDump()
    path = dump.open(job.monitor_socket, rank=2)
    assert path == job.stack_dump_file(2, os.getpid()) and os.stat(path).st_mode & 0o777 == 0o600
    dump.register(signal.SIGUSR2)
    try:
        os.kill(os.getpid(), signal.SIGUSR2)  # faulthandler's C handler writes at once
    finally:
        dump.unregister()
    with open(path) as handle:
        assert "test_the_stack_dump_signal_writes_every_thread_to_the_rank_file" in handle.read()
    assert dump._file is None


def test_a_dump_request_at_interpreter_exit_is_ignored_and_the_clients_shutdown_restores_the_default(
        tmp_path, default_usr2):
    # A rank exiting (its collective's peer died) can still be asked for its stacks by a hang diagnosis elsewhere.
    # At interpreter shutdown faulthandler removes its handler and restores the disposition it found: terminate,
    # before. faulthandler.unregister is that step.
    import faulthandler

    dump = StackDump()
    dump.open(JobDir(str(tmp_path / "job")).create().monitor_socket, rank=0)
    dump.register(signal.SIGUSR2)
    faulthandler.unregister(signal.SIGUSR2)
    assert signal.getsignal(signal.SIGUSR2) is client_hooks._ignore_dump_request  # exec resets it: not inherited
    os.kill(os.getpid(), signal.SIGUSR2)  # does nothing: this process goes on
    # The client's shutdown, the process going on: the default is back (what it starts must not inherit SIG_IGN,
    # e.g. a rank whose termination signal is SIGUSR2).
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    dump.register(signal.SIGUSR2)
    dump.unregister()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_a_dump_signal_handler_of_the_program_is_kept_after_the_dump_handler(tmp_path, default_usr2):
    def own(signum, frame) -> None:
        pass

    signal.signal(signal.SIGUSR2, own)
    dump = StackDump()
    dump.open(JobDir(str(tmp_path / "job")).create().monitor_socket, rank=0)
    dump.register(signal.SIGUSR2)
    dump.unregister()
    assert signal.getsignal(signal.SIGUSR2) is own


def test_without_a_signal_the_file_is_closed_and_without_a_safe_directory_there_are_no_dumps(tmp_path, caplog):
    job = JobDir(str(tmp_path / "job")).create()
    dump = StackDump()
    assert dump.open(job.monitor_socket, rank=0) is not None
    dump.register(None)  # no stack_dump_signal configured
    assert dump._file is None
    planted = JobDir(str(tmp_path / "planted")).create()
    os.rmdir(planted.stacks)
    os.symlink(tmp_path, planted.stacks)  # planted: dumps are never written through it
    with caplog.at_level(logging.WARNING, logger="ft_core.client"):
        assert StackDump().open(planted.monitor_socket, rank=0) is None
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"stack dumps disabled: cannot create {planted.stack_dump_file(0, os.getpid())}: ")
