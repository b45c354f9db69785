"""FaultToleranceCallback in a real single-process ``Trainer`` against a real rank monitor process."""

from __future__ import annotations

import dataclasses
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
import torch  # noqa: E402
from helpers import wait_for  # noqa: E402
from lightning.pytorch import Callback, Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

from ft_core.config import FaultToleranceConfig  # noqa: E402
from ft_core.data import WorkloadAction, WorkloadControlRequest  # noqa: E402
from ft_core.launcher.control import WorkloadControlServer  # noqa: E402
from ft_core.monitor.standalone import standalone_socket_path, stop_standalone_monitors  # noqa: E402
from ft_core.utils.fileutil import read_json  # noqa: E402
from ft_integrations.lightning import (  # noqa: E402
    FaultToleranceCallback,
    FaultToleranceCheckpointIO,
    SimulatedFaultError,
)

TOKEN = "lightning-test-token-0123456789ab"
SECTIONS_CFG = FaultToleranceConfig(
    rank_section_timeouts={"setup": 300, "step": 300, "validation": 300, "checkpointing": 300},
    rank_out_of_section_timeout=300, initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
    safety_factor=50,
    num_warmup_iterations=0,  # runs of 6 steps learn "step" after 3: none may be a warm-up step
)
HEARTBEATS_CFG = FaultToleranceConfig(initial_rank_heartbeat_timeout=300, rank_heartbeat_timeout=300, safety_factor=50)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_LAUNCHER_IPC_SOCKET", "FT_MONITOR_TOKEN", "RANK", "LOCAL_RANK",
                "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FAULT_TOL_FINISHED_FLAG_FILE", str(tmp_path / "finished.flag"))


@pytest.fixture
def monitor(start_monitor):
    return lambda cfg: start_monitor(cfg, token=TOKEN, attach=True)


def fit(tmp_path: Path, callbacks: list, max_steps: int = 6, ckpt_path: str | None = "last") -> Trainer:
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=2, val_check_interval=3, num_sanity_val_steps=1,
        default_root_dir=tmp_path,
        callbacks=[*callbacks, ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=0, save_last=True,
                                               every_n_train_steps=2)],
    )
    trainer.fit(BoringModel(), ckpt_path=ckpt_path)
    return trainer


def ckpt_state(tmp_path: Path) -> dict:
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    return checkpoint["callbacks"]["FaultToleranceCallback"]


def events(proc, name: str) -> list[dict]:
    return [e for e in proc.events() if e["event"] == name]


def disconnects(proc, field: str = "graceful") -> list[bool]:
    """``graceful`` (or ``training_finished``) of each disconnect (the fit runs in this process, the monitor
    in another: wait for the record)."""
    wait_for(lambda: events(proc, "rank_disconnected"), 30, "a rank_disconnected event")
    return [e.get(field, False) for e in events(proc, "rank_disconnected")]  # written only when true


@pytest.mark.timeout(120)
def test_sections_mode_learns_checkpoints_and_flags_a_finished_run(tmp_path, monitor):
    proc = monitor(SECTIONS_CFG)
    callback = FaultToleranceCallback(mode="sections", calculate_timeouts_after_steps=3, autoresume=True)
    trainer = fit(tmp_path, [callback])

    assert not isinstance(trainer.strategy.checkpoint_io, FaultToleranceCheckpointIO)  # restored at teardown
    assert [e["iteration"] for e in events(proc, "checkpoint_reported")] == [2, 4, 6]
    saved = ckpt_state(tmp_path)["current_timeouts"]["section"]
    # A fresh fit does not learn `setup`: a resume's is longer (it loads the checkpoint).
    assert sorted(saved["calculated_sections"]) == ["checkpointing", "step", "validation"]
    assert all(0 < saved["section"][name] < 300 for name in saved["calculated_sections"])
    assert events(proc, "timeouts_updated")
    assert disconnects(proc) == [True]
    assert disconnects(proc, "training_finished") == [True]  # max_steps reached: ft_launcher is told
    assert (tmp_path / "finished.flag").exists()

    # A resumed run with nothing left to do restores the timeouts and flags the run again.
    os.unlink(tmp_path / "finished.flag")
    resumed = FaultToleranceCallback(mode="sections", calculate_timeouts=False, autoresume=True)
    fit(tmp_path, [resumed])
    assert resumed.client.state_dict() == ckpt_state(tmp_path)
    assert events(proc, "timeouts_updated")[-1]["timeouts"] == ckpt_state(tmp_path)
    assert (tmp_path / "finished.flag").exists()


