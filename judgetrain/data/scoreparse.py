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

The text is untrusted, so the parser reads it in time linear in its length whatever it holds: the last 200,000
characters are read, by two single-pass scanners (fences, braces) and a key: value scanner per block; no regular
expression here can backtrack (see the comments at each). Per tier only the last 100 blocks holding the key are read.
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
    "parse_verdict",
    "safe_arithmetic",
    "VerdictResult",
    "PairVerdictResult",
    "parse_pair_verdict",
    "count_pair_verdicts",
]

OK = "ok"
UNPARSEABLE = "unparseable"
OUT_OF_RANGE = "out_of_range"
NO_VERDICT = "no_verdict"
CONFLICTING = "conflicting"

# An expression longer than this is not a score someone wrote by hand; refusing it bounds the work done.
_MAX_EXPR_CHARS = 80
_MAX_TEXT_CHARS = 200_000  # only the tail of a longer text is searched (the score block comes last)
# Only the last this many blocks of a tier that hold the key are read (a judge restates its score a few times, not
# hundreds): a text made of thousands of small unreadable score blocks costs no more than a clean one.
_MAX_BLOCKS = 100

# Linear time by construction. Each pattern below but _KEY (argued at it) holds one quantifier over one character class,
# with nothing after it that could make it give characters back: a match costs the characters it covers. The scanners
# (_fences, _pairs) call them and str.find only from positions that move forward. A pattern with two unbounded
# quantifiers over the same characters side by side backtracks quadratically on a run of those characters: the former
# fence pattern r"```[ \t]*([^\n`]*)\n(.*?)```" took 3 s for a fence followed by 20,000 spaces and no newline, 13 s
# for 40,000 (``[ \t]*`` and ``[^\n`]*`` split the run of spaces every possible way before giving up).
_BACKTICKS = re.compile(r"`*")
_TAG_LINE = re.compile(r"[^\n`]*")  # a fence's tag line: stops at the first newline or backtick
# A key and its colon. Tried only where a word starts (the lookbehind), it covers that word and the quote and blanks
# after it: the word's class, [ \t] and the quote and colon are disjoint, so giving letters back never finds a colon.
_KEY = re.compile(r"""(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)["']?[ \t]*:""")
_BLANKS = re.compile(r"[ \t]*")
_UNQUOTED_VALUE = re.compile(r"[^,}\n]*")
_QUOTED_REST = {'"': re.compile(r'[^"\n]*'), "'": re.compile(r"[^'\n]*")}  # up to the closing quote or the line end


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
    if not re.fullmatch(r"[0-9.eE+\-*/() \t]+", text):  # one class, on at most _MAX_EXPR_CHARS characters
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
    loaded = None
    if text.startswith("{"):  # only an object is used: anything else need not be decoded
        try:
            loaded = json.loads(text)
        except Exception:  # noqa: BLE001 - any failure (bad JSON, huge ints, deep nesting) means "try the scan"
            loaded = None
    items: dict[str, object] = {}
    if isinstance(loaded, dict):
        _flatten(loaded, items)
        return items
    for name, raw in _pairs(text):
        items.setdefault(name, raw.strip())
    return items


def _fences(text: str) -> list[tuple[str, str]]:
    """(tag, body) of every fenced block: a fence is three backticks, a tag line (no backtick in it) ended by a
    newline, then the body up to the next three backticks; a fence that does not close ends the search.

    Linear: the position only moves forward. A failed opener looks at its tag line once, and the next opener is
    searched for from just after it: three backticks start inside the tag line only as part of a longer run of
    backticks, which ends that tag line at once. A body search that finds no closing fence has looked at the rest
    of the text, and there is no fence left to open."""
    out: list[tuple[str, str]] = []
    start = text.find("```")
    while start != -1:
        if text.startswith("`", start + 3):  # a run of backticks: only its last three can open a fence
            start = _BACKTICKS.match(text, start).end() - 3
            continue
        line_end = _TAG_LINE.match(text, start + 3).end()
        if line_end == len(text) or text[line_end] != "\n":  # a backtick or the end before the newline: no opener
            start = text.find("```", start + 1)
            continue
        close = text.find("```", line_end + 1)
        if close == -1:
            break
        out.append((text[start + 3 : line_end].strip().lower(), text[line_end + 1 : close]))
        start = text.find("```", close + 3)
    return out


