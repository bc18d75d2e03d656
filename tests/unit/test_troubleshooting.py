"""Every message docs/operations/troubleshooting.md quotes is one the gateway produces: it matches a string the
code builds (an f-string, a %-format log call, a concatenation), with the page's example values where the
code has placeholders. The oracle is the source's string templates, not the code under test's behaviour: a
message the code no longer says (reworded, removed) fails here, naming the row."""

from __future__ import annotations

import ast
import re
from functools import cache

import pytest

from tests.helpers import REPO

PAGE = REPO / "docs" / "operations" / "troubleshooting.md"
_PERCENT = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[sdrfgix]")


def _template(node: ast.expr) -> list[str | None] | None:
    """A string expression as literal pieces and holes (None), or None when it is not one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value if isinstance(v, ast.Constant) else None for v in node.values]  # type: ignore[misc]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (left or [None]) + (right or [None])
    if isinstance(node, ast.IfExp):  # "a" if x else "b": a hole (each side is collected on its own too)
        return [None]
    return None


@cache
def templates() -> list[re.Pattern[str]]:
    """Every string expression of openai_api/ as a pattern: literal text exact, each hole (an f-string value,
    a %-format, a non-literal part of a concatenation) any text."""
    out: list[re.Pattern[str]] = []
    for path in sorted((REPO / "openai_api").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.expr):
                continue
            pieces = _template(node)
            if not pieces or not any(p and len(p) > 3 for p in pieces):
                continue
            regex = "".join(".+?" if p is None else
                            ".+?".join(re.escape(s) for s in _PERCENT.split(p)) for p in pieces)
            out.append(re.compile(regex, re.S))
    return out


def quoted_messages() -> list[str]:
    """The first cell of every row of the page's `| message | ...` tables: the message, in a code span."""
    rows: list[str] = []
    in_table = False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("| message |"):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if in_table and not line.startswith("|---"):
            m = re.match(r"^\| (`+)(.+?)\1 \|", line)
            assert m, f"a row of the troubleshooting page quotes no message: {line[:80]}"
            rows.append(m.group(2).strip())
    return rows


def test_the_page_quotes_messages() -> None:
    assert len(quoted_messages()) >= 40


@pytest.mark.parametrize("message", quoted_messages())
def test_each_message_is_one_the_code_produces(message: str) -> None:
    assert any(t.fullmatch(message) for t in templates()), f"no string in openai_api/ produces: {message}"
