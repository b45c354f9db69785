"""The launcher's worker handler: stopping a worker that does not lead a process group yet."""

from __future__ import annotations

import signal
import subprocess
import sys

from ft_core.launcher.workers import _DieWithAgentHandler


def test_close_signals_the_pid_of_a_worker_without_its_own_group_yet():
    # A forked worker runs setsid right after the fork; before that, killpg(pid) finds no group.
    # A child left in our own process group is in the same state.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        handler = _DieWithAgentHandler.__new__(_DieWithAgentHandler)  # around an existing process
        handler.proc, handler._stdout, handler._stderr = proc, None, None
        handler.close(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_wait_child_exited_leaves_the_child_to_reap():
    from ft_core.utils.procutil import wait_child_exited

    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert wait_child_exited(quick.pid, timeout=60)
        assert quick.poll() == 0  # still there to be reaped, with its status
        assert not wait_child_exited(slow.pid, timeout=0.2)
        assert slow.poll() is None
    finally:
        slow.kill()
        slow.wait()
