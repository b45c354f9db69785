"""The job directory: its file names, their permissions, and the environment variables that point at them.

One home for every path convention shared by the monitor, the client, the
launcher and the standalone monitor, so no other module spells them::

    <job dir>/                  mode 0700 (ft_launcher: <runtime root>/job-<random>, see below)
      owner.pid                 ft_launcher: written once it holds the directory's flock
      monitor.sock              the node monitor's socket (0600)   FT_RANK_MONITOR_IPC_SOCKET
      monitor.sock.token        the job token (0600)               FT_MONITOR_TOKEN
      launcher.sock             ft_launcher's control socket (0600) FT_LAUNCHER_IPC_SOCKET
      monitor_events.jsonl      the monitor's event records (0600)
      stacks/rank<R>_pid<P>.txt each rank's faulthandler output (0700 dir)
    /dev/shm/ft-<uid>/job-<random>/ its in-memory snapshots (ft_core.snapshots.space), same name, lock and lifetime

    <log dir>/ft_events.jsonl   ft_launcher's event log
    <log dir>/ft_stacks/        stacks of hung ranks, kept after the job dir is removed

The monitor derives its files from its socket's directory, so a monitor
started by hand on any socket path (:meth:`JobDir.of_socket`) keeps the same
layout. This module imports nothing heavy: ranks import it.

Shared hosts (login and compute nodes, a shared ``/tmp``) are hostile ground:
another user may pre-create a directory we are about to use, or plant a
symlink where we are about to write. So:

* a job directory is used only if it is a real directory (not a symlink)
  owned by the current user and not a shared sticky directory such as
  ``/tmp``; a group- or world-accessible one is tightened to 0700 with a
  warning (:func:`make_private_dir`, :class:`UnsafePathError` otherwise);
* every file is created new (``O_CREAT | O_EXCL | O_NOFOLLOW``), mode 0600
  (:func:`create_private_file`); replacing one unlinks the old entry (never
  its target) first. Append-only logs, which several writers share, are
  opened with ``O_NOFOLLOW`` and must be regular files we own
  (:func:`open_private_log`);
* default locations are unpredictable: ``ft_launcher`` creates its job
  directory with ``mkdtemp`` inside a verified per-user directory
  (:func:`runtime_root`: ``$XDG_RUNTIME_DIR/ft-<uid>`` or
  ``$TMPDIR/ft-<uid>``), holds an ``flock`` on it while it runs, and removes
  the directories of launchers that were SIGKILLed (:func:`claim_job_dir`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import logging
import os
import pwd
import shutil
import socket
import stat
import tempfile
from typing import Optional

__all__ = [
    "FINISHED_FLAG_ENV",
    "JOB_DIR_PREFIX",
    "JobDir",
    "JobDirClaim",
    "SocketLink",
    "LAUNCHER_EVENTS_FILE",
    "LAUNCHER_SOCKET_ENV",
    "MONITOR_SOCKET_ENV",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SAVED_STACKS_DIR",
    "TOKEN_ENV",
    "UnsafePathError",
    "claim_job_dir",
    "create_private_file",
    "make_private_dir",
    "open_private_log",
    "read_private_file",
    "remove_stale_job_dirs",
    "runtime_root",
    "keep_stack",
    "is_shared_dir",
    "link_socket",
    "resolve_socket_link",
    "saved_stack_path",
    "saved_stacks_dir",
    "stack_dump_dir",
    "token_path",
    "write_private_file",
]

log = logging.getLogger("ft_core.jobdir")

# -- environment variables -----------------------------------------------------
#: The node monitor's socket; set by ft_launcher (or the standalone monitor) for every rank.
MONITOR_SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
#: ft_launcher's workload-control socket.
LAUNCHER_SOCKET_ENV = "FT_LAUNCHER_IPC_SOCKET"
#: The job secret every connection to the monitor or the launcher presents first.
TOKEN_ENV = "FT_MONITOR_TOKEN"
#: File global rank 0 creates when training is complete, so a requeue loop stops (NVRx's name).
FINISHED_FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"
#: The per-user runtime directory (set by systemd-logind); preferred over $TMPDIR for job dirs.
RUNTIME_DIR_ENV = "XDG_RUNTIME_DIR"

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
#: ``ft_launcher``'s job directories in :func:`runtime_root`: ``job-<random>``.
JOB_DIR_PREFIX = "job-"
#: Written into a launcher's job dir once its owner holds the directory's flock.
OWNER_FILE = "owner.pid"
_AF_UNIX_PATH_MAX = 107  # sun_path holds 108 bytes, NUL included
# The longest socket path below runtime_root(): the standalone monitor's (a launcher's "/job-<8>/launcher.sock"
# is shorter).
_LONGEST_BELOW_ROOT = len("/standalone-0123456789ab/monitor.sock")

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


def keep_stack(stacks_dir: str, cycle: int, rank: int, pid: int, stack: str) -> str:
    """Write a hung rank's stack to :func:`saved_stack_path` (dir 0700, file 0600, no symlink followed).

    Raises:
        OSError: it cannot be written (``UnsafePathError`` if ``stacks_dir`` is not a private dir of ours).
    """
    path = saved_stack_path(stacks_dir, cycle, rank, pid)
    make_private_dir(stacks_dir)
    write_private_file(path, stack)
    return path


class UnsafePathError(PermissionError):
    """A path another user could control: a symlink, a foreign owner, a shared directory."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def make_private_dir(path: str, *, uid: Optional[int] = None) -> None:
    """Create ``path`` (mode 0700), or check that the existing directory is safe to use as ours.

    An existing ``path`` must be a real directory (not a symlink) owned by
    ``uid`` (default: the effective uid) and not a shared sticky directory;
    a group- or world-accessible mode is tightened to 0700 with a warning.

    Raises:
        UnsafePathError: ``path`` is a symlink, not a directory, owned by someone else, or shared.
    """
    path = os.path.abspath(path)
    uid = os.geteuid() if uid is None else uid
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            what = f"a symlink to {os.readlink(path)}" if os.path.islink(path) else "not a directory"
            raise UnsafePathError(f"{path} is {what}: a job directory must be a real directory of its own "
                                  "(another user may have planted it); remove it or choose another path") from None
        raise
    try:
        info = os.fstat(fd)
        if info.st_uid != uid:
            raise UnsafePathError(
                f"{path} is owned by {_owner(info.st_uid)}, not by the current user ({_owner(uid)}): another "
                "user may have created it to read the job token or redirect its files; remove it or choose "
                "another path")
        mode = stat.S_IMODE(info.st_mode)
        if mode & stat.S_ISVTX:
            raise UnsafePathError(f"{path} is a shared directory (sticky bit, mode {oct(mode)}), like /tmp: "
                                  "the job's socket and token need a private directory of their own")
        if mode & 0o077:
            log.warning("%s had mode %s (group/world accessible); tightened to 0o700", path, oct(mode))
            os.fchmod(fd, PRIVATE_DIR_MODE)
    finally:
        os.close(fd)


