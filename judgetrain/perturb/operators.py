"""Rule operators: table substitutions, numeric perturbations and format rewrites, without a model.

Every rule operator lists the spans of a text it could edit (`Span`: where, what is there, how to draw the
replacement); a set at a rate picks a share of the spans of all its operators (`pick`: the rate times the eligible
spans, at least one, drawn with the item's seeded generator), and `apply` makes the picked edits, returning the new
text and one `Change` per edit (kind, before, after, position in the source text).

    rules = Rules(spec)
    spans = rules.spans("element_substitution", text)
    new_text, changes = apply(text, pick(spans, 0.05, rng), rng)
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Callable

from judgetrain.perturb.spec import Operator, Spec

NUMBER = r"(?<![\w.,])(\d+(?:\.\d+)?)"
LIST_LINE = re.compile(r"^([ \t]*)([-*+]|\d+[.)])[ \t]+(.*)$", re.M)


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: str  # the operator's name
    draw: Callable[[random.Random], str | None]  # the replacement (None: nothing different to write)


@dataclass(frozen=True)
class Change:
    kind: str
    before: str
    after: str
    position: int  # character offset of ``before`` in the source text

    def as_dict(self) -> dict:
        return {"kind": self.kind, "before": self.before, "after": self.after, "position": self.position}


def pick(spans: list[Span], rate: float, rng: random.Random) -> list[Span]:
    """A share ``rate`` of the spans (rounded, at least one), drawn with ``rng``; overlapping spans are dropped
    first (the earlier one kept), so every edit stands alone. Returned in text order."""
    kept: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if not kept or span.start >= kept[-1].end:
            kept.append(span)
    if not kept:
        return []
    n = min(len(kept), max(1, round(rate * len(kept))))
    return [kept[i] for i in sorted(rng.sample(range(len(kept)), n))]


def apply(text: str, spans: list[Span], rng: random.Random) -> tuple[str, list[Change]]:
    """The text with every picked span replaced (replacements drawn in text order) and the changes made."""
    changes = []
    for span in spans:
        after = span.draw(rng)
        before = text[span.start: span.end]
        if after is not None and after != before:
            changes.append(Change(span.kind, before, after, span.start))
    parts, pos = [], 0
    for c in changes:
        parts += [text[pos: c.position], c.after]
        pos = c.position + len(c.before)
    parts.append(text[pos:])
    return "".join(parts), changes


def misplaced(source: str, new: str, changes: list[Change]) -> str | None:
    """Why ``new`` is not ``source`` with exactly ``changes`` made (None when it is): each edit's ``before`` at its
    position in the source, its ``after`` at the shifted position in the new text, and the text outside the edits
    unchanged."""
    shift, pos = 0, 0
    for c in changes:
        if c.before == c.after:
            return f"edit at {c.position} changes nothing"
        if source[c.position: c.position + len(c.before)] != c.before or c.position < pos:
            return f"edit at {c.position}: the source does not hold {c.before!r} there"
        at = c.position + shift
        if new[at: at + len(c.after)] != c.after or new[pos + shift: at] != source[pos: c.position]:
            return f"edit at {c.position}: the new text does not hold {c.after!r} there"
        shift += len(c.after) - len(c.before)
        pos = c.position + len(c.before)
    if new[pos + shift:] != source[pos:]:
        return "the text after the last edit changed"
    return None


# ------------------------------------------------------------------------------------------------ numbers
def format_like(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def significant(value: float, digits: int = 4) -> str:
    """``value`` with ``digits`` significant digits, trailing zeros cut (1234.5678 -> 1235, 0.012345 -> 0.01235)."""
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _decimals(number: str) -> int:
    return len(number.split(".", 1)[1]) if "." in number else 0


class Rules:
    """The compiled rule operators of a spec (patterns built once, for every text)."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.unit_dim = {u: d for d, units in spec.units.items() for u in units}
        units = sorted(self.unit_dim, key=len, reverse=True)
        unit_re = "|".join(map(re.escape, units))
        self.number = re.compile(NUMBER + (rf"(?:([ \t]?)({unit_re})(?![A-Za-z]))?" if units else "") + r"(?![\w])")
        self.compiled: dict[str, list[tuple[re.Pattern, Callable[[re.Match], str]]]] = {}
        for op in spec.operators.values():
            if op.kind == "table":
                self.compiled[op.name] = self._table(op)

    def spans(self, name: str, text: str) -> list[Span]:
        op = self.spec.operators[name]
        if op.kind == "table":
            return [Span(m.start(), m.end(), name, lambda _rng, m=m, f=f: f(m))
                    for pattern, f in self.compiled[name] for m in pattern.finditer(text)]
        if op.kind == "numeric":
            return self._numeric(op, text)
        return FORMATS[op.options["rewrite"]](name, text)

    # ------------------------------------------------------------------------------------------ tables
    @staticmethod
    def _table(op: Operator) -> list[tuple[re.Pattern, Callable[[re.Match], str]]]:
        pairs, preserve = op.options["pairs"], op.options["case"] == "preserve"
        flags = re.IGNORECASE if preserve else 0
        if op.options["match"] == "pattern":
            return [(re.compile(p, flags), lambda m, v=v: m.expand(v)) for p, v in pairs.items()]
        lookup = {k.lower(): v for k, v in pairs.items()} if preserve else pairs
        keys = sorted(pairs, key=len, reverse=True)
        pattern = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, keys)) + r")(?!\w)", flags)

        def replace(m: re.Match) -> str:
            word = m.group(0)
            value = lookup[word.lower()] if preserve else lookup[word]
            if preserve and word.isupper() and len(word) > 1 and value.islower():
                return value.upper()  # HEAT -> COOL
            if preserve and word[:1].isupper() and value[:1].islower():
                return value[:1].upper() + value[1:]  # Heat -> Cool; a formula keeps its own case
            return value

        return [(pattern, replace)]

    # ------------------------------------------------------------------------------------------ numbers
    def _numeric(self, op: Operator, text: str) -> list[Span]:
        mode = op.options["mode"]
        spans = []
        for m in self.number.finditer(text):
            number = m.group(1)
            unit = m.group(3) if m.lastindex and m.lastindex >= 3 else None
            line_start = text.rfind("\n", 0, m.start()) + 1
            if not text[line_start: m.start()].strip() and text[m.end(): m.end() + 1] in (".", ")"):
                continue  # a list marker ("1.", "2)"), not a quantity
            if mode in ("unit_swap", "convert"):
                if unit is None:
                    continue
                spans.append(Span(m.start(), m.end(), op.name, self._unit_draw(op, number, m.group(2), unit)))
            elif (mode == "scale" and float(number) == 0) or (op.options.get("require_unit") and unit is None):
                continue
            else:
                spans.append(Span(m.start(1), m.end(1), op.name, self._value_draw(op, number)))
        return spans

    @staticmethod
    def _value_draw(op: Operator, number: str) -> Callable[[random.Random], str | None]:
        value, decimals = float(number), int(op.options.get("decimals", _decimals(number)))

        def draw(rng: random.Random) -> str | None:
            for _ in range(20):
                if op.options["mode"] == "scale":
                    new = value * rng.uniform(*op.options["factor"])
                else:
                    new = value + rng.uniform(*op.options["shift"])
                text = format_like(new, decimals)
                if text != number and not text.startswith("-"):
                    return text
            return None

        return draw

    def _unit_draw(self, op: Operator, number: str, space: str, unit: str) -> Callable[[random.Random], str | None]:
        units = self.spec.units[self.unit_dim[unit]]
        others = sorted(u for u in units if u != unit)

        def draw(rng: random.Random) -> str | None:
            target = rng.choice(others)
            if op.options["mode"] == "unit_swap":
                return f"{number}{space}{target}"
            scale, offset = units[unit]
            to_scale, to_offset = units[target]
            value = (float(number) * scale + offset - to_offset) / to_scale
            return f"{significant(value)}{space}{target}"

        return draw


