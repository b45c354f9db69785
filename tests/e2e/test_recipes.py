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


def _recipe_entry_point():
    """recipes/train.py as a module (under its own name: three files of the tree are called train.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("recipes_train_entry_point", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recipe_builds_and_validates_its_config_once_on_the_way_to_the_monitor(start_monitor, monkeypatch):
    # From the composed fault_tolerance block to the values the rank offers the node monitor, the config is
    # built and validated once (train.py): the callback takes that object and filters its fallback fields
    # (it rebuilt the block from a mapping before). The one other construction in the rank is the monitor's
    # reply, validated where it crosses the socket. Constructions are counted at the validator.
    cfg = _compose("fault_tolerance=sections")
    monitor = start_monitor()  # nothing set at launch: the recipe's values fill in every fallback key
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", monitor.socket_path)
    monkeypatch.setenv("FT_MONITOR_TOKEN", monitor.token)
    monkeypatch.syspath_prepend(RECIPES)  # restored afterwards, with what train.py adds to it
    train = _recipe_entry_point()
    built: list[str] = []
    validate = FaultToleranceConfig.__post_init__

    def counted(self) -> None:
        built.append(sys._getframe(2).f_code.co_filename)  # who called the constructor
        validate(self)

    monkeypatch.setattr(FaultToleranceConfig, "__post_init__", counted)
    callback = train._fault_tolerance_callback(cfg)
    assert len(built) == 1, built
    assert callback._connect()  # what setup() does first: hands the fallback values to the monitor
    try:
        assert len(built) == 2, built  # + the monitor's reply (ft_core/client.py)
        assert callback.client.cfg.rank_section_timeouts == {"setup": 120.0, "step": 15.0, "validation": 60.0,
                                                             "checkpointing": 30.0}
        assert (callback.client.cfg.rank_heartbeat_timeout, callback.client.cfg.rank_out_of_section_timeout) == (
            None, 30.0)
    finally:
        callback.client.shutdown_workload_monitoring()


def _recipe_env(tmp_path) -> dict[str, str]:
    env = python_env(FAULT_TOL_FINISHED_FLAG_FILE=str(tmp_path / "done"))
    for key in ("FT_RANK_MONITOR_IPC_SOCKET", "FT_MONITOR_TOKEN", "FT_LAUNCHER_IPC_SOCKET", "SLURM_JOB_ID",
                "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    return env


def _train(tmp_path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, TRAIN, f"hydra.run.dir={tmp_path / 'run'}", *overrides],
                          env=_recipe_env(tmp_path), capture_output=True, text=True, timeout=timeout,
                          cwd=str(tmp_path))


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


@pytest.mark.timeout(300)
def test_multirun_jobs_get_their_own_run_directories(tmp_path):
    # Two jobs of one sweep: each trains from scratch in its own directory (none resumes the other's run).
    result = subprocess.run(
        [sys.executable, TRAIN, "-m", "trainer=cpu_single", "fault_tolerance=off", "model.lr=0.05,0.1",
         "trainer.max_steps=4", "trainer.val_check_interval=2", "checkpoint.every_n_train_steps=2"],
        env=_recipe_env(tmp_path), capture_output=True, text=True, timeout=280, cwd=str(tmp_path))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    (sweep,) = (tmp_path / "outputs" / "sweeps").iterdir()
    assert sweep.name.startswith("local-")  # no launcher, no SLURM: a fresh run name, not a timestamp
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    for job in ("0", "1"):
        assert (sweep / job / "checkpoints" / "last.ckpt").exists()
    assert "resuming from" not in out
    assert out.count("training finished at step 4") == 2


@pytest.mark.timeout(300)
def test_a_restarted_job_resumes_from_its_own_run_directory(tmp_path):
    # Under ft_launcher rank 0 is killed at step 25; the restarted workers find the same
    # directory (named by the launcher's run id) and resume from its checkpoint.
    result = subprocess.run(
        [sys.executable, "-m", "ft_core.launcher", "--nproc-per-node=1", "--max-restarts=1", "--rdzv-id=job-7",
         "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", f"--log-dir={tmp_path / 'logs'}", TRAIN,
         "fault=kill_rank0", "trainer.max_steps=30"],
        env=_recipe_env(tmp_path), capture_output=True, text=True, timeout=280, cwd=str(tmp_path))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    run_dir = tmp_path / "outputs" / "runs" / "job-7"
    assert [p.name for p in (tmp_path / "outputs" / "runs").iterdir()] == ["job-7"]
    assert f"resuming from {run_dir / 'checkpoints' / 'last.ckpt'}" in out
    assert "training finished at step 30" in out


@pytest.mark.parametrize(("environ", "name"), [
    ({"SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "abc"}, "4242"),  # kept by a requeue
    ({"TORCHELASTIC_RUN_ID": "abc"}, "abc"),  # kept by every in-job restart
    ({"TORCHELASTIC_RUN_ID": "none"}, None),  # torchrun's "not given"
    ({}, None),
])
def test_default_run_name(environ, name):
    sys.path.insert(0, RECIPES)
    try:
        from recipe_lib.run_name import check_run_name, default_run_name
    finally:
        sys.path.remove(RECIPES)
    got = default_run_name(environ)
    if name is not None:
        assert got == name
    else:  # a fresh name: the same within the process, never a timestamp
        assert got.startswith("local-") and got == default_run_name({})
    with pytest.raises(ValueError, match="run_name: invalid value '../x'"):
        check_run_name("../x")


def test_help_and_cfg_show_the_fault_tolerance_settings(tmp_path):
    help_text = subprocess.run([sys.executable, TRAIN, "--help", "fault_tolerance=sections"],
                               env=_recipe_env(tmp_path), capture_output=True, text=True, timeout=100).stdout
    assert "ft_launcher --nproc-per-node=2" in help_text  # the header says how to run it
    assert "fault_tolerance: heartbeats, off, sections" in help_text
    section = help_text.split("\nfault_tolerance:\n", 1)[1]
    assert "rank_section_timeouts:\n    setup: 120.0\n    step: 15.0" in section
    assert "callback:\n  _target_: ft_integrations.lightning.FaultToleranceCallback\n  mode: sections" in section
    job = subprocess.run([sys.executable, TRAIN, "--cfg", "job", "fault_tolerance=heartbeats"],
                         env=_recipe_env(tmp_path), capture_output=True, text=True, timeout=100).stdout
    assert "rank_heartbeat_timeout: 30.0" in job and "initial_rank_heartbeat_timeout: 120.0" in job


def test_bad_key_in_a_recipe_file_names_the_key(tmp_path):
    # A fault_tolerance option of the user's own (--config-dir) with a misspelled key.
    group = tmp_path / "conf" / "fault_tolerance"
    group.mkdir(parents=True)
    (group / "mine.yaml").write_text("# @package _global_\nfault_tolerance:\n  rank_hearbeat_timeout: 3\n")
    result = subprocess.run([sys.executable, TRAIN, "--config-dir", str(tmp_path / "conf"), "fault_tolerance=mine",
                             "trainer=cpu_single"], env=_recipe_env(tmp_path), capture_output=True, text=True,
                            timeout=100, cwd=str(tmp_path))
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Key 'rank_hearbeat_timeout' not in 'FaultToleranceSchema'" in out
    assert "full_key: fault_tolerance.rank_hearbeat_timeout" in out
