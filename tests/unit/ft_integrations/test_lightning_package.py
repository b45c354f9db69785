"""Which Lightning distribution the callback is built on: chosen once per process.

Choosing ``pytorch_lightning`` in a fresh process is tested in ``tests/integration/ft_integrations/test_pytorch_lightning.py``.
"""

from __future__ import annotations

import sys

import pytest

from ft_integrations import lightning_package
from ft_integrations.lightning import _pl
from ft_integrations.lightning_package import LightningPackage, choose


def _built_on() -> LightningPackage:
    return LightningPackage.PYTORCH_LIGHTNING if _pl.pl.__name__ == "pytorch_lightning" else LightningPackage.LIGHTNING


def test_once_built_the_other_package_cannot_be_chosen(monkeypatch):
    monkeypatch.setattr(lightning_package, "chosen", lightning_package.chosen)
    built = _built_on()
    other = next(package for package in LightningPackage if package is not built)
    choose(built)  # the same package again: fine
    assert lightning_package.chosen is built
    with pytest.raises(ImportError, match=f"already built on {built.value} in this process, so it cannot be "
                                          f"built on {other.value} too"):
        choose(other)
    assert lightning_package.chosen is built


def test_before_the_integration_is_built_either_package_may_be_chosen(monkeypatch):
    monkeypatch.setattr(lightning_package, "chosen", None)
    monkeypatch.delitem(sys.modules, "ft_integrations.lightning._pl")
    choose(LightningPackage.PYTORCH_LIGHTNING)
    assert lightning_package.chosen is LightningPackage.PYTORCH_LIGHTNING
    assert f"{LightningPackage.LIGHTNING}" == "lightning"  # the value users write
