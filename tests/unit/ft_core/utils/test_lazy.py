"""lazy_exports: a package names its public API and imports a module only when one of its names is used."""

from __future__ import annotations

import sys
import types

import pytest

from ft_core.utils.lazy import lazy_exports


def test_a_name_is_imported_on_first_use_cached_and_listed(monkeypatch):
    owner = types.ModuleType("lazy_owner_for_test")
    owner.Thing = object()
    monkeypatch.setitem(sys.modules, "lazy_owner_for_test", owner)
    namespace: dict = {"already_here": 1}
    getattr_hook, dir_hook = lazy_exports("pkg", {"Thing": "lazy_owner_for_test"}, namespace)
    assert dir_hook() == ["Thing", "already_here"]
    assert "Thing" not in namespace
    assert getattr_hook("Thing") is owner.Thing
    assert namespace["Thing"] is owner.Thing  # later accesses are plain lookups


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    getattr_hook, _ = lazy_exports("pkg", {}, {})
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'Nope'"):
        getattr_hook("Nope")