# ------------------------------------------------------------------------------------------------ formats
def _markdown_to_plain(name: str, text: str) -> list[Span]:
    spans = []
    for pattern in (r"\*\*([^*\n]+)\*\*", r"__([^_\n]+)__", r"(?<![*\w])\*([^*\n]+)\*(?![*\w])", r"`([^`\n]+)`",
                    r"\[([^\]\n]+)\]\([^)\n]+\)"):
        spans += [Span(m.start(), m.end(), name, lambda _r, g=m.group(1): g) for m in re.finditer(pattern, text)]
    spans += [Span(m.start(), m.end(), name, lambda _r: "") for m in re.finditer(r"^#{1,6}[ \t]+", text, re.M)]
    spans += [Span(m.end(1), m.end(), name, lambda _r: "") for m in re.finditer(r"^([ \t]*)[-*+][ \t]+", text, re.M)]
    return spans


def _plain_to_markdown(name: str, text: str) -> list[Span]:
    spans = []
    lines = [(m.start(), m.group(0)) for m in re.finditer(r"^[^\n]*$", text, re.M)]
    for i, (start, line) in enumerate(lines):
        body = line.strip()
        if not body or LIST_LINE.match(line) or body.startswith(("#", "|", ">")):
            continue
        lead = len(line) - len(line.lstrip())
        if body.endswith(":") and len(body) <= 80:
            spans.append(Span(start + lead, start + len(line.rstrip()), name, lambda _r, b=body: f"**{b}**"))
        elif (i > 0 and lines[i - 1][1].strip()) or (i + 1 < len(lines) and lines[i + 1][1].strip()):
            spans.append(Span(start + lead, start + lead, name, lambda _r: "- "))
    return spans


