"""The pure parts of :mod:`ft_core.utils.procutil` (the ones that touch processes are in the integration tests)."""

from __future__ import annotations

import signal

from ft_core.utils.procutil import signals_named


def test_the_signals_to_handle_are_read_as_torchrun_reads_them_and_unknown_names_are_skipped():
    # The launcher's --signals-to-handle, the agent's second-signal guard and a forked worker's reset all read so.
    assert signals_named("SIGTERM,SIGINT") == [signal.SIGTERM, signal.SIGINT]
    assert signals_named(" SIGHUP , SIGNOPE,SIGQUIT") == [signal.SIGHUP, signal.SIGQUIT]
    assert signals_named("") == []
