"""Crash-safe file writes: a reader sees the old file or the new one, never a torn one.

A write goes to a new temp file next to the target, created exclusively
without following symlinks and mode 0600 (state files hold paths and learned
timeouts), then is renamed over the target; a symlink planted at the target
is replaced, never followed. A writer killed before the rename leaves its
temp file behind: the next write of the same target removes those of dead
writers (see :func:`remove_stale_temp_files`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from typing import Any

from ft_core.jobdir import create_private_file

__all__ = ["STALE_TEMP_AGE", "atomic_replace", "atomic_write_json", "atomic_write_text", "read_json",
           "remove_stale_temp_files"]

#: A temp file of another host (a shared filesystem) is stale after this many seconds; no write takes that long.
STALE_TEMP_AGE = 600.0
_TEMP_SUFFIX = ".tmp"


def _temp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}."


@contextlib.contextmanager
def atomic_replace(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a new temp file path beside ``path``; when the body is done, make the temp file ``path``.

    The body writes the temp file (and may do more before the rename, e.g. record what
    it wrote). Then the temp file is fsynced, renamed over ``path`` and the directory
    fsynced, so the rename itself survives a power loss. If the body raises (a signal
    in the middle of a write), ``path`` is untouched and the temp file removed. Temp
    files that killed writers left are removed first (:func:`remove_stale_temp_files`).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    remove_stale_temp_files(path)
    # .<name>.<host>.<pid>.<random>.tmp: the next writer can tell whether its writer still runs.
    tmp_path = os.path.join(directory, f"{_temp_prefix(path)}{socket.gethostname()}.{os.getpid()}."
                                       f"{secrets.token_hex(4)}{_TEMP_SUFFIX}")
    try:
        yield tmp_path
        _fsync(tmp_path)
        os.replace(tmp_path, path)
    except BaseException:
        # The old file is untouched; only the temp file is removed.
        try:
            os.unlink(tmp_path)
        except FileNotFoundError:
            pass
        raise
    _fsync(directory)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to a private (0600) temp file in the same directory, fsync it, then rename over ``path``."""
    with atomic_replace(path) as tmp_path:
        with os.fdopen(create_private_file(tmp_path), "w", encoding="utf-8") as handle:
            handle.write(text)


def remove_stale_temp_files(path: str | os.PathLike[str]) -> list[str]:
    """Remove the temp files that killed writers of ``path`` left; returns their paths.

    A temp file is stale when it names this host and a process that no
    longer exists, or (another host's, or from an older naming) when it is
    older than :data:`STALE_TEMP_AGE`. Temp files of live writers and of
    other targets are kept.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    prefix = _temp_prefix(path)
    host = socket.gethostname()
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix) and n.endswith(_TEMP_SUFFIX)]
    except FileNotFoundError:
        return removed
    for name in names:
        temp = os.path.join(directory, name)
        fields = name[len(prefix):-len(_TEMP_SUFFIX)].rsplit(".", 2)  # host (may hold dots), pid, random
        if len(fields) == 3 and fields[0] == host and fields[1].isdigit():
            stale = not _alive(int(fields[1]))
        else:
            try:
                stale = time.time() - os.lstat(temp).st_mtime > STALE_TEMP_AGE
            except FileNotFoundError:
                continue
        if stale:
            try:
                os.unlink(temp)
                removed.append(temp)
            except FileNotFoundError:
                pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    return True


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
