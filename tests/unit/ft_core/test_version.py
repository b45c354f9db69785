"""ft-suite's version: from the installed metadata, a PEP 440 stand-in for a source tree, and the --version line."""

from __future__ import annotations

import sys
from importlib import metadata

import torch

import ft_core.version as version_module
from ft_core.version import (
    DISTRIBUTION,
    UNKNOWN_VERSION,
    python_version,
    torch_version,
    version,
    version_line,
)


def test_the_version_line_names_the_program_the_distribution_and_the_python_and_torch_in_use():
    assert version_line("ft_launcher") == (f"ft_launcher ({DISTRIBUTION}) {version()} "
                                           f"(Python {python_version()}, torch {torch.__version__})")
    assert python_version() == "{}.{}.{}".format(*sys.version_info[:3])


def test_a_source_tree_that_is_not_installed_reports_the_unknown_version(monkeypatch):
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    version.cache_clear()
    monkeypatch.setattr(metadata, "version", not_installed)
    try:
        assert version() == UNKNOWN_VERSION == version_module.__version__
    finally:
        version.cache_clear()


def test_without_torch_the_line_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert torch_version() == "not installed"
