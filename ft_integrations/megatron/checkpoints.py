"""Megatron ``iter_N`` checkpoints: a manifest after each complete save, a verified choice before a load.

Megatron writes a checkpoint as a directory ``<save>/iter_NNNNNNN`` and, once every
rank's files are complete, points ``<save>/latest_checkpointed_iteration.txt`` (the
tracker) at it. A resume loads what the tracker names; when that checkpoint is torn,
truncated, holds NaN weights or was marked bad by the launcher, every restart fails
the same way. So:

* after a complete persistent save (the hooks' ``on_checkpointing_end``: a synchronous
  save, or an async save's finalization) global rank 0 lists every file of the
  ``iter_N`` directory with its size and CRC-32 in ``iter_N/ft_manifest.json``
  (:func:`ft_core.checkpoint_manifest.write_dir_manifest`), in a background thread: the
  read of the checkpoint never stalls a training step (other ranks would wait for
  rank 0 in their next collective, under the ``step`` timeout);
* before a load, :func:`candidates` lists the tracker's checkpoint, then the older
  ``iter_N`` directories that have a manifest, newest first, and
  :func:`load_verified_checkpoint` picks the first that verifies (and, with a ``load``
  function, loads and holds finite weights) on every rank, writing the
  ``checkpoint_rejected``/``checkpoint_loaded`` records the launcher reads
  (:func:`ft_integrations.checkpoint_guard.load_verified`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Optional

from ft_core.checkpoint_manifest import read_manifest, write_dir_manifest
from ft_core.megatron_tracker import checkpoint_dir, iteration_of, tracker_iteration
from ft_integrations.checkpoint_guard import LoadResult, load_verified

__all__ = ["ManifestWriter", "candidates", "load_verified_checkpoint"]

log = logging.getLogger("ft_integrations.megatron")


def candidates(load_dir: str) -> list[str]:
    """The checkpoints a resume from ``load_dir`` may load, in order: the tracker's, then older ones.

    Empty without a tracker (Megatron starts from scratch then). The fallbacks are the
    ``iter_N`` directories older than the tracker's that have a manifest (written by
    these hooks: a directory of unknown origin is never loaded in its place), newest first.
    """
    latest = tracker_iteration(load_dir)
    if latest is None:
        return []
    older = []
    for name in os.listdir(load_dir):
        iteration = iteration_of(name)
        path = os.path.join(load_dir, name)
        if iteration is None or iteration >= latest or not os.path.isdir(path):
            continue
        try:
            if read_manifest(path) is not None:
                older.append((iteration, path))
        except (OSError, ValueError):
            continue  # an unreadable manifest: not a fallback this suite vouches for
    return [checkpoint_dir(load_dir, latest), *(path for _, path in sorted(older, reverse=True))]


def load_verified_checkpoint(load_dir: str, load: Optional[Callable[[str], Any]] = None,
                             weights: Optional[Callable[[Any], Any]] = None) -> Optional[LoadResult]:
    """Verify (and with ``load``, load) the newest good checkpoint of ``load_dir``, the same on every rank.

    ``load(checkpoint_dir)`` returns the state (None: verify only, for a loader that
    loads by itself); ``weights(state)``: the tensors that must be finite. None when
    ``load_dir`` has no tracker. Raises
    :class:`~ft_integrations.checkpoint_guard.NoGoodCheckpointError` when every
    candidate is rejected.
    """
    found = candidates(load_dir)
    if not found:
        return None
    # The ranks share the CRC-32 reads: a multi-terabyte checkpoint is read once for the check, not once per rank.
    return load_verified(found[0], found[1:], load or (lambda _path: None), weights=weights, split_checksums=True)


class ManifestWriter:
    """Writes the manifest of each completed ``iter_N`` directory in a background thread, one at a time."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None

    def submit(self, directory: str, iteration: int) -> None:
        """Start writing ``directory``'s manifest (after the previous one is written)."""
        previous = self._thread

        def write() -> None:
            if previous is not None:
                previous.join()
            try:
                write_dir_manifest(directory, global_step=iteration)
            except OSError as exc:  # a checkpoint without a manifest is still loaded when it is the newest
                log.warning("fault tolerance: could not write the manifest of %s: %s", directory, exc)

        # Daemon: a failing rank (abort) does not wait for it; a kill mid-write leaves no manifest
        # (atomic write), and a checkpoint without one is rejected only when older verified ones exist.
        self._thread = threading.Thread(target=write, name="ft-checkpoint-manifest", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until every manifest submitted so far is written."""
        if self._thread is not None:
            self._thread.join()
