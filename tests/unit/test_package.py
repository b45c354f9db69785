"""The package's metadata: one version everywhere, a licence, extras that add exactly what a feature imports.

What an installed wheel contains and runs is checked by ``tests/e2e/test_wheel_install.py``.
"""

from __future__ import annotations

import ast
from importlib import metadata
from pathlib import Path

import tomllib
from helpers import REPO_ROOT
from packaging.requirements import Requirement

import ft_core
from ft_core.version import DISTRIBUTION

PYPROJECT = tomllib.loads(Path(REPO_ROOT, "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]

#: distribution -> the top-level module the code imports from it
IMPORT_NAMES = {"lightning": "lightning", "typing-extensions": "typing_extensions", "matplotlib": "matplotlib",
                "prometheus-client": "prometheus_client", "python-etcd": "etcd", "msgspec": "msgspec",
                "pyyaml": "yaml", "torch": "torch", "etcd3gw": "etcd3gw"}
#: requirements for a dependency's sake, not imported by us: python-etcd needs urllib3 2.x or 1.26; Lightning's
#: LightningCLI needs jsonargparse's signatures extra to build FaultToleranceCallback from a YAML file
PINNED_FOR_A_DEPENDENCY = {"urllib3", "jsonargparse"}


def _imported_top_level_modules() -> set[str]:
    modules = set()
    for package in ("ft_core", "ft_integrations"):
        for path in Path(REPO_ROOT, package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    modules.add(node.module.split(".")[0])
    return modules


def test_the_distribution_is_named_once_and_not_taken_on_the_package_index():
    # "ft-suite" on the package index is an unrelated fine-tuning suite (0.1.8): `pip install ft-suite` installs
    # it, and our version would read its metadata.
    assert PROJECT["name"] == DISTRIBUTION == "ft-suite-pytorch"


def test_the_version_comes_from_the_installed_metadata():
    assert ft_core.__version__ == metadata.version(DISTRIBUTION) == PROJECT["version"]


def test_every_published_requirement_is_imported_by_the_code():
    imported = _imported_top_level_modules()
    published = [*PROJECT["dependencies"], *(r for reqs in PROJECT["optional-dependencies"].values() for r in reqs)]
    for requirement in map(Requirement, published):
        if requirement.name in PINNED_FOR_A_DEPENDENCY:
            continue
        assert IMPORT_NAMES[requirement.name] in imported, f"{requirement} is installed but never imported"


def test_extras_hold_no_development_tools_and_megatron_swaps_nothing():
    extras = PROJECT["optional-dependencies"]
    assert set(extras) == {"lightning", "megatron", "report", "metrics", "etcd"}
    assert extras["megatron"] == []  # no Megatron package is imported: a container's megatron-core stays
    assert "pytest" in " ".join(PYPROJECT["dependency-groups"]["dev"])


def test_the_licence_ships():
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in Path(REPO_ROOT, "LICENSE").read_text(encoding="utf-8")
