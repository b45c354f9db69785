"""Strategies that save and load checkpoint directories the way ``FSDPStrategy(state_dict_type="sharded")`` does.

Lightning refuses ``FSDPStrategy`` without a GPU ("requires a GPU accelerator"), so the
tests of sharded checkpoints use these stand-ins: the same calls and layout on CPU, with
the real ``torch.distributed.checkpoint`` (DCP): ``dcp.save`` of ``{"model", "optimizer_0"}``
into the checkpoint directory (each rank writes its ``.distcp`` file, rank 0 the ``.metadata``),
rank 0's ``meta.pt`` for the rest, ``restore_checkpoint_after_setup``, and the model and
optimizers loaded in place by ``load_checkpoint``. What is not FSDP: the tensors are
replicated (DDP) or whole (one process), not sharded, so DCP writes them once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed.checkpoint as dcp
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

META = "meta.pt"  # FSDPStrategy's _METADATA_FILENAME


class DCPCheckpoints:
    """The checkpoint methods of ``FSDPStrategy`` with sharded state dicts, for any strategy."""

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False  # loaded in load_checkpoint

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        path = Path(filepath)
        if path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        converted = {"model": checkpoint.pop("state_dict")}
        converted.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        dcp.save(converted, checkpoint_id=path)
        if self.global_rank == 0:  # type: ignore[attr-defined]
            torch.save(checkpoint, path / META)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> dict[str, Any]:
        path = Path(checkpoint_path)
        module, optimizer = self.lightning_module, self.optimizers[0]  # type: ignore[attr-defined]
        state = {"model": module.state_dict(), "optimizer_0": optimizer.state_dict()}
        dcp.load(state, checkpoint_id=path)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer_0"])
        return torch.load(path / META, weights_only=False)

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        pass  # loaded in load_checkpoint

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        pass


class DCPStrategy(DCPCheckpoints, SingleDeviceStrategy):
    """One process on the CPU (DCP writes without a process group)."""

    def __init__(self) -> None:
        super().__init__(device=torch.device("cpu"))


class DDPDCPStrategy(DCPCheckpoints, DDPStrategy):
    """DDP on gloo: every rank enters the collective save and load."""
