"""Lightning skips the step hooks the callback leaves empty; a subclass's own hook still runs."""

from __future__ import annotations

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from ft_integrations.lightning import FaultToleranceCallback
from ft_integrations.lightning.data_phase import DataPhaseStart


class CountsAfterBackward(FaultToleranceCallback):
    def __init__(self) -> None:
        super().__init__(standalone="off")
        self.after_backward = 0

    def on_after_backward(self, trainer, pl_module) -> None:
        super().on_after_backward(trainer, pl_module)  # the class's no-op: still there
        self.after_backward += 1


@pytest.fixture(autouse=True)
def not_under_a_launcher(monkeypatch):
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)


def test_the_empty_step_hooks_are_skipped_and_a_subclass_keeps_its_own(tmp_path):
    plain, counting = FaultToleranceCallback(standalone="off"), CountsAfterBackward()
    assert plain.on_after_backward is None and plain.on_before_zero_grad is None  # not called at every step
    assert callable(plain.on_train_batch_end) and callable(counting.on_after_backward)
    assert DataPhaseStart().on_train_batch_start is None and callable(DataPhaseStart().on_train_batch_end)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=3, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                      default_root_dir=tmp_path, callbacks=[plain, counting])
    trainer.fit(BoringModel())  # Lightning's dispatcher skips a hook that is not callable
    assert counting.after_backward == 3
