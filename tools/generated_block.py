"""Rewrite the block between two markers of a docs page from the code that generates it, or check it is current.

The one ``main`` of the tools that keep a docs table generated (``layout_table.py``, ``exit_codes_table.py``):
``python tools/<tool>.py`` rewrites the block; ``--check`` exits 1 when it is out of date.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def main(argv: list[str] | None, *, description: str, page: str, begin: str, end: str,
         content: Callable[[], str], what: str, tool: str) -> int:
    """Put ``content()`` between ``begin`` and ``end`` in ``page`` (``--check``: only say whether it is there)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is out of date")
    args = parser.parse_args(argv)
    with open(page, encoding="utf-8") as handle:
        text = handle.read()
    head, found, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    if not found:
        print(f"{page}: no {begin.strip()} marker", file=sys.stderr)
        return 1
    updated = head + begin + content() + end + tail
    if args.check:
        if updated != text:
            print(f"{page}: {what} is out of date; run python {tool}", file=sys.stderr)
            return 1
        return 0
    with open(page, "w", encoding="utf-8") as handle:
        handle.write(updated)
    return 0