@pytest.mark.timeout(120)
def test_slow_teardown_after_the_last_learning_is_not_a_hang(tmp_path, monitor, request):
    # A short run learns an out-of-section timeout of about 1 s at the end of training; what
    # Lightning does after that (here a callback taking 2.5 s) is healthy and must not be killed.
    # SIGUSR2 (ignored here) as the termination signal and no stack dump: a false kill is recorded,
    # not fatal to pytest.
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    request.addfinalizer(lambda: signal.signal(signal.SIGUSR2, previous))
    proc = monitor(dataclasses.replace(SECTIONS_CFG, safety_factor=2, rank_termination_signal="SIGUSR2",
                                       stack_dump_signal=None))

    class SlowTeardown(Callback):
        def on_fit_end(self, trainer, pl_module):
            time.sleep(2.5)

    fit(tmp_path, [FaultToleranceCallback(mode="sections", calculate_timeouts_after_steps=3), SlowTeardown()])
    learned = events(proc, "timeouts_updated")[-1]["timeouts"]["current_timeouts"]["section"]
    assert learned["is_out_of_section_calculated"] and learned["out_of_section"] < 2.5
    assert disconnects(proc) == [True]
    assert not events(proc, "hang_detected")


@pytest.mark.timeout(120)
def test_heartbeats_mode_state_file_round_trip(tmp_path, monitor):
    proc = monitor(HEARTBEATS_CFG)
    state_file = tmp_path / "timeouts.json"
    first = FaultToleranceCallback(calculate_timeouts_after_steps=2, state_file=state_file)
    fit(tmp_path, [first], ckpt_path=None)
    learned = read_json(state_file)
    assert learned["current_timeouts"]["heartbeat"]["were_calculated"] is True
    assert learned == first.client.state_dict()
    assert ckpt_state(tmp_path)["current_timeouts"]["heartbeat"]["were_calculated"] is True

    # A fresh run that does not resume from a checkpoint starts with the file's timeouts (sent at connect).
    second = FaultToleranceCallback(calculate_timeouts=False, state_file=state_file)
    fit(tmp_path / "second", [second], ckpt_path=None)
    assert second.client.state_dict() == learned
    assert len(events(proc, "rank_connected")) == 2


class RaiseAt(Callback):
    def __init__(self, step: int, exc: BaseException) -> None:
        self.step, self.exc = step, exc

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise self.exc


@pytest.mark.timeout(120)
def test_exception_sends_policy_request_and_disconnects_without_flag(tmp_path, monitor, monkeypatch):
    proc = monitor(HEARTBEATS_CFG)
    server = WorkloadControlServer(str(tmp_path / "launcher.sock"), TOKEN, 1 << 20)
    monkeypatch.setenv("FT_LAUNCHER_IPC_SOCKET", str(tmp_path / "launcher.sock"))
    seen = []

    def policy(exc: BaseException) -> WorkloadControlRequest:
        seen.append(exc)
        return WorkloadControlRequest(WorkloadAction.ShutdownWorkload, "cannot recover")

    callback = FaultToleranceCallback(autoresume=True, exc_handling_policy=policy,
                                      simulated_fault={"kind": "exception", "step": 3})
    try:
        with pytest.raises(SimulatedFaultError):
            fit(tmp_path, [callback])
        request = server.pop()
    finally:
        server.close()
    assert len(seen) == 1 and isinstance(seen[0], SimulatedFaultError)
    assert request is not None and request.action == WorkloadAction.ShutdownWorkload
    assert disconnects(proc) == [True] and disconnects(proc, "training_finished") == [False]
    assert not (tmp_path / "finished.flag").exists()


