"""The worker factory's own rules, in this process: its idle wait, and the signals a forked worker resets."""

from __future__ import annotations

import signal
import socket

import pytest

from ft_core.launcher.startup.factory_protocol import FactoryChannel, Retire
from ft_core.launcher.startup.zygote import IDLE_PREWARM_AFTER, _readable, _reset_caught_signals


def test_an_idle_factory_sees_no_request_until_one_is_sent_and_then_reads_it_whole():
    factory_end, launcher_end = socket.socketpair()
    factory, launcher = FactoryChannel(factory_end), FactoryChannel(launcher_end)
    try:
        assert not _readable(factory, 0.01)  # idle: the factory would import RESTART_PREWARMED now
        assert not _readable(factory, -1.0)  # a deadline already passed: no wait
        launcher.send(Retire())
        assert _readable(factory, 10.0)
        assert factory.recv(1.0) == (Retire(), [])
    finally:
        factory.close()
        launcher.close()
    assert IDLE_PREWARM_AFTER == 5.0  # the documented default (docs/launcher.md, "Pre-warmed workers")


@pytest.fixture
def dispositions():
    """SIGINT, SIGQUIT and SIGTERM restored after the test (it changes this process's)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_forked_worker_finds_the_signals_the_launcher_catches_as_an_exec_would(dispositions):
    # A launcher in the background of a non-interactive shell starts with SIGINT and SIGQUIT ignored, and its
    # factory (forked before the launcher caught them) too; a worker the launcher execs finds them at their
    # default, and CPython installs its SIGINT handler.
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    _reset_caught_signals("SIGTERM,SIGINT,SIGQUIT,NOSUCHSIGNAL")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGQUIT) == signal.SIG_DFL and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_signal_the_launcher_does_not_catch_keeps_what_the_factory_had(dispositions):
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    _reset_caught_signals("SIGTERM")  # --signals-to-handle without SIGQUIT: an exec would keep it ignored too
    assert signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN
