"""Read a judge's scores out of its free-text evaluation, without ever executing it.

A judge answers with reasoning and then a JSON block such as::

    ```json
    {"materials_appropriateness_score": 4, ..., "overall_score": (4+3.5)/2}
    ```

``parse_overall_score`` looks for the block, in order, as (1) a fenced ```json block, (2) an untagged fenced
block, (3) a bare ``{...}`` object anywhere in the text that holds the key; within a tier the *last* block
holding the key wins (judges often restate a draft first). A value may be a JSON number, a numeric string, or
simple arithmetic (``(4+3.5)/2``, ``4.5 - 0.5``, ``"(4+4+3.5)/3 = 3.83"``), which is evaluated by a tiny
``ast`` walker that accepts only numeric constants, ``+ - * /``, parentheses and unary signs; nothing else is
ever evaluated. Scores outside ``[lo, hi]`` are rejected with reason ``"out_of_range"``; anything that cannot
be read is ``"unparseable"``. This is the one parser of the project: pair building and evaluation share it.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections import deque
from dataclasses import dataclass, field

__all__ = [
    "ScoreResult",
    "parse_overall_score",
    "parse_overall_score_result",
    "parse_scores",
    "safe_arithmetic",
]

OK = "ok"
UNPARSEABLE = "unparseable"
OUT_OF_RANGE = "out_of_range"

# An expression longer than this is not a score someone wrote by hand; refusing it bounds the work done.
_MAX_EXPR_CHARS = 80
_MAX_TEXT_CHARS = 200_000  # only the tail of a longer text is searched (the score block comes last)

_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)```", re.DOTALL)
# key: value pairs inside a block that is not valid JSON (arithmetic values, trailing commas, single quotes).
# A key starts only where a word starts (the lookbehind): without it a 20,000-letter run was scanned again from each
# of its letters (quadratic: 21 s for 20k characters), with it every character is looked at a bounded number of times.
_PAIR = re.compile(r"""["']?(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)["']?[ \t]*:[ \t]*("[^"\n]*"|'[^'\n]*'|[^,}\n]+)""")


@dataclass(frozen=True)
class ScoreResult:
    """Outcome of reading one score: ``score`` is set only when ``reason == "ok"``.

    ``value`` holds the number that was read even when it is out of range (None when unparseable);
    ``source`` says where it was found: "json_fence", "fence" or "bare".
    """

    score: float | None
    reason: str
    value: float | None = None
    source: str | None = None
    detail: str = ""
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.reason == OK


def safe_arithmetic(expr: str) -> float | None:
    """Value of a numeric literal or simple arithmetic expression; None for anything else. Never executes code."""
    if not isinstance(expr, str):
        return None
    text = expr.strip().rstrip(",").strip()
    if "=" in text:  # "(4+3.5)/2 = 3.75": the judge wrote the result, take it
        text = text.rsplit("=", 1)[1].strip()
    if not text or len(text) > _MAX_EXPR_CHARS:
        return None
    if not re.fullmatch(r"[0-9.eE+\-*/() \t]+", text):
        return None
    try:
        tree = ast.parse(text, mode="eval")
        value = _eval_node(tree.body)
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError, RecursionError, MemoryError):
        return None
    if value is None or not math.isfinite(value):
        return None
    body = tree.body.operand if isinstance(tree.body, ast.UnaryOp) else tree.body
    if not isinstance(body, ast.Constant):
        value = round(value, 6)  # arithmetic: (0.1+0.2) reads as 0.3, not 0.30000000000000004
    return float(value)


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ValueError("not a number")
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        inner = _eval_node(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        return left / right
    raise ValueError(f"disallowed syntax {type(node).__name__}")


def _to_number(raw: object) -> float | None:
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, (int, float)):
        try:
            value = float(raw)
        except OverflowError:
            return None
        return value if math.isfinite(value) else None
    if isinstance(raw, str):
        text = raw.strip().strip("\"'").strip()
        return safe_arithmetic(text)
    return None


def _flatten(obj: object, out: dict[str, object]) -> None:
    """Leaf key -> raw value of nested dicts; the outermost occurrence of a key wins.

    Breadth-first with a queue, not recursion: a 1,200-deep object that ``json.loads`` accepts (Python 3.12 decodes
    deeper than the interpreter's recursion limit) must not end in RecursionError."""
    queue = deque([obj])
    while queue:
        current = queue.popleft()
        if not isinstance(current, dict):
            continue
        for key, value in current.items():
            if isinstance(value, dict):
                queue.append(value)
            elif isinstance(key, str):
                out.setdefault(key, value)


def _block_items(block: str) -> dict[str, object]:
    """Raw key -> value entries of one JSON-ish block (strict JSON first, then a forgiving key: value scan)."""
    text = block.strip()
    try:
        loaded = json.loads(text)
    except Exception:  # noqa: BLE001 - any failure (bad JSON, huge ints, deep nesting) means "try the scan"
        loaded = None
    items: dict[str, object] = {}
    if isinstance(loaded, dict):
        _flatten(loaded, items)
        return items
    for match in _PAIR.finditer(text):
        items.setdefault(match.group(1), match.group(2).strip())
    return items


def _bare_objects(text: str) -> list[str]:
    """Outermost balanced ``{...}`` spans of ``text``, in order, found in one pass (quotes inside are respected).

    A stray unclosed ``{`` in prose does not hide the objects after it.
    """
    stack: list[int] = []
    closed: list[tuple[int, int]] = []
    in_str = escape = False
    for j, ch in enumerate(text):
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"' or ch == "\n":
                in_str = False
        elif ch == '"' and stack:
            in_str = True
        elif ch == "{":
            stack.append(j)
        elif ch == "}" and stack:
            closed.append((stack.pop(), j))
    # spans close inner-first; keep those not inside a later-closing (enclosing) span
    closed.sort()
    spans: list[str] = []
    outer_end = -1
    for start, end in closed:
        if end > outer_end:
            spans.append(text[start : end + 1])
            outer_end = end
    return spans


def _candidates(text: str, key: str):
    """(source, items) for every block holding ``key``, in priority order (last block first within a tier)."""
    fences = [(m.group(1).strip().lower(), m.group(2)) for m in _FENCE.finditer(text)]
    tiers = [
        ("json_fence", [body for tag, body in fences if tag == "json"]),
        ("fence", [body for tag, body in fences if tag == ""]),
        ("bare", _bare_objects(text) if key in text else []),
    ]
    for source, blocks in tiers:
        for block in reversed(blocks):
            if key not in block:
                continue
            items = _block_items(block)
            if key in items:
                yield source, items


def parse_overall_score_result(
    text: object, *, key: str = "overall_score", lo: float = 0.5, hi: float = 5.5
) -> ScoreResult:
    """Read ``key`` from a judge's evaluation text; never raises, never executes the text."""
    if not isinstance(text, str) or not text.strip():
        return ScoreResult(None, UNPARSEABLE, detail="empty evaluation")
    text = text[-_MAX_TEXT_CHARS:]
    found_key = False
    for source, items in _candidates(text, key):
        found_key = True
        value = _to_number(items[key])
        if value is None:
            continue
        scores = {k: v for k, v in ((k, _to_number(raw)) for k, raw in items.items()) if v is not None}
        if not lo <= value <= hi:
            return ScoreResult(None, OUT_OF_RANGE, value, source, f"{key}={value:g} outside [{lo:g}, {hi:g}]", scores)
        return ScoreResult(value, OK, value, source, "", scores)
    detail = f"{key} holds no number" if found_key else f"no block with {key}"
    return ScoreResult(None, UNPARSEABLE, detail=detail)


def parse_overall_score(
    text: object, *, key: str = "overall_score", lo: float = 0.5, hi: float = 5.5
) -> float | None:
    """The overall score in ``[lo, hi]`` read from ``text``, or None (see ``parse_overall_score_result`` for why)."""
    return parse_overall_score_result(text, key=key, lo=lo, hi=hi).score


def parse_scores(text: object, *, key: str = "overall_score") -> dict[str, float]:
    """Every numeric criterion of the score block (e.g. ``materials_appropriateness_score`` ... ``overall_score``).

    The block is the one ``parse_overall_score`` would read (no range check here); without a block holding
    ``key``, the last block with any numeric entry is used. Returns ``{}`` when nothing numeric is found.
    """
    if not isinstance(text, str) or not text.strip():
        return {}
    text = text[-_MAX_TEXT_CHARS:]
    for _, items in _candidates(text, key):
        scores = {k: v for k, v in ((k, _to_number(raw)) for k, raw in items.items()) if v is not None}
        if key in scores:
            return scores
    fences = [(m.group(1).strip().lower(), m.group(2)) for m in _FENCE.finditer(text)]
    blocks = [b for t, b in fences if t == "json"] + [b for t, b in fences if t == ""] + _bare_objects(text)
    for block in reversed(blocks):
        if ":" not in block:  # no key: value inside; thousands of empty fences must not each cost a failed parse
            continue
        scores = {k: v for k, v in ((k, _to_number(raw)) for k, raw in _block_items(block).items()) if v is not None}
        if scores:
            return scores
    return {}