def create_private_file(path: str, *, replace: bool = False, append: bool = False) -> int:
    """Create ``path`` as a new file, mode 0600, and return a write-only descriptor.

    Never opens an existing file nor follows a symlink (``O_EXCL | O_NOFOLLOW``).
    With ``replace``, an existing entry (a file, or a planted symlink) is
    unlinked first; its target is never touched.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileExistsError:
        if not replace:
            raise
        os.unlink(path)
        # Another process re-creating the entry in between makes this fail: never write to theirs.
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    os.fchmod(fd, PRIVATE_FILE_MODE)  # whatever the umask
    return fd


def write_private_file(path: str, text: str) -> None:
    """Write a secret readable only by the owner: a new 0600 file replaces whatever ``path`` was."""
    fd = create_private_file(path, replace=True)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _open_own_regular_file(path: str, flags: int, mode: int = PRIVATE_FILE_MODE) -> int:
    """``os.open`` without following a last-component symlink; the result must be a regular file we own."""
    try:
        # O_NONBLOCK: opening a planted FIFO must not block; regular files ignore it.
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symlink (to {os.readlink(path)}); refusing to follow it") from None
        raise
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    elif info.st_uid != os.geteuid():
        problem = f"is owned by {_owner(info.st_uid)}, not by the current user"
    if problem is not None:
        os.close(fd)
        raise UnsafePathError(f"{path} {problem}; refusing to use it")
    return fd


def open_private_log(path: str) -> int:
    """Open an append-only log (created 0600; an existing one must be a regular file we own).

    Logs are shared by several writers (launchers of one job, respawned
    monitors), so they cannot be created exclusively; ``O_NOFOLLOW`` and the
    owner check keep a planted symlink or another user's file out. A wider
    mode of our own file is tightened to 0600. Returns a write-only
    descriptor opened with ``O_APPEND``.
    """
    fd = _open_own_regular_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    if stat.S_IMODE(os.fstat(fd).st_mode) != PRIVATE_FILE_MODE:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    return fd


def read_private_file(path: str) -> str:
    """The text of ``path``, which must be a regular file owned by the current user (not a symlink)."""
    fd = _open_own_regular_file(path, os.O_RDONLY)
    with os.fdopen(fd, encoding="utf-8") as handle:
        return handle.read()


# -- where job directories live -------------------------------------------------------
def runtime_root(*, uid: Optional[int] = None) -> str:
    """The per-user directory job directories are created in: ``<base>/ft-<uid>``, mode 0700, verified.

    ``<base>`` is ``$XDG_RUNTIME_DIR`` when it is set and exists (a private
    tmpfs per user on most systems), else the temp dir (``$TMPDIR``, then
    ``/tmp``); one whose socket paths would exceed the ``AF_UNIX`` limit is
    skipped. The name is predictable on purpose (the standalone monitor's
    ranks derive it independently), so it is checked like any job dir:
    another user who pre-creates it gets an :class:`UnsafePathError`, never
    our token.
    """
    uid = os.geteuid() if uid is None else uid
    name = f"ft-{uid}"
    candidates = [os.environ.get(RUNTIME_DIR_ENV, ""), tempfile.gettempdir(), "/tmp"]
    for base in candidates:
        if base and os.path.isdir(base) and len(os.path.join(base, name)) + _LONGEST_BELOW_ROOT <= _AF_UNIX_PATH_MAX:
            root = os.path.join(os.path.abspath(base), name)
            make_private_dir(root, uid=uid)
            return root
    raise UnsafePathError(f"no usable base directory for job directories among {candidates}")


@dataclasses.dataclass
class JobDirClaim:
    """A job directory this process created, locked (``flock``) until :meth:`release`."""

    job_dir: JobDir
    _lock_fd: Optional[int]

    def release(self) -> None:
        """Remove the directory and drop the lock (idempotent)."""
        if self._lock_fd is None:
            return
        shutil.rmtree(self.job_dir.path, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = None


def claim_job_dir(root: Optional[str] = None) -> JobDirClaim:
    """Create a fresh, unpredictable job directory in ``root`` (default :func:`runtime_root`) and lock it.

    First removes the job directories in ``root`` whose owner no longer
    holds its lock (a SIGKILLed launcher; see :func:`remove_stale_job_dirs`).
    The lock is an ``flock`` on the directory itself, held by this process
    (not inherited across ``exec``) until :meth:`JobDirClaim.release` or its
    death; ``owner.pid`` in it says the lock was taken.
    """
    if root is None:
        root = runtime_root()
    else:
        make_private_dir(root)
    remove_stale_job_dirs(root)
    path = tempfile.mkdtemp(prefix=JOB_DIR_PREFIX, dir=root)  # mode 0700, a name nobody can guess
    lock_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    # Only now: a sweeper removes nothing without this file, so it never sees our dir unlocked.
    write_private_file(os.path.join(path, OWNER_FILE), f"{os.getpid()}\n")
    return JobDirClaim(JobDir(path).create(), lock_fd)


def remove_stale_job_dirs(root: str) -> list[str]:
    """Remove the launcher job directories in ``root`` that no live process holds; returns their paths.

    Only ``job-*`` directories (not symlinks) owned by the current user with
    an ``owner.pid`` are considered, and each is removed only while this
    process holds its lock, so a running launcher's directory is never
    touched. Anything else in ``root`` (a standalone monitor's directory
    kept for its stack dumps) is left alone.
    """
    removed = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not name.startswith(JOB_DIR_PREFIX) or not os.path.lexists(os.path.join(path, OWNER_FILE)):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # a symlink, or gone meanwhile
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its launcher is alive
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d job director%s left by launchers that no longer run: %s", len(removed),
                 "y" if len(removed) == 1 else "ies", ", ".join(removed))
    return removed


# -- a monitor socket asked for in a shared directory (NVRx's habit: /tmp/_rmon_r0.socket) ----------
def is_shared_dir(path: str) -> bool:
    """Whether ``path`` is a shared sticky directory such as ``/tmp`` (never a job directory)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and bool(info.st_mode & stat.S_ISVTX)


