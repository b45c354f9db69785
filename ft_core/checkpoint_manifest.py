"""Checkpoint manifests: what a complete checkpoint looks like, written beside it, checked before a resume.

A torn or half-written checkpoint makes every resume fail the same way, so a
restart that loads it again is a restart in vain. Every checkpoint the
integrations write gets a small manifest: for each of its files the size and a
CRC-32 of the content (zlib's, about 2.5 GB/s here: a fast check of what is on
disk, not a cryptographic one), the global step and the run that wrote it.
Before a resume the manifest is checked (:func:`verify`); a checkpoint that
fails is skipped for the newest older one that passes (:func:`first_accepted`).

Where the manifest lives:

* a checkpoint *file* ``path`` (Lightning's ``.ckpt``): ``<path>.manifest.json``;
* a checkpoint *directory* (sharded, Megatron's ``iter_N``): ``<dir>/ft_manifest.json``,
  listing every file under it.

A file that is overwritten in place (Lightning's ``last.ckpt``) is written to a
temp file first, and the manifest lists the new content *and* the ones it
may replace until the rename is done (:func:`save_file_atomically`): a kill at any
instant leaves a file that matches one of the manifest's entries, so a complete
checkpoint is never rejected for the moment it was killed in, and a torn one
always is.

A checkpoint can also be marked bad (:func:`mark_bad`: the launcher's
verdict after a fault repeated right after resuming from it, or a non-finite
loss right after the resume); :func:`verify` rejects it from then on. The mark
names the content it condemns (the manifest's files, sizes and CRC-32s): a
checkpoint saved again under the same name (Lightning's ``last.ckpt``, a
Megatron ``iter_N`` written again after a fallback) is a new checkpoint, and
the old mark does not apply to it.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional

from ft_core.utils.fileutil import atomic_replace, atomic_write_json, read_json

__all__ = [
    "DIR_MANIFEST",
    "FileEntry",
    "Manifest",
    "Rejection",
    "Version",
    "checksum",
    "first_accepted",
    "has_bad_mark",
    "manifest_path",
    "mark_bad",
    "read_manifest",
    "save_file_atomically",
    "verified_version",
    "verify",
    "write_dir_manifest",
]

#: The manifest of a checkpoint directory, inside it.
DIR_MANIFEST = "ft_manifest.json"
_FILE_MANIFEST_SUFFIX = ".manifest.json"
_BAD_SUFFIX = ".bad.json"
_CHUNK = 8 << 20
#: Contents a manifest lists at most: more than one only while saves of the same file are killed before
#: their rename, one after another (the file on disk is then the oldest listed).
MAX_VERSIONS = 16
FORMAT_VERSION = 1


def checksum(path: str, *, mapped: bool = False) -> tuple[int, int]:
    """``(size, crc32)`` of a file's content, read in 8 MiB chunks.

    ``mapped``: over a read-only memory map of the file instead (no copy into Python buffers,
    about a third faster), for files nobody changes in place, as the snapshot slots' (a
    writer replaces a file, never truncates it): a mapped file truncated while it is read
    kills the process with SIGBUS, where a read one only fails its check.
    """
    with open(path, "rb") as handle:
        if mapped and os.fstat(handle.fileno()).st_size > 0:
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
                return len(view), zlib.crc32(view)
        crc, size = 0, 0
        while chunk := handle.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
        return size, crc


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint as it was written: path relative to the checkpoint, size, CRC-32."""

    name: str
    size: int
    crc32: int


