"""FaultToleranceCallback marks the straggler phases (data fetch, forward) in a real ``Trainer``, and the
node monitor turns them into per-round medians."""

from __future__ import annotations

import signal
import time

import pytest
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from ft_core.client import RankMonitorClient
from ft_core.config import FaultToleranceConfig
from ft_integrations.lightning import FaultToleranceCallback
from ft_integrations.lightning.data_phase import BATCH_SAMPLES, DataPhaseStart, StragglerPhases

FORWARD = 0.05


class SlowForward(BoringModel):
    def training_step(self, batch, batch_idx):
        time.sleep(FORWARD)
        return super().training_step(batch, batch_idx)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_LAUNCHER_IPC_SOCKET", "FT_MONITOR_TOKEN", "RANK", "LOCAL_RANK",
                "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FAULT_TOL_FINISHED_FLAG_FILE", str(tmp_path / "finished.flag"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("interval", [0.2, None], ids=["on", "off"])
def test_callback_marks_data_and_forward_phases(tmp_path, start_monitor, interval):
    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=300, rank_heartbeat_timeout=300,
                               straggler_report_interval=interval)
    proc = start_monitor(cfg, attach=True)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=20, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                      enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[FaultToleranceCallback()])
    trainer.fit(SlowForward())
    rounds = [e for e in proc.events() if e["event"] == "phase_medians"]
    if interval is None:
        assert rounds == []  # detection off: the ranks sent no phase message
        return
    medians = [m for r in rounds for m in r["medians"]]
    assert {m["phase"] for m in medians} == {"data", "forward"} and {m["rank"] for m in medians} == {0}
    forward = [m["median"] for m in medians if m["phase"] == "forward"]
    data = [m["median"] for m in medians if m["phase"] == "data"]
    assert all(FORWARD <= f < 10 * FORWARD for f in forward), forward
    assert all(d < FORWARD for d in data), data  # the boring dataset is in memory: fetching is fast


class RankZeroOnlyBatchEnd(Callback):
    """Stands for the progress bar after the fault-tolerance callback: work on rank 0 only at each
    batch end (on a GPU, its ``.item()`` is a device sync that waits for the step's kernels)."""

    def on_train_batch_end(self, *args, **kwargs):
        time.sleep(RANK0_WORK)


RANK0_WORK = 0.03


@pytest.mark.timeout(120)
def test_the_data_phase_leaves_out_the_work_of_later_callbacks(tmp_path, start_monitor):
    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=300, rank_heartbeat_timeout=300,
                               straggler_report_interval=0.2)
    proc = start_monitor(cfg, attach=True)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=20, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                      enable_checkpointing=False, default_root_dir=tmp_path,
                      callbacks=[FaultToleranceCallback(), RankZeroOnlyBatchEnd()])
    trainer.fit(SlowForward())
    medians = [m for e in proc.events() if e["event"] == "phase_medians" for m in e["medians"]]
    data = [m["median"] for m in medians if m["phase"] == "data"]
    assert data and all(d < RANK0_WORK for d in data), data
    # The forward phase is still measured (the real work of a step).
    assert all(m["median"] >= FORWARD for m in medians if m["phase"] == "forward")


@pytest.fixture
def rank_client():
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    client = RankMonitorClient()
    yield client
    client.shutdown_workload_monitoring()
    signal.signal(signal.SIGUSR2, previous)


def _trainer(tmp_path) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)


def test_a_step_holds_its_phase_samples_until_a_batch_of_them_is_full(tmp_path, start_monitor, rank_client):
    start_monitor(FaultToleranceConfig(initial_rank_heartbeat_timeout=300, rank_heartbeat_timeout=300,
                                                 straggler_report_interval=60.0), attach=True)
    rank_client.init_workload_monitoring()
    trainer, phases = _trainer(tmp_path), StragglerPhases()
    phases.on_train_start(trainer, rank_client)
    assert any(isinstance(c, DataPhaseStart) for c in trainer.callbacks)
    now = 1000.0  # monotonic times passed in: the hold (a quarter of 60 s, at most 1 s) never ends here
    for batch in range(BATCH_SAMPLES // 2 - 1):
        trainer.callbacks[-1].ended = now - 0.01
        phases.on_train_batch_start(rank_client, batch, now)
        phases.on_before_backward(rank_client, now + 0.0005)
        now += 0.001
    # 15 batches: 14 data samples (not the epoch's first batch) and 15 forward ones, none sent yet.
    assert phases.held == BATCH_SAMPLES - 3
    for batch in range(BATCH_SAMPLES // 2 - 1, BATCH_SAMPLES // 2 + 1):
        trainer.callbacks[-1].ended = now - 0.01
        phases.on_train_batch_start(rank_client, batch, now)
        phases.on_before_backward(rank_client, now + 0.0005)
    assert phases.held == 1  # the 32nd sample sent the batch; the last forward one waits
    phases.teardown(trainer, rank_client)  # leaving: what is held is sent
    assert phases.held == 0 and not any(isinstance(c, DataPhaseStart) for c in trainer.callbacks)
    # That the samples reach the monitor whole: test_callback_marks_data_and_forward_phases (a real fit).


def test_phase_samples_wait_at_most_a_quarter_of_the_report_interval(tmp_path, start_monitor, rank_client):
    start_monitor(FaultToleranceConfig(initial_rank_heartbeat_timeout=300, rank_heartbeat_timeout=300,
                                       straggler_report_interval=0.2), attach=True)
    rank_client.init_workload_monitoring()
    trainer, phases = _trainer(tmp_path), StragglerPhases()
    phases.on_train_start(trainer, rank_client)
    end = trainer.callbacks[-1]
    end.ended = 99.99
    phases.on_train_batch_start(rank_client, 1, 100.0)  # the first sample held: due at 100.05
    end.ended = 100.03
    phases.on_train_batch_start(rank_client, 2, 100.04)
    assert phases.held == 2
    end.ended = 100.05
    phases.on_train_batch_start(rank_client, 3, 100.06)  # past the hold: all three sent
    assert phases.held == 0


def test_nothing_is_held_nor_added_while_straggler_detection_is_off(tmp_path, start_monitor, rank_client):
    start_monitor(FaultToleranceConfig(initial_rank_heartbeat_timeout=300, rank_heartbeat_timeout=300,
                                       straggler_report_interval=None), attach=True)
    rank_client.init_workload_monitoring()
    trainer, phases = _trainer(tmp_path), StragglerPhases()
    phases.on_train_start(trainer, rank_client)
    assert not any(isinstance(c, DataPhaseStart) for c in trainer.callbacks)  # no hook of it to call each step
    for batch in range(3):
        phases.on_train_batch_start(rank_client, batch, 100.0 + batch)
        phases.on_before_backward(rank_client, 100.5 + batch)
    assert phases.held == 0
