"""The launcher's worker handler: stopping a worker that does not lead a process group yet."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from ft_core.launcher.startup.workers import _DieWithAgentHandler


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


def test_wait_for_an_exit_wakes_at_the_exit_not_at_the_timeout():
    from ft_core.launcher.startup.workers import wait_for_an_exit

    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    quick = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert quick.stdin is not None
        quick.stdin.close()  # quick exits now, slow sleeps on
        timeout = 120.0
        started = time.monotonic()
        wait_for_an_exit([slow.pid, quick.pid], timeout)
        assert time.monotonic() - started < timeout  # woken by the exit, not by the timeout
        assert quick.poll() == 0 and slow.poll() is None  # the exit is left to reap
        quick_pid = quick.pid
        started = time.monotonic()
        wait_for_an_exit([slow.pid, quick_pid], timeout)  # reaped: gone already, no wait
        assert time.monotonic() - started < timeout
    finally:
        slow.kill()
        slow.wait()
