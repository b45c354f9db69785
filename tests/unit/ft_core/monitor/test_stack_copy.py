"""Hung ranks' stacks copied to the log directory by one daemon thread, off the monitor's deadline path.

The monitor's kill while such a copy is stalled is tested with a real rank in
``tests/integration/ft_core/monitor/test_server.py``.
"""

from __future__ import annotations

import logging
import threading

from ft_core.jobdir import saved_stack_path
from ft_core.monitor import stack_copy
from ft_core.monitor.stack_copy import StackCopier


def test_stacks_are_copied_and_one_failed_copy_does_not_stop_the_next(tmp_path, caplog):
    stacks_dir = tmp_path / "ft_stacks"
    blocked = tmp_path / "a_file"
    blocked.write_text("not a directory")
    copier = StackCopier()
    copier.submit(str(blocked), 0, 1, 101, "stack of rank 1", "/job/dump-101")
    copier.submit(str(stacks_dir), 0, 2, 102, "stack of rank 2", "/job/dump-102")
    with caplog.at_level(logging.WARNING, logger="ft_core.monitor"):
        copier.close(60)
    with open(saved_stack_path(str(stacks_dir), 0, 2, 102)) as handle:
        assert handle.read() == "stack of rank 2"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"could not keep the stack of rank 1 in {blocked}") and "/job/dump-101" in warning


def test_closing_without_a_copy_starts_no_thread():
    copier = StackCopier()
    copier.close(0)
    assert copier._thread is None


def test_close_gives_up_on_a_stalled_filesystem_with_a_warning(tmp_path, monkeypatch, caplog):
    released = threading.Event()
    monkeypatch.setattr(stack_copy, "keep_stack", lambda *args: released.wait(60))
    copier = StackCopier()
    copier.submit(str(tmp_path), 0, 0, 100, "stack", None)
    try:
        with caplog.at_level(logging.WARNING, logger="ft_core.monitor"):
            copier.close(0.01)
        assert [r.getMessage() for r in caplog.records] == [
            "stack copies to the log directory still pending after 0 s (stalled filesystem?)"]
    finally:
        released.set()
        assert copier._thread is not None
        copier._thread.join(60)