def _pairs(text: str):
    """``key: value`` entries of a block, in order: an optionally quoted key (letters, digits, _; starting where a
    word starts), optional quote, blanks, a colon, blanks, then a "double-" or 'single-'quoted value closed on its
    line, else the text up to the next ``,`` ``}`` or newline (blanks only: the value is blank; nothing at all: no
    entry). A value is consumed: nothing inside it is read as a key.

    Linear: each search for a key starts where the previous entry ended, and an attempt of _KEY covers one word and
    the quote and blanks after it. A quoted value that does not close has looked at the rest of its line, and no
    later value on that line can start with that quote, so each line is read by at most one failed scan per quote."""
    n = len(text)
    pos = 0
    while True:
        found = _KEY.search(text, pos)
        if found is None:
            return
        key_start, key_end = found.span(1)
        j = found.end() - 1  # the colon
        value_start = _BLANKS.match(text, j + 1).end()
        first = text[value_start] if value_start < n else ""
        value_end = -1
        if first in _QUOTED_REST:
            close = _QUOTED_REST[first].match(text, value_start + 1).end()
            if close < n and text[close] == first:
                value_end = close + 1
        if value_end == -1 and first and first not in ",}\n":
            value_end = _UNQUOTED_VALUE.match(text, value_start).end()
        if value_end == -1:
            if value_start == j + 1:  # a colon right before , } newline or the end: no entry
                pos = key_end
                continue
            value_start, value_end = value_start - 1, value_start  # blanks only: the last blank is the value
        yield text[key_start:key_end], text[value_start:value_end]
        pos = value_end


def _bare_objects(text: str) -> list[str]:
    """Outermost balanced ``{...}`` spans of ``text``, in order, found in one pass (quotes inside are respected).

    A stray unclosed ``{`` in prose does not hide the objects after it.

    Linear: one pass over the characters; each ``{`` is pushed and popped at most once, and each closed span joins
    the list of outermost spans once and leaves it at most once (when a span that encloses it closes).
    """
    stack: list[int] = []
    outer: list[tuple[int, int]] = []  # closed spans not inside another closed span, in order
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
            start = stack.pop()
            # spans closed since this "{" was opened lie inside it: they are the last ones of the list
            while outer and outer[-1][0] > start:
                outer.pop()
            outer.append((start, j))
    return [text[start : end + 1] for start, end in outer]


def _tiers(fences: list[tuple[str, str]], bare: list[str]) -> list[tuple[str, list[str]]]:
    return [("json_fence", [body for tag, body in fences if tag == "json"]),
            ("fence", [body for tag, body in fences if tag == ""]),
            ("bare", bare)]


def _last_blocks(blocks: list[str], needle: str):
    """The last ``_MAX_BLOCKS`` blocks holding ``needle``, last first."""
    read = 0
    for block in reversed(blocks):
        if needle in block:
            if read == _MAX_BLOCKS:
                return
            read += 1
            yield block


def _candidates(tiers: list[tuple[str, list[str]]], key: str):
    """(source, items) for every block read that holds ``key``, in priority order (last block first within a tier)."""
    for source, blocks in tiers:
        for block in _last_blocks(blocks, key):
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
    tiers = _tiers(_fences(text), _bare_objects(text) if key in text else [])
    for source, items in _candidates(tiers, key):
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
    fences, bare = _fences(text), _bare_objects(text)
    tiers = _tiers(fences, bare if key in text else [])
    for _, items in _candidates(tiers, key):
        scores = {k: v for k, v in ((k, _to_number(raw)) for k, raw in items.items()) if v is not None}
        if key in scores:
            return scores
    # no block gives a number for key: the last block with any numeric entry (one without ":" holds no entry)
    for block in _last_blocks([block for _, blocks in tiers[:2] for block in blocks] + bare, ":"):
        scores = {k: v for k, v in ((k, _to_number(raw)) for k, raw in _block_items(block).items()) if v is not None}
        if scores:
            return scores
    return {}


# ------------------------------------------------------------------------------------------------ pairwise verdicts
# "Proposal A is better", "**Proposal B** is the better one", "proposal a is better": the verdict sentence the pairwise
# prompt asks for (judgetrain.data.ideation.VERDICT). Linear time: every quantifier is bounded and each one's class is
# disjoint from what follows it (blanks and markup, then a letter; markup and punctuation, then "is"; blanks, then
# "the" or "better"), so a match attempt at a position costs at most a constant number of characters.
_VERDICT = re.compile(r"proposal[ \t*_'\"]{0,8}([ab])(?![a-z0-9])[ \t*_'\".,:)]{0,8}is[ \t]{1,4}(?:the[ \t]{1,4})?better",
                      re.IGNORECASE)
