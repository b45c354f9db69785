"""An installed NVRx beside the alias, with two small packages on disk: what the alias lacks stays NVRx's.

The alias on ``PYTHONPATH`` in front of a real NVRx install is tested in ``tests/integration/ft_integrations/test_nvrx_alias.py``.
"""

from __future__ import annotations

import secrets
import sys
import types

import pytest

from ft_integrations.nvrx_alias.real_nvrx import (
    PACKAGE,
    extend_subpackage,
    extend_with_installed,
    fallback_getattr,
    installed_package_dir,
)


@pytest.fixture
def two_installs(tmp_path, monkeypatch):
    """``alias/nvidia_resiliency_ext`` first on the path, ``site/nvidia_resiliency_ext`` (NVRx's) after it."""
    alias = tmp_path / "alias" / PACKAGE
    real = tmp_path / "site" / PACKAGE
    for package in (alias, real):
        (package / "fault_tolerance").mkdir(parents=True)
        (package / "fault_tolerance" / "__init__.py").write_text("")
    (alias / "__init__.py").write_text('"""the alias"""\n')
    (real / "__init__.py").write_text('__version__ = "0.4.1"\nNVRX_ONLY = True\n')
    (real / "fault_tolerance" / "data.py").write_text("ONLY_IN_NVRX = 'nvrx'\nSHARED = 'nvrx'\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "alias"), str(tmp_path / "site"), *sys.path])
    return alias, real


def test_the_installed_package_is_the_first_on_the_path_that_is_not_the_alias(two_installs, tmp_path):
    alias, real = two_installs
    assert installed_package_dir(str(alias)) == str(real)
    assert installed_package_dir(str(tmp_path / "elsewhere")) == str(alias)  # first found: that one


def test_without_an_installed_nvrx_nothing_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert installed_package_dir(str(tmp_path / PACKAGE)) is None
    (tmp_path / PACKAGE).mkdir()  # a namespace portion only: no installation
    assert installed_package_dir(str(tmp_path / "other" / PACKAGE)) is None


def _package(name: str, directory) -> types.ModuleType:
    module = types.ModuleType(name, "the alias")
    module.__file__ = str(directory / "__init__.py")
    module.__path__ = [str(directory)]
    return module


def test_the_alias_runs_nvrx_init_and_its_search_path_continues_into_nvrx(two_installs, monkeypatch):
    alias, real = two_installs
    package = _package(PACKAGE, alias)
    assert extend_with_installed(package) == str(real)
    assert package.__path__ == [str(alias), str(real)]
    assert (package.__version__, package.NVRX_ONLY, package.__doc__) == ("0.4.1", True, "the alias")
    assert package.__file__ == str(alias / "__init__.py")
    subpackage = _package(f"{PACKAGE}.fault_tolerance", alias / "fault_tolerance")
    monkeypatch.setitem(sys.modules, PACKAGE, package)
    extend_subpackage(subpackage)
    assert subpackage.__path__ == [str(alias / "fault_tolerance"), str(real / "fault_tolerance")]


def test_a_name_the_alias_module_lacks_comes_from_nvrx_module_and_its_own_names_win(two_installs, monkeypatch):
    alias, real = two_installs
    name = f"fakenvrx_{secrets.token_hex(4)}"  # a package of this test only, laid out as the two installs
    package = _package(name, alias / "fault_tolerance")
    package.__path__.append(str(real / "fault_tolerance"))
    module = types.ModuleType(f"{name}.data")
    module.__file__ = str(alias / "fault_tolerance" / "data.py")
    module.SHARED = "alias"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, package)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    module.__getattr__ = fallback_getattr(module.__name__)  # type: ignore[method-assign]
    assert (module.ONLY_IN_NVRX, module.SHARED) == ("nvrx", "alias")  # type: ignore[attr-defined]
    assert sys.modules[f"{name}._nvrx_data"].SHARED == "nvrx"  # NVRx's module, loaded once under a private name
    with pytest.raises(AttributeError, match=f"module '{name}.data' has no attribute 'missing'"):
        module.missing  # type: ignore[attr-defined]  # noqa: B018
    monkeypatch.delitem(sys.modules, f"{name}._nvrx_data")
