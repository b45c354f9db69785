"""Hydra recipes: every fault_tolerance option composes and trains; bad keys fail clearly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, python_env

from ft_core.config import FaultToleranceConfig

RECIPES = os.path.join(REPO_ROOT, "recipes")
TRAIN = os.path.join(RECIPES, "train.py")
CONF = os.path.join(RECIPES, "conf")
FT_OPTIONS = ("heartbeats", "sections", "off")


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    sys.path.insert(0, RECIPES)
    try:
        from recipe_lib.schema import register

        register()
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))
    finally:
        sys.path.remove(RECIPES)


@pytest.mark.parametrize("option", FT_OPTIONS)
def test_each_fault_tolerance_option_composes(option):
    cfg = _compose(f"fault_tolerance={option}")
    if option == "off":
        assert cfg.callback is None
    else:
        assert cfg.callback.mode == option
        assert cfg.callback._target_ == "ft_integrations.lightning.FaultToleranceCallback"
    # The composed block is a valid FaultToleranceConfig, as ft_launcher --ft-cfg-path reads it.
    from omegaconf import OmegaConf

    FaultToleranceConfig.from_mapping(OmegaConf.to_container(cfg.fault_tolerance))


@pytest.mark.parametrize(("value", "level"), [("debug", 10), ("WARN", 30), ("dbg", 10), ("40", 40), (15, 15)])
def test_log_level_takes_names_in_any_case_and_numbers(value, level):
    from omegaconf import OmegaConf

    cfg = _compose(f"fault_tolerance.log_level={value}")
    assert FaultToleranceConfig.from_mapping(OmegaConf.to_container(cfg.fault_tolerance)).log_level == level


def test_group_file_is_a_valid_launcher_config():
    cfg = FaultToleranceConfig.from_yaml_file(os.path.join(CONF, "fault_tolerance", "sections.yaml"))
    assert cfg.rank_section_timeouts["checkpointing"] == 30.0
    assert cfg.rank_heartbeat_timeout is None


def _train(tmp_path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = python_env(FT_RECIPE_RUN_DIR=str(tmp_path / "run"), FAULT_TOL_FINISHED_FLAG_FILE=str(tmp_path / "done"))
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET"):
        env.pop(key, None)
    return subprocess.run([sys.executable, TRAIN, *overrides], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(tmp_path))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("option", FT_OPTIONS)
def test_each_fault_tolerance_option_runs_a_few_steps(tmp_path, option):
    result = _train(tmp_path, "trainer=cpu_single", f"fault_tolerance={option}", "trainer.max_steps=6",
                    "trainer.val_check_interval=3", "checkpoint.every_n_train_steps=3", "model.step_delay=0",
                    "log_level=info", "fault_tolerance.log_level=info")  # lowercase names, as NVRx takes them
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training finished at step 6" in result.stderr
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
    # autoresume is on in the FT options: the finished flag marks a complete run.
    assert (tmp_path / "done").exists() == (option != "off")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.max_stpes=3", "Key 'max_stpes' not in 'TrainerSchema'"),
        ("fault_tolerance.rank_hearbeat_timeout=3", "Key 'rank_hearbeat_timeout' not in 'FaultToleranceSchema'"),
        ("fault=hang_rnk1", "Could not find 'fault/hang_rnk1'"),
        ("fault_tolerance.rank_heartbeat_timeout=-3", "fault_tolerance.rank_heartbeat_timeout: invalid value -3"),
        ("fault_tolerance.log_level=loud", "fault_tolerance.log_level: invalid value 'loud'"),
    ],
)
def test_misspelled_or_bad_key_fails_with_a_clear_error(tmp_path, override, message):
    result = _train(tmp_path, "trainer=cpu_single", override, timeout=100)
    assert result.returncode != 0
    assert message in result.stderr + result.stdout
