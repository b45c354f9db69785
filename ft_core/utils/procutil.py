"""Process helpers shared by the monitor, the launcher and tests (file permissions: :mod:`ft_core.jobdir`)."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import time
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple, Optional

__all__ = ["SIGNALS_TO_HANDLE_ENV", "CpuSample", "cpu_sample", "die_with_parent", "die_with_parent_preexec", "listens_on_tcp_port",
           "pid_alive", "process_group_members", "process_tree", "set_child_subreaper", "set_process_title",
           "signals_named", "wait_child_exited"]

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
#: The longest name the kernel keeps for a process (``comm``), without its NUL.
_COMM_LENGTH = 15
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
# Resolved once here: looking libc up inside a forked child (find_library runs
# ldconfig) would add ~20 ms to every process start.
_LIBC: Optional[ctypes.CDLL]
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - no dynamic libc
    _LIBC = None


#: torch elastic's environment variable naming the signals its launcher catches (``SIGTERM,SIGINT,...``).
SIGNALS_TO_HANDLE_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"


def signals_named(names: str) -> list[signal.Signals]:
    """The signals of a comma-separated list of names (``SIGTERM,SIGINT``); a name ``signal`` lacks is skipped."""
    return [sig for sig in (getattr(signal, name.strip(), None) for name in names.split(",")) if sig is not None]


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


def set_process_title(argv: Sequence[str]) -> None:
    """Show ``argv`` as this process's command line, and its program's base name as its name (Linux).

    For a process forked from another program's (a worker factory forked from
    ``ft_launcher``): ``ps``, ``pgrep [-f]``, ``pkill [-f]`` and ``top`` then
    see the program it now is, not the one it was forked from. The command
    line (``/proc/PID/cmdline``) is written over the original one in place, as
    ``setproctitle`` does, its arguments joined by spaces: where it does not
    fit, the program is named by its base name (``python -u train.py ...``,
    so that ``pgrep -f train.py`` still finds it), and what still does not
    fit is cut (a shorter one is shown up to 4 KiB: the kernel reads one page
    of a rewritten command line). The name (``comm``) is cut to 15 bytes by
    the kernel. Elsewhere, or if ``/proc`` does not say where the command
    line is, this changes nothing.
    """
    prctl = getattr(_LIBC, "prctl", None)
    if prctl is None or not argv:
        return
    prctl(_PR_SET_NAME, os.path.basename(argv[0]).encode()[:_COMM_LENGTH], 0, 0, 0)
    fields = _stat_fields("self")
    try:
        # Fields 48 and 49 of /proc/PID/stat (Linux 3.5+): where the original command line is.
        start, end = int(fields[45]), int(fields[46])  # type: ignore[index]
    except (TypeError, IndexError, ValueError):
        return
    if end - start < 2:
        return
    title = " ".join(argv).encode(errors="replace")
    if len(title) >= end - start:
        title = " ".join([os.path.basename(argv[0]), *argv[1:]]).encode(errors="replace")
    title = title[:end - start - 1] + b"\0"
    # The kernel shows the area up to its first NUL when the area's last byte is not a NUL (how it
    # recognises a rewritten command line), else the whole area: fill the rest with spaces.
    ctypes.memmove(start, title.ljust(end - start, b" "), end - start)


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


class CpuSample(NamedTuple):
    """What the kernel says about a process's threads at one moment."""

    cpu_seconds: float  # time on a CPU, summed over threads
    runnable: bool  # some thread is running or waiting for a CPU (state R)


def _state(stat_path: str) -> bytes:
    """The state letter of a ``/proc/.../stat`` file (raises ``OSError``/``IndexError`` when unreadable)."""
    with open(stat_path, "rb") as handle:
        # "pid (comm) S ...": the comm may contain spaces and parentheses.
        return handle.read().rpartition(b")")[2].split()[0]


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state ``T``: SIGSTOP, SIGTSTP; ``t``: a debugger) per Linux ``/proc``.

    False when the kernel does not say (no such process, no ``/proc``).
    """
    try:
        return _state(f"/proc/{pid}/stat") in (b"T", b"t")
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
            runnable |= _state(f"/proc/{pid}/task/{tid}/stat") == b"R"
    except (OSError, IndexError, ValueError):
        return None
    return CpuSample(cpu_ns / 1e9, runnable)



#: ``st`` of a listening socket in ``/proc/net/tcp``.
_TCP_LISTEN = "0A"


def listens_on_tcp_port(port: int) -> bool:
    """Whether this process holds a TCP socket listening on ``port`` (Linux ``/proc``; False when it cannot tell).

    The c10d rendezvous store is served by whichever launcher bound the endpoint's port first; torch
    does not say which, the kernel does.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                next(handle, None)  # header
                for line in handle:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == _TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{fields[9]}]")
        except (OSError, ValueError, IndexError):
            continue
    if not inodes:
        return False
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for fd in descriptors:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def _stat_fields(pid: str) -> Optional[list[bytes]]:
    """The fields of ``/proc/<pid>/stat`` after the comm: state, ppid, pgrp, ... (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rpartition(b")")[2].split()
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (a zombie is dead, only not yet reaped)."""
    fields = _stat_fields(str(pid))
    return fields is not None and bool(fields) and fields[0] != b"Z"


def process_group_members(pgids: Collection[int]) -> dict[int, list[int]]:
    """The live (not zombie) processes of each process group in ``pgids`` that has any (Linux ``/proc``).

    A group outlives its leader: the children a worker started (data loader workers, a
    forked checkpoint writer, a user subprocess) stay in it after the worker died.
    """
    wanted = {str(pgid).encode(): pgid for pgid in pgids}
    members: dict[int, list[int]] = {}
    if not wanted:
        return members
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is not None and len(fields) > 2 and fields[0] != b"Z" and fields[2] in wanted:
            members.setdefault(wanted[fields[2]], []).append(int(entry))
    return members


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live (not zombie) descendants, parents first (Linux ``/proc``: every process's parent pid).

    Read from every ``/proc/<pid>/stat`` rather than ``/proc/<pid>/task/<tid>/children``: that file needs
    ``CONFIG_PROC_CHILDREN``, which not every kernel has. Processes that come and go meanwhile are skipped.
    """
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [pid]
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is not None and len(fields) > 1 and fields[0] != b"Z" and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree = [pid]
    for member in tree:  # grows while it is walked: breadth first
        tree.extend(children.get(member, ()))
    return tree
