"""Process helpers shared by the monitor, the launcher and tests (file permissions: :mod:`ft_core.jobdir`)."""

from __future__ import annotations

import ctypes
import os
import signal
from typing import NamedTuple, Optional

__all__ = ["CpuSample", "cpu_sample", "die_with_parent"]

_PR_SET_PDEATHSIG = 1
# Resolved once here: looking libc up inside a forked child (find_library runs
# ldconfig) would add ~20 ms to every process start.
_LIBC: Optional[ctypes.CDLL]
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - no dynamic libc
    _LIBC = None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux).

    Meant as a ``preexec_fn``: a monitor or worker must never outlive the
    launcher that started it, even when the launcher is SIGKILLed.
    """
    prctl = getattr(_LIBC, "prctl", None)
    if prctl is not None:  # elsewhere callers also poll os.getppid()
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


class CpuSample(NamedTuple):
    """What the kernel says about a process's threads at one moment."""

    cpu_seconds: float  # time on a CPU, summed over threads
    runnable: bool  # some thread is running or waiting for a CPU (state R)


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state ``T``: SIGSTOP, SIGTSTP; ``t``: a debugger) per Linux ``/proc``.

    False when the kernel does not say (no such process, no ``/proc``).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            # "pid (comm) S ...": the comm may contain spaces and parentheses.
            return handle.read().rpartition(b")")[2].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def cpu_sample(pid: int) -> Optional[CpuSample]:
    """CPU time and run state of ``pid``'s threads (Linux ``/proc``); None when the kernel does not say."""
    cpu_ns = 0
    runnable = False
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as handle:
                cpu_ns += int(handle.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as handle:
                # "pid (comm) S ...": the comm may contain spaces and parentheses.
                runnable |= handle.read().rpartition(b")")[2].split()[0] == b"R"
    except (OSError, IndexError, ValueError):
        return None
    return CpuSample(cpu_ns / 1e9, runnable)

