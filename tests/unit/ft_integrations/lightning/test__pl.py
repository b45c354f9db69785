"""The Lightning package the integration is built on: every name from one distribution."""

from __future__ import annotations

import importlib

import pytest

from ft_integrations import lightning_package
from ft_integrations.lightning import _pl


def test_the_names_come_from_one_lightning_distribution():
    package = _pl.pl.__name__
    assert package in ("lightning.pytorch", "pytorch_lightning")
    assert _pl.Callback is importlib.import_module(f"{package}.callbacks").Callback
    assert _pl.MisconfigurationException is importlib.import_module(
        f"{package}.utilities.exceptions").MisconfigurationException
    fabric = "lightning.fabric" if package == "lightning.pytorch" else "lightning_fabric"
    assert _pl.CheckpointIO is importlib.import_module(f"{fabric}.plugins").CheckpointIO


def test_the_unified_package_is_the_default_when_installed():
    if lightning_package.chosen is not None:
        pytest.skip("this process imported ft_integrations.pytorch_lightning: the standalone package was chosen")
    assert _pl.pl.__name__ == "lightning.pytorch"