@dataclasses.dataclass
class SocketLink:
    """A monitor socket asked for in a shared directory: a symlink there to the socket of a private job dir.

    The job's token, event log and stack dumps never land in the shared
    directory: they live in the claimed job directory beside the real socket
    (:func:`resolve_socket_link` leads ranks there).
    """

    link: str
    claim: JobDirClaim

    @property
    def socket_path(self) -> str:
        """The real socket, in the private job directory."""
        return self.claim.job_dir.monitor_socket

    def release(self) -> None:
        """Remove the link (if it is still ours, to our socket) and the job directory (idempotent)."""
        with contextlib.suppress(OSError):
            if os.lstat(self.link).st_uid == os.geteuid() and os.readlink(self.link) == self.socket_path:
                os.unlink(self.link)
        self.claim.release()


def link_socket(link: str) -> SocketLink:
    """Claim a private job directory and point ``link`` (in a shared directory) at its monitor socket.

    An entry already at ``link`` is replaced only if it is ours and no
    process serves it (a dead monitor's socket or link).

    Raises:
        UnsafePathError: ``link`` belongs to another user.
        RuntimeError: a live monitor serves ``link``.
    """
    link = os.path.abspath(link)
    claim = claim_job_dir()
    try:
        _remove_dead_entry(link)
        os.symlink(claim.job_dir.monitor_socket, link)  # fails if anyone re-created the entry meanwhile
    except BaseException:
        claim.release()
        raise
    return SocketLink(link, claim)


def _remove_dead_entry(path: str) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if info.st_uid != os.geteuid():
        raise UnsafePathError(f"{path} is owned by {_owner(info.st_uid)}, not by the current user: another user "
                              "may have planted it to receive the job token; remove it or choose another path")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)
            return
    raise RuntimeError(f"another process is already serving {path}")


def resolve_socket_link(path: str) -> str:
    """The socket a monitor path names: ``path`` itself, or where our symlink there points (:func:`link_socket`).

    Raises:
        UnsafePathError: ``path`` is a symlink of another user's (it could lead a rank to a foreign socket).
    """
    try:
        info = os.lstat(path)
    except OSError:
        return path
    if not stat.S_ISLNK(info.st_mode):
        return path
    if info.st_uid != os.geteuid():
        raise UnsafePathError(f"{path} is a symlink owned by {_owner(info.st_uid)}, not by the current user; "
                              "refusing to follow it to a socket that may not be the job's monitor")
    return os.path.join(os.path.dirname(os.path.abspath(path)), os.readlink(path))
