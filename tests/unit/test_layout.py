"""The project's layout rules that keep it livable: checked on every test run, so a feature cannot quietly undo them."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("ft_core", "ft_integrations")
#: Above this many lines a module holds more than one concept: split it by concept (the developers' guide).
MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines():
    too_long = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            with path.open(encoding="utf-8") as handle:
                lines = sum(1 for _ in handle)
            if lines > MAX_MODULE_LINES:
                too_long[str(path.relative_to(ROOT))] = lines
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {too_long}"
