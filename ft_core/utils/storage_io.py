"""Storage I/O of a process tree, read from the kernel: the offsets of the regular files it has open.

The monitor's evidence that a rank past its deadline is saving (or loading) over slow storage
rather than hung (see :mod:`ft_core.monitor.slow_storage`). Why file offsets and not the byte
counters of ``/proc/<pid>/io``:

* ``rchar``/``wchar`` count every ``read``/``write``: pipes, sockets and the tty too, so a hung
  rank whose logging thread prints looks busy. A descriptor's offset (``pos`` in
  ``/proc/<pid>/fdinfo/<fd>``) moves only with reads and writes of that file, and the link
  ``/proc/<pid>/fd/<fd>`` says what the file is: pipes, sockets and devices are not regular files.
* ``/proc/<pid>/io`` counts one process; a fork-based async checkpoint writer (Megatron's async
  save, torch DCP's process-based async save) writes from a child. The files of the rank's
  descendants are read too.
* Logs are regular files as well: the process's stdout and stderr (a file under torchrun's
  ``--redirects`` or ``tee``) and files open in append mode (``logging.FileHandler``, TensorBoard
  event files) are left out. Checkpoint writers (``torch.save``, torch DCP, Megatron,
  safetensors, Lightning through fsspec) open their files with ``"wb"``, never to append.

A file's size is read beside its offset: writers that ``pwrite`` (GPUDirect Storage, O_DIRECT
libraries) grow a file without moving an offset. Processes and descriptors that come and go
between two reads are skipped; nothing here raises for them.

This module must not import torch: the monitor imports it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from typing import NamedTuple, Optional

from ft_core.utils.procutil import process_tree

__all__ = ["FileKey", "FileOffset", "StorageSample", "open_regular_files", "storage_sample"]

#: Link targets of descriptors that are never storage, skipped before any further read: pipes, sockets,
#: epoll/eventfd descriptors, and the kernel's pseudo-files (regular files to ``stat``, but not storage).
_NOT_STORAGE = ("pipe:", "socket:", "anon_inode:", "/proc/", "/sys/")


class FileKey(NamedTuple):
    """One open file of one process: the process, the descriptor and the file (device and inode)."""

    pid: int
    fd: int
    dev: int
    ino: int


class FileOffset(NamedTuple):
    """Where a process is in an open regular file."""

    pos: int  # the descriptor's offset: moves with every read and write through it
    size: int  # the file's size: grows with writes that do not move the offset (pwrite)
    writable: bool  # opened for writing (O_WRONLY or O_RDWR)


#: The regular files a process tree has open, by key.
StorageSample = dict[FileKey, FileOffset]


def storage_sample(pid: int) -> StorageSample:
    """The regular files ``pid`` and its descendants have open (see the module docstring).

    Empty when the kernel does not show them (no such process, no permission, no ``/proc``): no evidence.
    """
    return open_regular_files(process_tree(pid))


def open_regular_files(pids: Iterable[int]) -> StorageSample:
    """The regular files the processes ``pids`` have open, but their stdout, stderr and append-mode files."""
    files: StorageSample = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to read
        logs = _std_streams(pid)
        for fd in fds:
            opened = _regular_file(pid, fd)
            if opened is not None and (opened[0].dev, opened[0].ino) not in logs:
                files[opened[0]] = opened[1]
    return files


def _regular_file(pid: int, fd: str) -> Optional[tuple[FileKey, FileOffset]]:
    """Descriptor ``fd`` of ``pid`` when it is a regular file not open to append; None otherwise or when gone."""
    link = f"/proc/{pid}/fd/{fd}"
    try:
        if os.readlink(link).startswith(_NOT_STORAGE):
            return None
        info = os.stat(link)  # follows the link: the open file itself
        if not stat.S_ISREG(info.st_mode):
            return None
        with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as handle:
            fields = dict(line.split(b":", 1) for line in handle.read().splitlines() if b":" in line)
        pos, flags, ino = int(fields[b"pos"]), int(fields[b"flags"], 8), int(fields[b"ino"])
    except (OSError, KeyError, ValueError):
        return None
    if ino != info.st_ino or flags & os.O_APPEND:
        return None  # the descriptor was closed and reused between the reads; or a log
    return (FileKey(pid, int(fd), info.st_dev, info.st_ino),
            FileOffset(pos, info.st_size, flags & os.O_ACCMODE != os.O_RDONLY))


def _std_streams(pid: int) -> set[tuple[int, int]]:
    """The files (device, inode) of ``pid``'s stdout and stderr: its logs, wherever they are redirected."""
    streams = set()
    for fd in (1, 2):
        try:
            info = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        streams.add((info.st_dev, info.st_ino))
    return streams
