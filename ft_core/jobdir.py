"""The job directory: its file names, their permissions, and the environment variables that point at them.

One home for every path convention shared by the monitor, the client, the
launcher and the standalone monitor, so no other module spells them::

    <job dir>/                  mode 0700 (ft_launcher: a fresh ``ft-*`` temp dir)
      monitor.sock              the node monitor's socket (0600)   FT_RANK_MONITOR_IPC_SOCKET
      monitor.sock.token        the job token (0600)               FT_MONITOR_TOKEN
      launcher.sock             ft_launcher's control socket (0600) FT_LAUNCHER_IPC_SOCKET
      monitor_events.jsonl      the monitor's event records (0600)
      stacks/rank<R>_pid<P>.txt each rank's faulthandler output (0700 dir)

    <log dir>/ft_events.jsonl   ft_launcher's event log
    <log dir>/ft_stacks/        stacks of hung ranks, kept after the job dir is removed

The monitor derives its files from its socket's directory, so a monitor
started by hand on any socket path (:meth:`JobDir.of_socket`) keeps the same
layout. This module imports nothing heavy: ranks import it.
"""

from __future__ import annotations

import dataclasses
import os
import stat

__all__ = [
    "FINISHED_FLAG_ENV",
    "JobDir",
    "LAUNCHER_EVENTS_FILE",
    "LAUNCHER_SOCKET_ENV",
    "MONITOR_SOCKET_ENV",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SAVED_STACKS_DIR",
    "TOKEN_ENV",
    "make_private_dir",
    "saved_stack_path",
    "saved_stacks_dir",
    "stack_dump_dir",
    "token_path",
    "write_private_file",
]

# -- environment variables -----------------------------------------------------
#: The node monitor's socket; set by ft_launcher (or the standalone monitor) for every rank.
MONITOR_SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
#: ft_launcher's workload-control socket.
LAUNCHER_SOCKET_ENV = "FT_LAUNCHER_IPC_SOCKET"
#: The job secret every connection to the monitor or the launcher presents first.
TOKEN_ENV = "FT_MONITOR_TOKEN"
#: File global rank 0 creates when training is complete, so a requeue loop stops (NVRx's name).
FINISHED_FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"

# -- names ----------------------------------------------------------------------
MONITOR_SOCKET = "monitor.sock"
LAUNCHER_SOCKET = "launcher.sock"
TOKEN_SUFFIX = ".token"
MONITOR_EVENTS_FILE = "monitor_events.jsonl"
STACKS_DIR = "stacks"
#: The launcher's event log, in its log directory (not in the job dir, which is removed at exit).
LAUNCHER_EVENTS_FILE = "ft_events.jsonl"
#: Next to the launcher's event log: the stacks of hung ranks.
SAVED_STACKS_DIR = "ft_stacks"

# -- permissions ----------------------------------------------------------------
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


@dataclasses.dataclass(frozen=True)
class JobDir:
    """The paths of one job directory (absolute)."""

    path: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.path.abspath(self.path))

    @classmethod
    def of_socket(cls, socket_path: str) -> JobDir:
        """The job directory a monitor socket lives in."""
        return cls(os.path.dirname(os.path.abspath(socket_path)))

    @property
    def monitor_socket(self) -> str:
        return os.path.join(self.path, MONITOR_SOCKET)

    @property
    def launcher_socket(self) -> str:
        return os.path.join(self.path, LAUNCHER_SOCKET)

    @property
    def monitor_events(self) -> str:
        return os.path.join(self.path, MONITOR_EVENTS_FILE)

    @property
    def stacks(self) -> str:
        return os.path.join(self.path, STACKS_DIR)

    def stack_dump_file(self, rank: int, pid: int) -> str:
        """Where rank ``rank`` (process ``pid``) has faulthandler write its stacks."""
        return os.path.join(self.stacks, f"rank{rank}_pid{pid}.txt")

    def create(self) -> JobDir:
        """Create the directory (mode 0700) and its ``stacks`` subdirectory; returns self."""
        make_private_dir(self.path)
        make_private_dir(self.stacks)
        return self


def token_path(socket_path: str) -> str:
    """``<socket>.token``: the job token for ranks that did not inherit ``FT_MONITOR_TOKEN``."""
    return socket_path + TOKEN_SUFFIX


def stack_dump_dir(socket_path: str) -> str:
    """Where ranks write their faulthandler dumps: ``<socket dir>/stacks``."""
    return JobDir.of_socket(socket_path).stacks


def saved_stacks_dir(events_path: str) -> str:
    """Where the monitor keeps the stacks of hung ranks for ft_launcher: ``<event log dir>/ft_stacks``."""
    return os.path.join(os.path.dirname(os.path.abspath(events_path)), SAVED_STACKS_DIR)


def saved_stack_path(stacks_dir: str, cycle: int, rank: int, pid: int) -> str:
    """A hung rank's kept stack, named by the cycle it hung in: ``<stacks_dir>/cycle<C>_rank<R>_pid<P>.txt``."""
    return os.path.join(stacks_dir, f"cycle{cycle}_rank{rank}_pid{pid}.txt")


def make_private_dir(path: str) -> None:
    """Create ``path`` with mode 0700 if missing; tighten it if we own it and it is wider."""
    os.makedirs(path, mode=PRIVATE_DIR_MODE, exist_ok=True)
    info = os.stat(path)
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077 and not _is_shared_tmp(path):
        os.chmod(path, PRIVATE_DIR_MODE)


def _is_shared_tmp(path: str) -> bool:
    # Never chmod a sticky shared directory such as /tmp.
    return bool(os.stat(path).st_mode & stat.S_ISVTX)


def write_private_file(path: str, text: str) -> None:
    """Write a secret readable only by the owner (created 0600, never world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
