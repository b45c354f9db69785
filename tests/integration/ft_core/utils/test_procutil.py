"""``ft_core.utils.procutil`` against real processes: what the kernel says about a rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ft_core.utils.deadline import wait_until
from ft_core.utils.procutil import cpu_sample, is_stopped


def test_a_sigstopped_process_is_seen_stopped_and_a_continued_one_is_not():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not is_stopped(proc.pid)
        os.kill(proc.pid, signal.SIGSTOP)
        assert wait_until(lambda: is_stopped(proc.pid), 10.0)
        os.kill(proc.pid, signal.SIGCONT)
        assert wait_until(lambda: not is_stopped(proc.pid), 10.0)
        sample = cpu_sample(proc.pid)
        assert sample is not None and sample.cpu_seconds > 0
    finally:
        proc.kill()
        proc.wait()
    assert not is_stopped(proc.pid)  # gone: the kernel says nothing
