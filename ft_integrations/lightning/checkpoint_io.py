"""A ``CheckpointIO`` plugin that times every checkpoint write, makes it atomic and verified, and checks resumes.

Lightning lets a plugin own the actual checkpoint write (``strategy.checkpoint_io``);
wrapping it is the public way to time the write itself, whatever strategy or
``ModelCheckpoint`` settings are in use, without patching strategy methods. The same
seam makes a write crash-safe and a resume safe (``verify=True``, the default, for
checkpoints on a local or mounted filesystem):

* a save goes to a temp file that is fsynced and renamed over the target, with a
  manifest beside it (size, CRC-32, global step: :mod:`ft_core.checkpoint_manifest`),
  so a kill at any instant of a save leaves the previous checkpoint whole;
* a load checks the requested checkpoint (manifest, that it loads, finite tensors)
  and falls back to the newest older checkpoint of the same directory that passes,
  the same one on every rank (:mod:`ft_integrations.checkpoint_guard`).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Protocol

from typing_extensions import override

from ft_core.checkpoint_manifest import manifest_path, save_file_atomically
from ft_integrations.checkpoint_guard import LoadResult, fallback_candidates, load_verified
from ft_integrations.lightning._pl import CheckpointIO, pl

__all__ = ["CheckpointWriteObserver", "FaultToleranceCheckpointIO"]


class CheckpointWriteObserver(Protocol):
    """What :class:`FaultToleranceCheckpointIO` tells about each write."""

    def on_checkpoint_write_start(self, path: str) -> None: ...

    def on_checkpoint_write_end(self, checkpoint: dict[str, Any], path: str) -> None: ...

    def on_checkpoint_loaded_verified(self, result: LoadResult) -> None: ...

    def snapshot_instead_of(self, path: str) -> Optional[dict[str, Any]]:
        """A newer in-memory snapshot's state to resume from instead of loading ``path``; None: load it."""
        ...


def checkpoint_weights(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What must be finite in a Lightning checkpoint: the model and the optimizers (a callback may keep ``inf``)."""
    return {key: checkpoint[key] for key in ("state_dict", "optimizer_states") if key in checkpoint}


def is_local(path: Any) -> bool:
    """A path with a rename and an fsync: not a remote URL (``s3://...``), which is written as it is."""
    return "://" not in str(path)


class FaultToleranceCheckpointIO(CheckpointIO):
    """Delegates to ``checkpoint_io`` and calls ``observer`` around each ``save_checkpoint``.

    ``on_checkpoint_write_end`` is called only when the write succeeded; a failed
    write propagates its exception unchanged (and leaves the previous checkpoint as it was).

    Args:
        checkpoint_io: the plugin that really reads and writes (e.g. ``TorchCheckpointIO``).
        observer: receives ``on_checkpoint_write_start(path)``, ``on_checkpoint_write_end(checkpoint, path)``
            and ``on_checkpoint_loaded_verified(result)`` (which checkpoint a resume loaded, and the ones skipped).
        verify: atomic writes with a manifest, and verified loads with fallback (local paths only).
        check_finite: with ``verify``, a checkpoint holding NaN or infinity in a float tensor is rejected.
    """

    def __init__(self, checkpoint_io: CheckpointIO, observer: CheckpointWriteObserver, *, verify: bool = True,
                 check_finite: bool = True) -> None:
        super().__init__()
        self.checkpoint_io = checkpoint_io
        self.observer = observer
        self.verify = verify
        self.check_finite = check_finite

    @classmethod
    def attach(cls, trainer: pl.Trainer, observer: CheckpointWriteObserver, *, verify: bool = True
               ) -> FaultToleranceCheckpointIO:
        """Wrap ``trainer``'s strategy's plugin (Lightning's public plugin point for checkpoint writes)."""
        plugin = cls(trainer.strategy.checkpoint_io, observer, verify=verify)
        trainer.strategy.checkpoint_io = plugin
        return plugin

    def detach(self, trainer: pl.Trainer) -> None:
        """Put the wrapped plugin back, unless something replaced this one since."""
        if trainer.strategy.checkpoint_io is self:
            trainer.strategy.checkpoint_io = self.checkpoint_io

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        self.observer.on_checkpoint_write_start(str(path))
        if self.verify and is_local(path):
            step = checkpoint.get("global_step")
            save_file_atomically(
                os.fspath(path), lambda temp: self.checkpoint_io.save_checkpoint(checkpoint, temp, storage_options),
                global_step=None if step is None else int(step), run=os.environ.get("TORCHELASTIC_RUN_ID"))
        else:
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
        self.observer.on_checkpoint_write_end(checkpoint, str(path))

    @override
    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        snapshot = self.observer.snapshot_instead_of(str(path))
        if snapshot is not None:
            return snapshot
        if not (self.verify and is_local(path)):
            return self.checkpoint_io.load_checkpoint(path, *args, **kwargs)
        requested = os.fspath(path)
        result = load_verified(requested, fallback_candidates(requested),
                               lambda candidate: self.checkpoint_io.load_checkpoint(candidate, *args, **kwargs),
                               weights=checkpoint_weights if self.check_finite else None)
        self.observer.on_checkpoint_loaded_verified(result)
        return result.state

    @override
    def remove_checkpoint(self, path: Any) -> None:
        self.checkpoint_io.remove_checkpoint(path)
        if is_local(path):
            try:
                os.unlink(manifest_path(os.fspath(path)))
            except FileNotFoundError:
                pass

    @override
    def teardown(self) -> None:
        self.checkpoint_io.teardown()
