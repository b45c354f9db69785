"""Write the package rows of the Layout table in docs/development.md from the modules' opening docstrings.

Every module of ``ft_core`` and ``ft_integrations`` opens with a docstring whose first line names its one
job; this table is those lines, so it cannot drift from the tree. ``python tools/layout_table.py`` rewrites
the rows between the ``layout:packages`` markers; ``--check`` exits 1 when they are out of date
(``tests/unit/test_docs.py`` runs the check).
"""

from __future__ import annotations

import ast
import os
import sys

import generated_block

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(REPO_ROOT, "docs", "development.md")
BEGIN, END = "<!-- layout:packages:begin -->\n", "<!-- layout:packages:end -->\n"
PACKAGES = ("ft_core", "ft_integrations")
#: Generated re-export files of NVRx's import paths: one line each, no job of their own.
SKIP = os.path.join("ft_integrations", "nvrx_alias", "shim")


def modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for root, dirs, files in os.walk(os.path.join(REPO_ROOT, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            found += [os.path.relpath(os.path.join(root, name), REPO_ROOT) for name in files if name.endswith(".py")]
    return sorted((path for path in found if not path.startswith(SKIP)),
                  key=lambda path: (os.path.dirname(path), os.path.basename(path) != "__init__.py", path))


def job_of(path: str) -> str:
    """The first line of the module's docstring; a module without one is an error."""
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as handle:
        doc = ast.get_docstring(ast.parse(handle.read()))
    if not doc:
        raise SystemExit(f"{path}: no opening docstring naming the module's job")
    return doc.splitlines()[0].replace("|", "\\|")


def rows() -> str:
    return "| module | its one job |\n|---|---|\n" + "".join(f"| `{path}` | {job_of(path)} |\n" for path in modules())


def main(argv: list[str] | None = None) -> int:
    return generated_block.main(argv, description=__doc__.splitlines()[0], page=PAGE, begin=BEGIN, end=END,
                                content=rows, what="the Layout table", tool="tools/layout_table.py")


if __name__ == "__main__":
    sys.exit(main())