@pytest.mark.timeout(120)
def test_system_exit_zero_is_a_graceful_stop(tmp_path, monitor):
    proc = monitor(HEARTBEATS_CFG)
    seen = []
    callback = FaultToleranceCallback(autoresume=True, exc_handling_policy=seen.append)
    with pytest.raises(SystemExit):
        fit(tmp_path, [callback, RaiseAt(2, SystemExit(0))])
    assert seen == []
    assert disconnects(proc) == [True] and disconnects(proc, "training_finished") == [False]  # stopped early
    assert not (tmp_path / "finished.flag").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "cfg", "message"),
    [
        ("sections", {"rank_section_timeouts": {"checkpointing": 60}}, r"needs 'step'"),
        ("heartbeats", {"rank_out_of_section_timeout": 60}, r"opens no sections"),
        ("heartbeats", {"initial_rank_heartbeat_timeout": None, "rank_heartbeat_timeout": None},
         r"nothing would be detected"),
    ],
)
def test_config_that_does_not_fit_the_mode_is_rejected(tmp_path, monitor, mode, cfg, message):
    # Set at launch or filled in by the callback's config= (the launcher kept its defaults): both are checked.
    proc = monitor(FaultToleranceConfig.from_mapping(cfg) if mode == "heartbeats" else FaultToleranceConfig())
    callback = FaultToleranceCallback(mode=mode, calculate_timeouts=False, config=cfg)
    with pytest.raises(MisconfigurationException, match=message):
        fit(tmp_path, [callback], max_steps=1)
    assert disconnects(proc) == [True]


@pytest.mark.timeout(120)
def test_not_under_ft_launcher_error_and_off(tmp_path):
    with pytest.raises(MisconfigurationException, match="not launched by ft_launcher"):
        fit(tmp_path, [FaultToleranceCallback(standalone="error")], max_steps=1)
    callback = FaultToleranceCallback(standalone="off", autoresume=True)
    fit(tmp_path / "off", [callback], max_steps=2)
    assert not callback.active and callback.state_dict() == {}
    assert (tmp_path / "finished.flag").exists()


@pytest.mark.timeout(120)
def test_a_torn_state_file_is_ignored_with_a_warning(tmp_path):
    state_file = tmp_path / "timeouts.json"
    state_file.write_text('{"current_timeouts": {"heart')  # a write cut short
    callback = FaultToleranceCallback(standalone="off", state_file=state_file, autoresume=True)
    with pytest.warns(UserWarning, match="ignoring the timeouts in .*timeouts.json"):
        fit(tmp_path, [callback], max_steps=2)
    assert callback.state_dict() == {}
    assert (tmp_path / "finished.flag").exists()  # training ran to the end


@pytest.mark.timeout(120)
def test_standalone_monitor_is_started_for_a_single_process(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the monitor's private directory goes
    # The standalone monitor's config is all defaults: its first 5 steps are warm-up, not learned.
    callback = FaultToleranceCallback(mode="sections", calculate_timeouts_after_steps=7)
    try:
        fit(tmp_path, [callback], max_steps=8)
        socket_path = standalone_socket_path()
        assert socket_path.startswith(str(tmp_path))
        assert os.environ["FT_RANK_MONITOR_IPC_SOCKET"] == socket_path
        assert callback.client.cfg.rank_section_timeouts["step"] == 2700.0  # the sections-mode default
        assert "step" in ckpt_state(tmp_path)["current_timeouts"]["section"]["calculated_sections"]
    finally:
        stop_standalone_monitors()
