"""Per-node setup around the agent (:mod:`ft_core.launcher.launch`): the signals it turns into torch's
``SignalException`` (``TORCHELASTIC_SIGNALS_TO_HANDLE``) and where the job's event log goes by default. The whole
``launch()`` runs end to end in ``tests/integration/ft_core/launcher/test_single_node.py`` and the other launcher tests."""

from __future__ import annotations

import os
import signal
import types

import pytest
from torch.distributed.elastic.multiprocessing import SignalException

from ft_core.launcher import launch


def test_a_handled_signal_becomes_torchs_signal_exception_and_an_ignored_one_is_ignored():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        launch._install_signal_handlers("SIGUSR1")
        with pytest.raises(SignalException) as raised:
            os.kill(os.getpid(), signal.SIGUSR1)
        assert raised.value.sigval is signal.SIGUSR1 and f"pid {os.getpid()}" in str(raised.value)
        launch._ignore_signals("SIGUSR2")
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR2)  # ignored: nothing happens
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_the_event_log_goes_beside_torchs_logs_or_into_a_private_directory_of_its_own(tmp_path):
    logs = types.SimpleNamespace(logs_specs=types.SimpleNamespace(root_log_dir=str(tmp_path)))
    assert launch._default_events_path(logs) == os.path.join(str(tmp_path), launch.EVENTS_FILE_NAME)  # type: ignore[arg-type]
    nowhere = launch._default_events_path(types.SimpleNamespace(logs_specs=None))  # type: ignore[arg-type]
    directory = os.path.dirname(nowhere)
    try:
        assert os.path.basename(directory).startswith("ft_launcher_") and os.stat(directory).st_mode & 0o077 == 0
    finally:
        os.rmdir(directory)
