"""``ft_integrations.pytorch_lightning``: the callback built on the standalone ``pytorch_lightning`` package.

Both ``lightning`` and ``pytorch_lightning`` are installed here (the environment the
variant exists for). Each check runs in a fresh interpreter: the package is chosen once
per process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers import python_env

TRAIN_WITH_PYTORCH_LIGHTNING = textwrap.dedent("""
    import pytorch_lightning as pl
    import lightning_fabric
    from pytorch_lightning.demos.boring_classes import BoringModel
    from ft_integrations.pytorch_lightning import FaultToleranceCallback, FaultToleranceCheckpointIO

    callback = FaultToleranceCallback(mode="sections", standalone="off")
    assert isinstance(callback, pl.Callback), type(callback).__mro__
    trainer = pl.Trainer(callbacks=[callback], max_steps=3, logger=False, accelerator="cpu",
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(BoringModel())
    assert issubclass(FaultToleranceCheckpointIO, lightning_fabric.plugins.CheckpointIO)
    print("trained", trainer.global_step)
""")

MIXED = textwrap.dedent("""
    from ft_integrations.lightning import FaultToleranceCallback
    import ft_integrations.pytorch_lightning
""")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=python_env(PYTHONWARNINGS="ignore"),
                          capture_output=True, text=True, timeout=150)


@pytest.mark.timeout(180)
def test_the_pytorch_lightning_variant_subclasses_and_trains_with_pytorch_lightning():
    result = _run(TRAIN_WITH_PYTORCH_LIGHTNING)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trained 3" in result.stdout


@pytest.mark.timeout(180)
def test_one_lightning_package_per_process_is_an_error_that_says_what_to_do():
    result = _run(MIXED)
    assert result.returncode != 0
    assert ("ImportError: ft_integrations.lightning is already built on lightning in this process, "
            "so it cannot be built on pytorch_lightning too") in result.stderr
