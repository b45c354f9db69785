"""The job's snapshot directory in shared memory, and who owns it.

Snapshots live in RAM (``/dev/shm``, a tmpfs) so that a write costs a memory copy and
they survive the workers: the directory belongs to ``ft_launcher``, which outlives
its workers, and follows the job directory's rules (:mod:`ft_core.jobdir`)::

    /dev/shm/ft-<uid>/                 mode 0700, verified like the runtime root
      job-<random>/                    mode 0700, the job dir's name; locked (flock) by its launcher
        owner.pid                      written once the launcher holds the lock
        world<W>/rank<R>/slot<0|1>/    a rank's two slots (ft_core.snapshots.slots)

It is created with the job directory (:func:`claim_snapshot_dir`, from
:func:`ft_core.jobdir.claim_job_dir`) and removed with it, whatever way the launcher
ends; the directories of SIGKILLed launchers (no live lock) are removed by the next
launcher on this host, exactly as stale job directories are
(:func:`ft_core.jobdir.remove_stale_job_dirs`). A rank finds it from its monitor
socket's directory (:func:`snapshot_dir_for_socket`); without ``ft_launcher`` there is
no owner, and no snapshots.
"""

from __future__ import annotations

import fcntl
import logging
import os
from typing import Optional

from ft_core.jobdir import (
    OWNER_FILE,
    JobDir,
    JobDirClaim,
    UnsafePathError,
    make_private_dir,
    remove_stale_job_dirs,
    write_private_file,
)

__all__ = ["SHM_BASE", "claim_snapshot_dir", "shm_root", "snapshot_dir_for_socket"]

log = logging.getLogger("ft_core.snapshots")

#: The shared-memory filesystem snapshots are kept in.
SHM_BASE = "/dev/shm"


def shm_root(*, base: str = SHM_BASE) -> Optional[str]:
    """``<base>/ft-<uid>`` (mode 0700, verified), or None when ``base`` does not exist."""
    if not os.path.isdir(base):
        return None
    root = os.path.join(base, f"ft-{os.geteuid()}")
    make_private_dir(root)
    return root


def claim_snapshot_dir(job_dir: JobDir, *, base: str = SHM_BASE) -> Optional[JobDirClaim]:
    """Create and lock the snapshot directory of ``job_dir``; None (and a warning) when there can be none.

    First removes the snapshot directories of launchers that no longer run.
    :meth:`JobDirClaim.release` removes it.
    """
    try:
        root = shm_root(base=base)
        if root is None:
            log.warning("%s does not exist: in-memory snapshots are off for this job", base)
            return None
        remove_stale_job_dirs(root)
        path = os.path.join(root, os.path.basename(job_dir.path))
        os.mkdir(path, 0o700)  # the job dir's unguessable name; never an existing directory
    except OSError as exc:  # UnsafePathError included: another user's ft-<uid>
        log.warning("cannot create the snapshot directory in %s (%s): in-memory snapshots are off for this job",
                    base, exc)
        return None
    lock_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    write_private_file(os.path.join(path, OWNER_FILE), f"{os.getpid()}\n")
    return JobDirClaim(JobDir(path), lock_fd)


def snapshot_dir_for_socket(socket_path: str, *, base: str = SHM_BASE) -> Optional[str]:
    """The snapshot directory of the launcher whose monitor socket is ``socket_path``; None without one."""
    root = os.path.join(base, f"ft-{os.geteuid()}")
    path = os.path.join(root, os.path.basename(JobDir.of_socket(socket_path).path))
    if not os.path.lexists(os.path.join(path, OWNER_FILE)):
        return None  # not started by ft_launcher (the standalone monitor), or snapshots are off
    try:
        make_private_dir(root)
        make_private_dir(path)
    except UnsafePathError as exc:
        log.warning("in-memory snapshots are off: %s", exc)
        return None
    return path
