"""Manifests and verified resumes for checkpoint directories that a strategy writes itself.

``FSDPStrategy(state_dict_type="sharded")`` saves through ``torch.distributed.checkpoint``
(every rank writes its shards into a directory, rank 0 adds ``meta.pt``) and
``DeepSpeedStrategy`` through its engine: neither calls ``CheckpointIO``, so
:class:`~ft_integrations.lightning.checkpoint_io.FaultToleranceCheckpointIO` never sees
those saves. Lightning has no hook after a save returns, nor a plugin point for a
strategy's own save, so :class:`ShardedCheckpointGuard` wraps the strategy instance's
``save_checkpoint`` and ``load_checkpoint`` (the class is left alone; ``detach`` undoes it):

* a save into a directory: rank 0 first removes the directory's old manifest (a save
  rewrites the files in place: until it is done, the directory is no checkpoint to
  resume from), then, when the save returns, lists every file with its size and CRC-32
  in ``<dir>/ft_manifest.json`` (:func:`ft_core.checkpoint_manifest.write_dir_manifest`).
  A directory save is collective: it returns on rank 0 only once every rank's files
  are written (DCP gathers every rank's write results to rank 0 before it writes
  ``.metadata``; DeepSpeed ends its save with a barrier). No collective of ours: which
  ranks see a directory there is a filesystem race, and a barrier entered by some ranks
  only would pair with the strategy's next one;
* a load of a directory: the manifest is checked (every file listed is there, with its
  size and CRC-32; on every rank, agreed before the collective load), the checkpoint
  is loaded, the model's parameters and the optimizers' state it loaded must be finite,
  and on failure the newest older checkpoint directory beside it that passes is loaded
  instead (:func:`ft_integrations.checkpoint_guard.load_verified`).

Saves and loads of files go through unchanged: ``CheckpointIO`` handles those.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ft_core.checkpoint_manifest import DIR_MANIFEST, write_dir_manifest
from ft_integrations.checkpoint_guard import fallback_candidates, load_verified
from ft_integrations.lightning._pl import pl
from ft_integrations.lightning.checkpoint_io import CheckpointWriteObserver, is_local

__all__ = ["ShardedCheckpointGuard"]

_WRAPPED = ("save_checkpoint", "load_checkpoint")


class ShardedCheckpointGuard:
    """Writes a manifest after each directory save of ``strategy``, verifies and falls back on a directory load.

    Args:
        strategy: the Trainer's strategy; its instance methods are wrapped by :meth:`attach`.
        observer: told of each directory write (``on_checkpoint_write_end``, on every rank) and
            of what a resume loaded (``on_checkpoint_loaded_verified``).
        check_finite: reject a checkpoint that loads NaN or infinity into the model or the optimizers.
    """

    def __init__(self, strategy: pl.strategies.Strategy, observer: CheckpointWriteObserver, *,
                 check_finite: bool = True) -> None:
        self.strategy, self.observer, self.check_finite = strategy, observer, check_finite
        self._save = strategy.save_checkpoint
        self._load = strategy.load_checkpoint

    def attach(self) -> ShardedCheckpointGuard:
        self.strategy.save_checkpoint = self.save_checkpoint  # type: ignore[method-assign]
        self.strategy.load_checkpoint = self.load_checkpoint  # type: ignore[method-assign]
        return self

    def detach(self) -> None:
        for name in _WRAPPED:
            if getattr(self.strategy, name) == getattr(self, name):
                delattr(self.strategy, name)  # the class's method again

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        path, step = os.fspath(filepath), checkpoint.get("global_step")
        local = is_local(path)
        if local and self.strategy.is_global_zero and os.path.isdir(path):
            try:
                os.unlink(os.path.join(path, DIR_MANIFEST))
            except FileNotFoundError:
                pass
        self._save(checkpoint, filepath, storage_options)
        if not (local and os.path.isdir(path)):
            return  # a file: written through CheckpointIO, which wrote its manifest
        if self.strategy.is_global_zero:  # every rank's files are written (see the module docstring)
            write_dir_manifest(path, global_step=None if step is None else int(step),
                               run=os.environ.get("TORCHELASTIC_RUN_ID"))
        self.observer.on_checkpoint_write_end(checkpoint, path)

    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        path = os.fspath(checkpoint_path)
        if not (is_local(path) and os.path.isdir(path)):
            return self._load(checkpoint_path, *args, **kwargs)
        result = load_verified(path, fallback_candidates(path), lambda candidate: self._load(candidate, *args, **kwargs),
                               weights=self._loaded_weights if self.check_finite else None, agree_before_load=True)
        self.observer.on_checkpoint_loaded_verified(result)
        state: dict[str, Any] = result.state
        return state

    def _loaded_weights(self, _metadata: Any) -> dict[str, Any]:
        """What the strategy's load put in place: this rank's parameters (its shards) and optimizer states.

        A sharded load fills the model and the optimizers in place and returns only the
        rest (``meta.pt``), so the finite check reads them where they are: local tensors,
        no collective.
        """
        model = self.strategy.model
        return {"parameters": list(model.parameters()) if model is not None else [],
                "optimizer_states": [list(optimizer.state.values()) for optimizer in self.strategy.optimizers]}
