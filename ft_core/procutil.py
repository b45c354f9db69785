"""Process helpers shared by the monitor, the launcher and tests (file permissions: :mod:`ft_core.jobdir`)."""

from __future__ import annotations

import ctypes
import signal

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1
# Resolved once here: looking libc up inside a forked child (find_library runs
# ldconfig) would add ~20 ms to every process start.
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