_BARE_LETTER = re.compile(r"[ \t\n*_'\"(\[]{0,16}(?:proposal[ \t]{1,4})?([ab])[ \t\n*_'\".)\]]{0,16}", re.IGNORECASE)


@dataclass(frozen=True)
class VerdictResult:
    """Which proposal a pairwise judge picked: ``choice`` "A" or "B" when ``reason == "ok"``, else None with the
    reason: ``"unparseable"`` (empty text), ``"no_verdict"`` (no "Proposal X is better" and no bare letter),
    ``"conflicting"`` (the text says both). ``source``: "sentence" or "letter"."""

    choice: str | None
    reason: str
    source: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason == OK


def parse_verdict(text: object) -> VerdictResult:
    """The proposal a pairwise judge says is better, from its free text; never raises. Every "Proposal X is better"
    sentence is read (the last 200,000 characters): one letter throughout is the verdict, both letters is
    ``conflicting``. A text that is only a letter (``A``, ``**B**``, ``Proposal A.``) is that letter."""
    if not isinstance(text, str) or not text.strip():
        return VerdictResult(None, UNPARSEABLE)
    text = text[-_MAX_TEXT_CHARS:]
    letters = {m.group(1).upper() for m in _VERDICT.finditer(text)}
    if len(letters) == 1:
        return VerdictResult(letters.pop(), OK, "sentence")
    if letters:
        return VerdictResult(None, CONFLICTING)
    bare = _BARE_LETTER.fullmatch(text) if len(text) <= 64 else None
    if bare:
        return VerdictResult(bare.group(1).upper(), OK, "letter")
    return VerdictResult(None, NO_VERDICT)


# --------------------------------------------------------------------------------- pairwise verdicts, [[A>B]] style
# "[[A>B]]", "[[B>A]]", "[[A=B]]" (the verdict judgetrain.data.pairwise's prompt asks for; "[[A>>B]]", "[[B<A]]" and
# blanks inside read the same). Linear time: every quantifier is bounded.
_PAIR_VERDICT = re.compile(r"\[\[[ \t]{0,4}([AB])[ \t]{0,4}(>>|>|=|<<|<)[ \t]{0,4}([AB])[ \t]{0,4}\]\]")
PAIR_VERDICTS = ("A>B", "B>A", "A=B")


@dataclass(frozen=True)
class PairVerdictResult:
    """A pairwise verdict as written about what the judge was shown: ``verdict`` "A>B", "B>A" or "A=B" when
    ``reason == "ok"``, else None with the reason: ``"unparseable"`` (empty text), ``"no_verdict"`` (no [[...]]
    verdict), ``"conflicting"`` (two different verdicts in the text, as Arena-Hard's parser refuses them)."""

    verdict: str | None
    reason: str

    @property
    def ok(self) -> bool:
        return self.reason == OK


def _pair_verdict(first: str, op: str, second: str) -> str | None:
    if first == second:
        return "A=B" if op == "=" else None  # "[[A>A]]" names no winner
    if op == "=":
        return "A=B"
    winner = first if op in (">", ">>") else second
    return "A>B" if winner == "A" else "B>A"


def parse_pair_verdict(text: object) -> PairVerdictResult:
    """The verdict a pairwise judge wrote (``[[A>B]]``, ``[[B>A]]``, ``[[A=B]]``); never raises. Every verdict of the
    last 200,000 characters is read: one verdict throughout is it, two different ones are ``conflicting``."""
    if not isinstance(text, str) or not text.strip():
        return PairVerdictResult(None, UNPARSEABLE)
    found = {_pair_verdict(*m.groups()) for m in _PAIR_VERDICT.finditer(text[-_MAX_TEXT_CHARS:])} - {None}
    if len(found) == 1:
        return PairVerdictResult(found.pop(), OK)
    return PairVerdictResult(None, CONFLICTING if found else NO_VERDICT)


def count_pair_verdicts(results) -> dict:
    """How many verdicts were read: ``n``, ``n_parsed``, ``parse_rate`` (NaN for none) and ``unparsed`` ({reason:
    count} of the rest), of `PairVerdictResult` values."""
    results = list(results)
    unparsed: dict[str, int] = {}
    for r in results:
        if not r.ok:
            unparsed[r.reason] = unparsed.get(r.reason, 0) + 1
    n_parsed = len(results) - sum(unparsed.values())
    return {"n": len(results), "n_parsed": n_parsed, "parse_rate": n_parsed / len(results) if results else math.nan,
            "unparsed": dict(sorted(unparsed.items()))}
