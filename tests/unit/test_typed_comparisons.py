"""No decision, outcome or cause is compared with a string literal: the closed sets are str-enums to the end.

A verdict compared as ``decision.action == "restart"`` keeps working when the enum's
value is renamed, and silently never matches again; compared by member
(``decision.action is DecisionAction.RESTART``) it fails at import, and mypy checks it.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The attributes that hold a member of a closed set (a verdict, an outcome, a cause, a kind).
TYPED = frozenset({"action", "outcome", "cause", "rendezvous", "kind"})
PACKAGES = ("ft_core", "ft_integrations")


def string_comparisons(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each comparison of such an attribute with a string literal in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for left, right in zip(operands, operands[1:]):
            for attr, other in ((left, right), (right, left)):
                if isinstance(attr, ast.Attribute) and attr.attr in TYPED and \
                        isinstance(other, ast.Constant) and isinstance(other.value, str):
                    found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scan_finds_a_verdict_compared_with_a_string_and_not_one_compared_with_a_member():
    assert string_comparisons('if decision.action == "restart": pass') == [(1, "decision.action == 'restart'")]
    assert string_comparisons('x = "leave" != outcome.rendezvous') == [(1, "'leave' != outcome.rendezvous")]
    assert string_comparisons("ok = decision.action is DecisionAction.RESTART and r.cause in CAUSES") == []
    assert string_comparisons('name = record.kind.value + "s"') == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_decision_outcome_or_cause_is_compared_with_a_string_literal(package):
    offenders = [f"{path.relative_to(ROOT)}:{line}: {text}"
                 for path in sorted((ROOT / package).rglob("*.py"))
                 for line, text in string_comparisons(path.read_text(encoding="utf-8"))]
    assert not offenders, "compare with the enum's member, not its value:\n" + "\n".join(offenders)
