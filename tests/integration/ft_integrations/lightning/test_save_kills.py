"""SIGKILL at 50 random instants of Lightning checkpoint saves: every resume loads a whole checkpoint.

The saves and the loads are Lightning's: ``TorchCheckpointIO`` wrapped by the callback's
``FaultToleranceCheckpointIO``, as ``ModelCheckpoint(save_last=True, save_top_k=-1)``
calls it (a per-step file, then ``last.ckpt`` overwritten in place), and the resume is
``FaultToleranceCheckpointIO.load_checkpoint("last.ckpt")`` with its fallback. What is
left out is the ``Trainer`` around them: a forked child of this process (Lightning already
imported: a new interpreter per kill would cost 50 imports of Lightning) saves 1 MiB
checkpoints in a loop and is SIGKILLed at a random instant. The bare writer of
``ft_core/test_checkpoint_manifest.py`` is killed the same way. 19 s on the loaded 2-core
machine (each save fsyncs twice).
"""

from __future__ import annotations

import os
import random
import select
import signal
import time
from typing import Any, Optional

import numpy as np
import pytest
import torch
from lightning.fabric.plugins import TorchCheckpointIO

from ft_integrations.checkpoint_guard import LoadResult
from ft_integrations.lightning.checkpoint_io import FaultToleranceCheckpointIO

NUMEL = 1 << 18  # 1 MiB of float32: a kill lands inside a write as often as between writes


class _Quiet:
    """The callback's side of the wrapper, with nothing to do."""

    def on_checkpoint_write_start(self, path: str) -> None:
        pass

    def on_checkpoint_write_end(self, checkpoint: dict[str, Any], path: str) -> None:
        pass

    def on_checkpoint_loaded_verified(self, result: LoadResult) -> None:
        self.loaded = result

    def snapshot_instead_of(self, path: str) -> Optional[dict[str, Any]]:
        return None


def _save_forever(directory: str, step: int, ready_w: int) -> None:
    """The child: save as ModelCheckpoint does, one step after another, until killed."""
    io = FaultToleranceCheckpointIO(TorchCheckpointIO(), _Quiet())
    while True:
        step += 1
        # numpy fills the tensor: torch's own kernels would use the OpenMP pool the fork did not copy.
        weights = torch.from_numpy(np.full(NUMEL, step, dtype=np.float32))
        checkpoint = {"global_step": step, "state_dict": {"w": weights}}
        io.save_checkpoint(checkpoint, os.path.join(directory, f"epoch=0-step={step}.ckpt"))
        io.save_checkpoint(checkpoint, os.path.join(directory, "last.ckpt"))
        os.write(ready_w, b".")


@pytest.mark.timeout(120)
def test_a_kill_at_any_instant_of_a_lightning_save_leaves_a_whole_checkpoint_to_resume_from(tmp_path):
    rng = random.Random(25)
    observer = _Quiet()
    io = FaultToleranceCheckpointIO(TorchCheckpointIO(), observer)
    step, resumed = 0, []
    for kill in range(50):
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest
            try:
                os.close(ready_r)
                _save_forever(str(tmp_path), step, ready_w)
            finally:
                os._exit(1)
        os.close(ready_w)
        try:
            assert select.select([ready_r], [], [], 30)[0], "the saver did not save within 30 s"
            assert os.read(ready_r, 1) == b"."  # at least one save done
            time.sleep(rng.uniform(0.0, 0.03))  # then anywhere in the next saves
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(ready_r)
        state = io.load_checkpoint(str(tmp_path / "last.ckpt"))
        loaded = observer.loaded
        # Whole, and the step the manifest vouches for is the step it holds.
        assert loaded.step == state["global_step"], (kill, loaded)
        assert torch.equal(state["state_dict"]["w"], torch.full((NUMEL,), float(loaded.step))), (kill, loaded.path)
        assert loaded.step >= step, (kill, loaded.step, step)  # never behind what a previous resume saw
        step = loaded.step
        resumed.append(loaded.path)
    assert str(tmp_path / "last.ckpt") in resumed  # the wrapper did not just fall back every time
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(leftovers) <= 1, leftovers
