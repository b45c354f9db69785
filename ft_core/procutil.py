"""Process and file-permission helpers shared by the monitor, the launcher and tests."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import stat
import time
from collections.abc import Callable
from typing import Optional

__all__ = ["die_with_parent", "die_with_parent_preexec", "make_private_dir", "set_child_subreaper",
           "wait_child_exited", "write_private_file"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
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


def die_with_parent_preexec(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` for children of ``parent_pid``: SIGKILL with the parent, exit if it is already gone."""

    def _preexec() -> None:
        die_with_parent(signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return _preexec


def set_child_subreaper(enabled: bool) -> bool:
    """Make orphaned descendants of this process its children (Linux ``PR_SET_CHILD_SUBREAPER``).

    Returns the previous setting; raises ``OSError`` where the kernel does not support it.
    """
    prctl = getattr(_LIBC, "prctl", None)
    if prctl is None:
        raise OSError("prctl is not available")
    previous = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0 or \
            prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"PR_SET_CHILD_SUBREAPER: {os.strerror(errno)}")
    return bool(previous.value)


def wait_child_exited(pid: int, timeout: float) -> bool:
    """Wait until the child ``pid`` has exited, at most ``timeout`` seconds; it is left to reap.

    A pidfd wakes us at the exit itself (Linux 5.3+); without one, poll with
    ``waitid(WNOWAIT)``, as ``Popen.wait`` polls, every 0.5 ms doubling to 50 ms.
    """
    deadline = time.monotonic() + timeout
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        delay = 0.0005
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)
        return True
    try:
        return bool(select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))[0])
    finally:
        os.close(pidfd)


def make_private_dir(path: str) -> None:
    """Create ``path`` with mode 0700 if missing; tighten it if we own it and it is wider."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077 and not _is_shared_tmp(path):
        os.chmod(path, 0o700)


def _is_shared_tmp(path: str) -> bool:
    # Never chmod a sticky shared directory such as /tmp.
    return bool(os.stat(path).st_mode & stat.S_ISVTX)


def write_private_file(path: str, text: str) -> None:
    """Write a secret readable only by the owner (created 0600, never world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
