"""The layout: every module has tests at the path that mirrors the package, and a name says one thing.

A module ``ft_core/a/b.py`` is tested by ``tests/unit/ft_core/a/test_b.py`` (in this process only) and/or
``tests/integration/ft_core/a/test_b.py`` (real processes), so a reader finds a module's tests without a search.

A module stays under 600 lines, and its file name and a public class's name each say one thing across ``ft_core`` and ``ft_integrations``,
so a reader (or a traceback, or ``from x import Name``) never has to ask which of two it means; the NVRx alias
shim's copies of NVRx's file names aside.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from helpers import REPO_ROOT

PACKAGES = ("ft_core", "ft_integrations")
#: not modules with behaviour of their own: package markers, entry points, and the NVRx alias shim's deliberate
#: copies of NVRx's module names (tested through ``tests/*/ft_integrations/test_nvrx_alias.py``)
NOT_MIRRORED_NAMES = {"__init__.py", "__main__.py"}
NOT_MIRRORED_DIRS = {Path("ft_integrations/nvrx_alias/shim")}


def _modules() -> list[Path]:
    modules = []
    for package in PACKAGES:
        for path in sorted(Path(REPO_ROOT, package).rglob("*.py")):
            module = path.relative_to(REPO_ROOT)
            if module.name in NOT_MIRRORED_NAMES or any(d in module.parents for d in NOT_MIRRORED_DIRS):
                continue
            modules.append(module)
    return modules


def _has_mirrored_tests(module: Path) -> bool:
    test_file = module.parent / f"test_{module.name}"
    return any(Path(REPO_ROOT, "tests", kind, test_file).is_file() for kind in ("unit", "integration"))


def test_every_module_has_tests_at_its_mirrored_path():
    missing = [str(module) for module in _modules() if not _has_mirrored_tests(module)]
    assert not missing, f"{len(missing)} modules without tests at tests/unit|integration/<same path>/test_<name>.py: " \
                        f"{missing}"


def _duplicates(where: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: places for name, places in sorted(where.items()) if len(places) > 1}


def test_no_two_modules_share_a_file_name():
    where: dict[str, list[str]] = defaultdict(list)
    for module in _modules():  # package markers and entry points (every package has them) and the shim aside
        where[module.name].append(str(module))
    assert _duplicates(where) == {}, "rename one of each: a file name says one thing"


def test_no_public_class_name_is_defined_twice():
    where: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted(Path(REPO_ROOT, package).rglob("*.py")):
            module = path.relative_to(REPO_ROOT)
            if any(d in module.parents for d in NOT_MIRRORED_DIRS):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            # Module level, and the bodies of a module-level if/try (a class defined per platform or version).
            statements = list(tree.body)
            for statement in tree.body:
                if isinstance(statement, (ast.If, ast.Try)):
                    statements += statement.body + statement.orelse
            for statement in statements:
                if isinstance(statement, ast.ClassDef) and not statement.name.startswith("_"):
                    where[statement.name].append(str(module))
    assert _duplicates(where) == {}, "rename one of each: a class name says one thing"


#: Above this many lines a module holds more than one concept: split it by concept (the developers' guide).
MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines():
    too_long = {}
    for package in PACKAGES:
        for path in sorted(Path(REPO_ROOT, package).rglob("*.py")):
            with path.open(encoding="utf-8") as handle:
                lines = sum(1 for _ in handle)
            if lines > MAX_MODULE_LINES:
                too_long[str(path.relative_to(REPO_ROOT))] = lines
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {too_long}"
