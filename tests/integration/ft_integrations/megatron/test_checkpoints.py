"""Megatron ``iter_N`` checkpoints through the hooks, against a real rank monitor: the manifest after a save,
the verified choice before a load (tracker first, then older ones), the loss watched right after a resume."""

from __future__ import annotations

import argparse
import math
import signal

import pytest
from helpers import wait_for_event

from ft_core.checkpoint_manifest import DIR_MANIFEST, mark_bad, read_manifest, verify
from ft_core.config import FaultToleranceConfig
from ft_core.event_file import read_events
from ft_core.fault_policy import NONFINITE_LOSS_ERROR, NonFiniteLossError
from ft_integrations import megatron as ft
from ft_integrations.checkpoint_guard import NoGoodCheckpointError
from ft_integrations.megatron import ft_integration

TOKEN = "megatron-checkpoints-test-token"
TRACKER = "latest_checkpointed_iteration.txt"


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    ft.reset_state()
    yield
    ft.reset_state()


@pytest.fixture
def monitor(start_monitor):
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)  # a missed deadline must not kill pytest
    yield start_monitor(FaultToleranceConfig(rank_section_timeouts={"setup": 60.0, "step": 60.0,
                                                                    "checkpointing": 60.0},
                                             rank_termination_signal="SIGUSR1"), token=TOKEN, attach=True)
    signal.signal(signal.SIGUSR1, previous)


def args_for(save, **overrides) -> argparse.Namespace:
    args = ft.add_ft_args(argparse.ArgumentParser()).parse_args(["--enable-ft"])
    args.save = str(save)
    vars(args).update(overrides)
    return args


def write_iter(save, iteration: int, payload: bytes = b"w" * 1000) -> str:
    """A Megatron-like ``iter_N`` directory (two files, one in a subdirectory) and the tracker pointing at it."""
    directory = save / f"iter_{iteration:07d}"
    (directory / "mp_rank_00").mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(payload)
    (directory / "mp_rank_00" / "common.pt").write_bytes(b"common")
    (save / TRACKER).write_text(f"{iteration}\n")
    return str(directory)


def save(save_dir, iteration: int) -> str:
    """A synchronous save through the hooks: files, tracker, then on_checkpointing_end."""
    ft.on_checkpointing_start()
    directory = write_iter(save_dir, iteration)
    ft.on_checkpointing_end(is_async_finalization=False, iteration=iteration)
    return directory


def records(monitor, name):
    return [e for e in read_events(monitor.events_path)[0] if e["event"] == name]


def test_rank_0_writes_each_saved_iter_dirs_manifest_and_a_resume_falls_back_past_bad_ones(monitor, tmp_path):
    # 1 s: saves 4, 8, 12 through the hooks (manifests by rank 0's writer thread), then 12 truncated and 8
    # marked bad by the launcher: the verified choice skips both, names them, and agrees on 4.
    ckpt = tmp_path / "ckpt"
    ft.setup(args_for(ckpt))
    dirs = {n: save(ckpt, n) for n in (4, 8, 12)}
    ft.shutdown()  # waits for the last manifest
    for n, directory in dirs.items():
        manifest = read_manifest(directory)
        assert manifest is not None and manifest.global_step == n
        assert {e.name for e in manifest.versions[0].files} == {"__0_0.distcp", "mp_rank_00/common.pt"}
        assert verify(directory) is None
    with open(f"{dirs[12]}/__0_0.distcp", "r+b") as handle:
        handle.truncate(10)
    mark_bad(dirs[8], "non-finite loss 1 step(s) after resuming")
    ft.reset_state()
    ft.setup(args_for(ckpt))
    assert ft.choose_checkpoint_iteration(str(ckpt)) == 4
    rejected = {e["checkpoint"]: e["reason"] for e in records(monitor, "checkpoint_rejected")}
    assert rejected.keys() == {dirs[12], dirs[8]}
    assert "__0_0.distcp has 10 bytes, the manifest says 1000" in rejected[dirs[12]]
    assert rejected[dirs[8]].startswith("marked bad: non-finite loss")
    (loaded,) = records(monitor, "checkpoint_loaded")
    assert (loaded["checkpoint"], loaded["step"], loaded["rank"]) == (dirs[4], 4, 0)
    ft.shutdown()