@dataclasses.dataclass(frozen=True)
class Version:
    """One acceptable content of a checkpoint: its files, and the step and run that wrote them."""

    files: tuple[FileEntry, ...]
    global_step: Optional[int]
    run: Optional[str]
    written: float

    def to_dict(self) -> dict[str, Any]:
        return {"files": [dataclasses.asdict(entry) for entry in self.files], "global_step": self.global_step,
                "run": self.run, "written": self.written}

    @classmethod
    def from_dict(cls, data: Any) -> Version:
        step = data.get("global_step")
        return cls(tuple(FileEntry(str(e["name"]), int(e["size"]), int(e["crc32"])) for e in data["files"]),
                   None if step is None else int(step), data.get("run"), float(data["written"]))


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A checkpoint's manifest: its acceptable contents, newest first.

    Two versions only while a file checkpoint is being overwritten in place (the new
    content and the one it replaces); each carries its own step, so a resume knows
    which step it really loads.
    """

    versions: tuple[Version, ...]

    @property
    def global_step(self) -> Optional[int]:
        """The newest version's step (for ordering candidates; :func:`verified_version` says which is on disk)."""
        return self.versions[0].global_step if self.versions else None

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "versions": [version.to_dict() for version in self.versions]}

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """Raises ``ValueError`` naming what is wrong: a manifest is read from disk, a boundary."""
        if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
            raise ValueError(f"not a version-{FORMAT_VERSION} checkpoint manifest")
        try:
            return cls(tuple(Version.from_dict(version) for version in data["versions"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed checkpoint manifest: {exc!r}") from None


def manifest_path(checkpoint: str) -> str:
    """Where the manifest of ``checkpoint`` (a file or a directory) is."""
    if os.path.isdir(checkpoint):
        return os.path.join(checkpoint, DIR_MANIFEST)
    return checkpoint + _FILE_MANIFEST_SUFFIX


def read_manifest(checkpoint: str) -> Optional[Manifest]:
    """The manifest of ``checkpoint``; None when it has none. Raises ``ValueError`` for a malformed one."""
    path = manifest_path(checkpoint)
    try:
        return Manifest.from_dict(read_json(path))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed checkpoint manifest {path}: {exc}") from None


def _write_manifest(checkpoint_manifest: str, versions: Sequence[Version]) -> None:
    atomic_write_json(checkpoint_manifest, Manifest(tuple(versions)).to_dict())


def save_file_atomically(path: str, write: Callable[[str], None], *, global_step: Optional[int] = None,
                         run: Optional[str] = None) -> None:
    """Write a file checkpoint with ``write(temp_path)``, then make it ``path`` with its manifest.

    The steps, each crash-safe: ``write`` into a temp file beside ``path`` (the temp
    files of killed writers are removed first) and fsync it; list the new content in
    the manifest before the contents it already lists (one of them is on disk now);
    rename the temp file over ``path`` and fsync the directory; keep only the new
    content in the manifest. The old file is not read again: a load's check finds
    which listed content is there. Only local paths: a remote URL (``s3://``) has no
    rename.
    """
    mpath = manifest_path(path)
    with atomic_replace(path) as temp:
        write(temp)
        size, crc = checksum(temp)
        new = Version((FileEntry(os.path.basename(path), size, crc),), global_step, run, time.time())
        _write_manifest(mpath, [new, *_listed_versions(path)][:MAX_VERSIONS])
    _write_manifest(mpath, [new])


def _listed_versions(path: str) -> tuple[Version, ...]:
    """The contents the manifest of the file ``path`` lists now (none for a new or unreadable one)."""
    if not os.path.isfile(path):
        return ()
    try:
        manifest = read_manifest(path)
    except (OSError, ValueError):
        return ()
    return manifest.versions if manifest is not None else ()


def write_dir_manifest(directory: str, *, global_step: Optional[int] = None, run: Optional[str] = None) -> Manifest:
    """List every file under a checkpoint directory (written and closed) in ``<directory>/ft_manifest.json``."""
    entries = []
    for root, _, names in os.walk(directory):
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, directory)
            if rel == DIR_MANIFEST or name.startswith(".") and name.endswith(".tmp"):
                continue
            size, crc = checksum(full)
            entries.append(FileEntry(rel, size, crc))
    entries.sort(key=lambda e: e.name)
    manifest = Manifest((Version(tuple(entries), global_step, run, time.time()),))
    atomic_write_json(os.path.join(directory, DIR_MANIFEST), manifest.to_dict())
    return manifest


def _version_problem(base: str, version: Version, share: tuple[int, int] = (0, 1), mapped: bool = False
                     ) -> Optional[str]:
    for index, entry in enumerate(version.files):
        full = os.path.join(base, entry.name)
        try:
            size = os.path.getsize(full)
        except FileNotFoundError:
            return f"{entry.name} is missing"
        if size != entry.size:
            return f"{entry.name} has {size} bytes, the manifest says {entry.size} (torn or truncated)"
        if index % share[1] == share[0] and checksum(full, mapped=mapped)[1] != entry.crc32:
            return f"{entry.name} does not match its checksum (changed or corrupt)"
    return None


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A checkpoint that must not be resumed from, and why."""

    path: str
    reason: str


def mark_bad(checkpoint: str, reason: str) -> None:
    """Record that ``checkpoint``'s present content must not be resumed from (``<checkpoint>.bad.json``, atomically).

    The mark lists the files of the content on disk now (when its manifest matches it): a
    later save under the same name is not condemned by it.
    """
    content = _condemned_content(checkpoint)
    files = [dataclasses.asdict(entry) for entry in content] if content is not None else None
    atomic_write_json(checkpoint.rstrip("/") + _BAD_SUFFIX, {"reason": reason, "time": time.time(), "files": files})


def has_bad_mark(checkpoint: str) -> bool:
    """Whether ``checkpoint`` has a mark of :func:`mark_bad` beside it (without reading the checkpoint)."""
    return os.path.exists(checkpoint.rstrip("/") + _BAD_SUFFIX)


def _condemned_content(checkpoint: str) -> Optional[tuple[FileEntry, ...]]:
    """The files of the content a mark of ``checkpoint`` condemns (None: whatever is on disk).

    The launcher marks checkpoints on its restart path: a manifest with one version names the
    content without reading the checkpoint (gigabytes for a sharded one). Content on disk that
    does not match that version is rejected by the check anyway. Only a file caught between
    two saves (several versions listed) is read, to find which one it holds.
    """
    try:
        manifest = read_manifest(checkpoint)
    except (OSError, ValueError):
        return None
    if manifest is None or not manifest.versions:
        return None
    if len(manifest.versions) == 1:
        return manifest.versions[0].files
    found = _matching_version(checkpoint, require_manifest=False)
    return found.files if isinstance(found, Version) else None


def _marked_bad(checkpoint: str, found: Version | Rejection | None) -> Optional[str]:
    """Why ``checkpoint`` is marked bad, when its mark condemns ``found`` (the content on disk), else None."""
    try:
        data = read_json(checkpoint.rstrip("/") + _BAD_SUFFIX)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "marked bad (unreadable mark)"
    if not isinstance(data, dict):
        return f"marked bad: {data}"
    files = data.get("files")
    if isinstance(files, list) and isinstance(found, Version) and files != [dataclasses.asdict(e) for e in found.files]:
        return None  # saved again since: another content than the one condemned
    return f"marked bad: {data.get('reason', 'no reason given')}"


def verified_version(checkpoint: str, *, require_manifest: bool = True,
                     share: tuple[int, int] = (0, 1), mapped: bool = False) -> Version | Rejection | None:
    """The manifest version that ``checkpoint``'s files match, or why they must not be loaded.

    Checks, in order: present, a readable manifest, one of its versions matching
    every file's size and CRC-32, and that content not marked bad. None: no manifest
    and ``require_manifest`` is False (a checkpoint written before manifests existed).

    ``share=(i, n)``: of a checkpoint *directory* (one version), check the CRC-32 of
    every ``n``-th file from the ``i``-th only (sizes: all), so that ``n`` ranks that
    combine their verdicts (an all-reduce) read it once between them, not ``n`` times.
    Ignored for a file checkpoint, whose versions every rank must tell apart by content.
    ``mapped``: checksums over memory maps (see :func:`checksum`: only for files never changed in place).
    """
    found = _matching_version(checkpoint, require_manifest=require_manifest, share=share, mapped=mapped)
    if isinstance(found, Rejection):
        return found
    bad = _marked_bad(checkpoint, found)
    return Rejection(checkpoint, bad) if bad is not None else found


def _matching_version(checkpoint: str, *, require_manifest: bool, share: tuple[int, int] = (0, 1),
                      mapped: bool = False) -> Version | Rejection | None:
    if not os.path.exists(checkpoint):
        return Rejection(checkpoint, "missing")
    try:
        manifest = read_manifest(checkpoint)
    except (OSError, ValueError) as exc:
        return Rejection(checkpoint, str(exc))
    if manifest is None:
        return Rejection(checkpoint, "no manifest (written without ft-suite, or killed before it was written)") \
            if require_manifest else None
    directory = os.path.isdir(checkpoint)
    base = checkpoint if directory else (os.path.dirname(checkpoint) or ".")
    problems = []
    for version in manifest.versions:
        problem = _version_problem(base, version, share if directory and len(manifest.versions) == 1 else (0, 1),
                                   mapped)
        if problem is None:
            return version
        problems.append(problem)
    return Rejection(checkpoint, problems[0] if problems else "the manifest lists no content")


def verify(checkpoint: str, *, require_manifest: bool = True) -> Optional[Rejection]:
    """Why ``checkpoint`` must not be loaded, or None when its files are as they were written (see :func:`verified_version`)."""
    found = verified_version(checkpoint, require_manifest=require_manifest)
    return found if isinstance(found, Rejection) else None


def first_accepted(candidates: Iterable[str], check: Callable[[str], Optional[Rejection]] = verify
                   ) -> tuple[Optional[str], list[Rejection]]:
    """The first of ``candidates`` (give them newest first) that ``check`` accepts, and the ones it skipped.

    ``(None, rejections)`` when none passes: start from scratch, or stop, as the caller decides.
    This process's check only: no agreement across ranks, no record, no exception (for that, see
    :func:`ft_integrations.checkpoint_guard.choose_checkpoint`).
    """
    rejected: list[Rejection] = []
    for candidate in candidates:
        problem = check(candidate)
        if problem is None:
            return candidate, rejected
        rejected.append(problem)
    return None, rejected
