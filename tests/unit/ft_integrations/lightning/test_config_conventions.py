"""The Lightning callback configured the ways Lightning users configure callbacks (no processes).

``LightningCLI`` builds it from a YAML ``trainer.callbacks`` entry (``class_path`` /
``init_args``), Hydra's ``instantiate`` from a ``_target_`` node; both hand the values
to the same validated constructor.
"""

from __future__ import annotations

import pytest
import yaml
from hydra.utils import instantiate
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel

from ft_integrations.lightning import FaultToleranceCallback, MonitoringMode, StandalonePolicy

TARGET = "ft_integrations.lightning.FaultToleranceCallback"
INIT_ARGS = {"mode": "sections", "calculate_timeouts_after_steps": 50, "standalone": "off",
             "config": {"rank_section_timeouts": {"setup": 600, "step": 120}}}


def _only_ft_callback(callbacks: list) -> FaultToleranceCallback:
    ours = [c for c in callbacks if isinstance(c, FaultToleranceCallback)]
    assert len(ours) == 1, callbacks
    return ours[0]


def _check(callback: FaultToleranceCallback) -> None:
    assert callback.mode == MonitoringMode.SECTIONS
    assert callback.standalone == StandalonePolicy.OFF
    assert callback.config.rank_section_timeouts == {"setup": 600.0, "step": 120.0}


@pytest.mark.timeout(60)
def test_lightning_cli_builds_the_callback_from_a_yaml_file(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train.py"])  # as from the command line: the YAML is the only input
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainer": {
        "max_steps": 2, "accelerator": "cpu", "logger": False, "enable_checkpointing": False,
        "callbacks": [{"class_path": TARGET, "init_args": INIT_ARGS}]}}))
    cli = LightningCLI(BoringModel, args=["--config", str(config)], run=False, save_config_callback=None)
    _check(_only_ft_callback(cli.trainer.callbacks))


@pytest.mark.timeout(60)
def test_lightning_cli_reports_a_bad_value_by_its_argument(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train.py"])
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": TARGET, "init_args": {"mode": "beats", "standalone": "off"}}]}}))
    # jsonargparse wraps the constructor's error; its text names the argument and the allowed values.
    with pytest.raises(ValueError, match=r"FaultToleranceCallback.mode: invalid value 'beats'; "
                                         r"allowed: one of heartbeats, sections"):
        LightningCLI(BoringModel, args=["--config", str(config)], run=False, save_config_callback=None)


@pytest.mark.timeout(60)
def test_hydra_instantiate_builds_the_callback_from_a_target_node():
    _check(instantiate({"_target_": TARGET, **INIT_ARGS}, _convert_="all"))