def _list_order(name: str, text: str) -> list[Span]:
    """Each block of two or more consecutive list lines, its items drawn in another order (numbers stay put)."""
    spans, block = [], []
    matches = list(LIST_LINE.finditer(text))
    for m in matches + [None]:
        if m is not None and block and m.start() == block[-1].end() + 1 and m.group(1) == block[-1].group(1):
            block.append(m)
            continue
        if len(block) >= 2 and len({b.group(3) for b in block}) > 1:
            spans.append(Span(block[0].start(), block[-1].end(), name, _shuffled(block)))
        block = [m] if m is not None else []
    return spans


def _shuffled(block: list[re.Match]) -> Callable[[random.Random], str | None]:
    def draw(rng: random.Random) -> str | None:
        bodies = [b.group(3) for b in block]
        order = bodies[:]
        while order == bodies:
            rng.shuffle(order)
        return "\n".join(f"{b.group(1)}{b.group(2)} {body}" for b, body in zip(block, order))

    return draw


def _whitespace(name: str, text: str) -> list[Span]:
    spans = [Span(m.start(), m.end(), name, lambda _r: " ") for m in re.finditer(r"(?<=\S)[ \t]{2,}(?=\S)", text)]
    spans += [Span(m.start(), m.end(), name, lambda _r: "") for m in re.finditer(r"[ \t]+$", text, re.M)]
    spans += [Span(m.start(), m.end(), name, lambda _r: "\n") for m in re.finditer(r"\n{3,}", text)]
    spans += [Span(m.start(), m.end(), name, lambda _r: "\n\n")
              for m in re.finditer(r"(?<=[.:;!?])\n(?=[^\n])", text)]
    return spans


def _number_format(name: str, text: str) -> list[Span]:
    spans = []
    for m in re.finditer(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d{4,})(\.\d+)?(?![\w,]|\.\d)", text):
        whole = m.group(1)
        new = whole.replace(",", "") if "," in whole else f"{int(whole):,}"
        spans.append(Span(m.start(1), m.end(1), name, lambda _r, n=new: n))
    return spans


FORMATS: dict[str, Callable[[str, str], list[Span]]] = {
    "markdown_to_plain": _markdown_to_plain, "plain_to_markdown": _plain_to_markdown, "list_order": _list_order,
    "whitespace": _whitespace, "number_format": _number_format,
}