def test_only_rank_0_writes_manifests_and_only_for_complete_persistent_saves(monitor, tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    monkeypatch.setenv("RANK", "1")
    ft.setup(args_for(ckpt))
    save(ckpt, 4)
    ft.shutdown()
    assert not (ckpt / "iter_0000004" / DIR_MANIFEST).exists()  # rank 0's job: one writer per checkpoint
    monkeypatch.setenv("RANK", "0")
    ft.reset_state()
    ft.setup(args_for(ckpt))
    ft.on_checkpointing_start()
    write_iter(ckpt, 8)
    ft.on_checkpointing_end(is_async_finalization=False, iteration=8, persistent=False)  # node-local: no manifest
    ft.on_checkpointing_start()
    ft.on_checkpointing_end(is_async_finalization=True, iteration=4)  # an async save's finalization: complete
    ft.shutdown()
    assert not (ckpt / "iter_0000008" / DIR_MANIFEST).exists()
    assert verify(str(ckpt / "iter_0000004")) is None


def test_the_drop_in_writes_the_manifest_when_the_tracker_moves_and_chooses_from_args_load(monitor, tmp_path):
    # Megatron-LM's semantics: the checkpointed iteration is its tracker's, written once the save is complete.
    ckpt = tmp_path / "ckpt"
    ft_integration.setup(args_for(ckpt, load=str(ckpt)))
    ft_integration.on_checkpointing_start()
    write_iter(ckpt, 6)
    ft_integration.on_checkpointing_end(is_async_finalization=False)
    ft_integration.shutdown()
    assert verify(str(ckpt / "iter_0000006")) is None
    ft.reset_state()
    ft_integration.setup(args_for(ckpt, load=str(ckpt)))
    assert ft_integration.choose_checkpoint_iteration() == 6
    ft_integration.shutdown()


def test_no_tracker_is_a_fresh_start_and_nothing_good_is_an_error_naming_every_checkpoint(tmp_path):
    # Works without --enable-ft: verification needs no monitor.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    assert ft.choose_checkpoint_iteration(str(ckpt)) is None
    assert ft.choose_checkpoint_iteration(None) is None
    only = write_iter(ckpt, 3)  # no manifest, no older one: a checkpoint written before manifests still loads
    assert ft.choose_checkpoint_iteration(str(ckpt)) == 3
    mark_bad(only, "a repeated fault right after resuming")
    with pytest.raises(NoGoodCheckpointError, match="iter_0000003: marked bad"):
        ft.choose_checkpoint_iteration(str(ckpt))


def test_a_nan_loss_right_after_a_verified_resume_raises_and_abort_reports_it(monitor, tmp_path):
    # The window is the fault policy's suspect_checkpoint_steps (10) steps after the resume; past it a NaN is
    # the training's own business. abort() in the loop's except block reports the exception to the monitor.
    ckpt = tmp_path / "ckpt"
    ft.setup(args_for(ckpt))
    save(ckpt, 20)
    ft.shutdown()
    ft.reset_state()
    ft.setup(args_for(ckpt))
    assert ft.choose_checkpoint_iteration(str(ckpt)) == 20
    ft.on_checkpoint_loaded(is_local_chkpt=False)
    ft.on_training_step_start(20)
    ft.on_training_step_end(loss=0.5)
    ft.on_training_step_start(21)
    with pytest.raises(NonFiniteLossError, match="non-finite loss nan at step 21, 1 step"):
        try:
            ft.on_training_step_end(loss=math.nan)
        except NonFiniteLossError:
            ft.abort()
            raise
    report = wait_for_event(monitor.events_path, 10, event="rank_exception", rank=0)
    assert (report["exception_type"], report["iteration"]) == (NONFINITE_LOSS_ERROR, 21)


def test_the_loss_is_not_watched_past_the_window_nor_without_a_verified_load(monitor, tmp_path):
    ckpt = tmp_path / "ckpt"
    ft.setup(args_for(ckpt))
    ft.on_checkpoint_loaded(is_local_chkpt=False)  # loaded by other means: nothing to blame
    ft.on_training_step_start(1)
    ft.on_training_step_end(loss=math.inf)
    save(ckpt, 2)
    ft.shutdown()
    ft.reset_state()
    ft.setup(args_for(ckpt))
    assert ft.choose_checkpoint_iteration(str(ckpt)) == 2
    ft.on_checkpoint_loaded(is_local_chkpt=False)
    for step in range(2, 13):  # 2..12: the resume's 10-step window, finite losses
        ft.on_training_step_start(step)
        ft.on_training_step_end(loss=1.0)
    ft.on_training_step_start(13)
    ft.on_training_step_end(loss=math.nan)  # 11 steps after: not the checkpoint's fault
    assert ft.get_state().loss_watch is None
    ft.shutdown()
