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



@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: str  # the operator's name
    draw: Callable[[random.Random], str | None]  # the replacement (None: nothing different to write)
    skip: str | None = None  # why this span is left alone (a percentage, below absolute zero): counted, never picked


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
    spans = [s for s in spans if s.skip is None]
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
MINUS = "-\u2212"  # ASCII hyphen-minus and the Unicode minus sign
_NUM = r"[-\u2212]?\d+(?:\.\d+)?(?:[eE][-\u2212+]?\d+|[ \t]?[×x][ \t]?10\^[-\u2212+]?\d+)?"
_SP = "[ \t\u00a0\u202f]"
LIST_LINE = re.compile(r"^([ \t]*)([-*+]|\d+[.)])[ \t]+(.*)$", re.M)


@dataclass(frozen=True)
class Number:
    """One written number: its value, the decimals and significant figures it shows, and how it is written (its
    minus sign, plain or scientific: ``3.2e-3``, ``3.2×10^-3``)."""

    text: str
    value: float
    decimals: int  # of the mantissa
    figures: int  # significant figures
    minus: str
    exponent: str | None  # the text between mantissa and power ("e", "×10^"); None: plain
    power: int = 0  # of ten, in scientific notation

    def step(self) -> float:
        """The worth of the last digit written (the number's resolution)."""
        return 10.0 ** (self.power - self.decimals)

    @classmethod
    def parse(cls, text: str) -> "Number":
        sci = re.search(r"[eE]|[ \t]?[×x][ \t]?10\^", text)
        mantissa, power = (text[: sci.start()], text[sci.end():]) if sci else (text, "0")
        digits = mantissa.lstrip(MINUS)
        value = float(digits) * 10.0 ** int(power.replace("\u2212", "-"))
        minus = mantissa[0] if mantissa[:1] in MINUS else ("\u2212" if "\u2212" in power else "-")
        return cls(text, -value if mantissa[:1] in MINUS else value,
                   len(digits.split(".", 1)[1]) if "." in digits else 0,
                   max(1, len(digits.replace(".", "").lstrip("0"))), minus, sci.group(0) if sci else None,
                   int(power.replace("\u2212", "-")))

    def write(self, value: float, decimals: int | None = None, resolution: float | None = None) -> str:
        """``value`` written like this number (its minus sign; scientific where this one is and the value is
        outside [0.001, 10000)): with ``decimals`` decimals, else with this number's significant figures, and at
        least the decimals that keep ``resolution`` (the source's last digit, in this unit: 15 min is 0.0104 d,
        not 0.010 d), widened by up to three decimals where that writes the value exactly (25 °C is 298.15 K, not
        298.1 K)."""
        sign, value = (self.minus if value < 0 else ""), abs(value)
        if decimals is None and self.exponent and value and not 1e-3 <= value < 1e4:
            power = math.floor(math.log10(value))
            mantissa = value / 10.0 ** power
            d = _exact_decimals(mantissa, self.figures - 1)
            return f"{sign}{mantissa:.{d}f}{self.exponent}{self.minus if power < 0 else ''}{abs(power)}"
        if decimals is None:
            decimals = self.figures - 1 - (math.floor(math.log10(value)) if value else 0)
            if resolution:
                decimals = max(decimals, math.ceil(-math.log10(resolution) - 1e-9))
            decimals = _exact_decimals(value, decimals)
        text = f"{value:.{max(0, decimals)}f}"
        return sign + text if float(text) else text


def _exact_decimals(value: float, decimals: int) -> int:
    decimals = max(0, decimals)
    for d in range(decimals, decimals + 4):
        if abs(round(value, d) - value) <= 1e-9 * max(1.0, abs(value)):
            return d
    return decimals


@dataclass(frozen=True)
class Quantity:
    """A quantity as the numeric operators read it: one number, a range (``60-80``, ``60 to 80``, ``60–80``) or a
    value and its tolerance (``25 ± 2``), and the unit written after it (None: a bare number); ``other``: why it is
    not a quantity to edit ("percentage", "ratio"), or None."""

    numbers: tuple[Number, ...]  # one, or a range's two ends
    tolerance: Number | None
    separator: str  # between a range's ends, or before the tolerance
    space: str  # before the unit
    unit: str | None
    other: str | None

    def write(self, numbers: list[str], tolerance: str | None, unit: str | None) -> str:
        text = self.separator.join(numbers)
        if tolerance is not None:
            text += self.separator + tolerance
        return text + (f"{self.space}{unit}" if unit else "")


def quantity_pattern(units: list[str]) -> re.Pattern:
    """Numbers (a sign, ASCII or Unicode minus; decimals; scientific), ranges and tolerances, with the unit of
    ``units`` written after them; a number glued to a word, a formula or a chain such as a CAS number
    (``7647-14-5``) is none."""
    unit_re = "|".join(map(re.escape, sorted(units, key=len, reverse=True)))
    unit = rf"(?:(?P<space>{_SP}?)(?P<unit>{unit_re})(?!\w))?" if units else ""
    return re.compile(
        rf"(?<![\w.,:/\-\u2212])(?P<a>{_NUM})"
        rf"(?:(?P<rsep>{_SP}?[-–—]{_SP}?|{_SP}to{_SP})(?P<b>{_NUM})|(?P<tsep>{_SP}?(?:±|\+/-){_SP}?)"
        rf"(?P<tol>\d+(?:\.\d+)?))?{unit}(?![\w]|[.,/\-\u2212–]\d)(?P<other>{_SP}?(?:wt|mol|vol|at)?{_SP}?%|:(?=\d))?")


def read_quantity(m: re.Match) -> Quantity:
    numbers = tuple(Number.parse(m.group(g)) for g in ("a", "b") if m.group(g))
    other = m.group("other")
    return Quantity(numbers, Number.parse(m.group("tol")) if m.group("tol") else None,
                    m.group("rsep") or m.group("tsep") or "", (m.groupdict().get("space") or ""),
                    m.groupdict().get("unit"), None if not other else "ratio" if other == ":" else "percentage")



class Rules:
    """The compiled rule operators of a spec (patterns built once, for every text)."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.unit_dim = {u: d for d, units in spec.units.items() for u in units}
        self.quantity = quantity_pattern(list(self.unit_dim))
        self.compiled: dict[str, list[tuple[re.Pattern, Callable[[re.Match], str]]]] = {}
        for op in spec.operators.values():
            if op.kind == "table":
                self.compiled[op.name] = self._table(op)

    def spans(self, name: str, text: str) -> list[Span]:
        """The spans operator ``name`` could edit in ``text``, and those it leaves alone (``skip``: why)."""
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
        folded = {k.casefold(): k for k in pairs}
        keys = sorted(pairs, key=len, reverse=True)
        pattern = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, keys)) + r")(?!\w)", flags)

        def replace(m: re.Match) -> str:
            word = m.group(0)
            if not preserve:
                return pairs[word]
            key = folded.get(word.casefold()) or next(  # İRON, Diſſolve: matched, but fold to other letters
                k for k in keys if re.fullmatch(re.escape(k), word, re.IGNORECASE))
            return cased(word, key, pairs[key], sentence_start(m.string, m.start()))

        return [(pattern, replace)]

    # ------------------------------------------------------------------------------------------ numbers
    def _numeric(self, op: Operator, text: str) -> list[Span]:
        mode, spans = op.options["mode"], []
        for m in self.quantity.finditer(text):
            q = read_quantity(m)
            line_start = text.rfind("\n", 0, m.start()) + 1
            if len(q.numbers) == 1 and q.tolerance is None and not text[line_start: m.start()].strip() \
                    and text[m.end(): m.end() + 1] in (".", ")"):
                continue  # a list marker ("1.", "2)"), not a quantity
            needs_unit = mode in ("unit_swap", "convert") or op.options.get("require_unit")
            if q.other or (needs_unit and q.unit is None):
                if q.other:
                    spans.append(Span(m.start(), m.end(), op.name, lambda _r: None, q.other))
                continue
            why = "compound_unit" if q.unit and text[m.end(): m.end() + 1] == "/" else \
                self._unphysical(q, [n.value for n in q.numbers], q.unit)  # 5 °C/min: a rate, not a temperature
            if why:
                spans.append(Span(m.start(), m.end(), op.name, lambda _r: None, why))
            elif mode in ("unit_swap", "convert"):
                if len(self.spec.units[self.unit_dim[q.unit]]) > 1:
                    spans.append(Span(m.start(), m.end(), op.name, self._unit_draw(op, q)))
            elif mode == "scale" and all(n.value == 0 for n in q.numbers):
                spans.append(Span(m.start(), m.end(), op.name, lambda _r: None, "zero"))
            else:
                spans.append(Span(m.start(), m.end(), op.name, self._value_draw(op, q)))
        return spans

    def _unphysical(self, q: Quantity, values: list[float], unit: str | None) -> str | None:
        """Why ``values`` in ``unit`` make no physical sense (below absolute zero: a temperature's base value, its
        offset unit's zero, under 0); None when they do."""
        if unit is None:
            return None
        units = self.spec.units[self.unit_dim[unit]]
        if any(offset for _, offset in units.values()):
            scale, offset = units[unit]
            if any(v * scale + offset < 0 for v in values):
                return "below_absolute_zero"
        return None

    def _value_draw(self, op: Operator, q: Quantity) -> Callable[[random.Random], str | None]:
        """A scaled (one factor for a range's ends) or shifted value, written at the source's decimals (or its
        significant figures, where those decimals round it to zero): never the source's value after rounding, never
        zero, never of the other sign, never below absolute zero; None when 20 draws find none."""
        decimals = op.options.get("decimals")

        def draw(rng: random.Random) -> str | None:
            for _ in range(20):
                if op.options["mode"] == "scale":
                    factor = rng.uniform(*op.options["factor"])
                    new = [n.value * factor for n in q.numbers]
                else:
                    shift = rng.uniform(*op.options["shift"])
                    new = [n.value + shift for n in q.numbers]
                written = []
                for n, v in zip(q.numbers, new):
                    text = n.write(v, n.decimals if decimals is None and not n.exponent else decimals)
                    if float(Number.parse(text).value) == 0:
                        text = n.write(v)  # 1 h x 0.25: 0.25 h, not 0 h
                    written.append(text)
                values = [Number.parse(t).value for t in written]
                if any(v == 0 or (v < 0) != (n.value < 0) for v, n in zip(values, q.numbers)) \
                        or all(v == n.value for v, n in zip(values, q.numbers)) \
                        or self._unphysical(q, values, q.unit):
                    continue
                return q.write(written, q.tolerance and q.tolerance.text, q.unit)
            return None

        return draw

    def _unit_draw(self, op: Operator, q: Quantity) -> Callable[[random.Random], str | None]:
        """Another unit of the dimension: without converting (unit_swap: an error; a unit where the value would be
        below absolute zero is not drawn), or converted, every number at the source's significant figures and a
        tolerance as a difference (no offset)."""
        units = self.spec.units[self.unit_dim[q.unit]]
        scale, offset = units[q.unit]

        def draw(rng: random.Random) -> str | None:
            others = sorted(u for u in units if u != q.unit)
            if op.options["mode"] == "unit_swap":
                others = [u for u in others if not self._unphysical(q, [n.value for n in q.numbers], u)]
                if not others:
                    return None
                return q.write([n.text for n in q.numbers], q.tolerance and q.tolerance.text, rng.choice(others))
            target = rng.choice(others)
            to_scale, to_offset = units[target]
            numbers = [n.write((n.value * scale + offset - to_offset) / to_scale, resolution=n.step() * scale / to_scale)
                       for n in q.numbers]
            tolerance = None if q.tolerance is None else q.tolerance.write(
                q.tolerance.value * scale / to_scale, resolution=q.tolerance.step() * scale / to_scale)
            return q.write(numbers, tolerance, target)

        return draw


def sentence_start(text: str, at: int) -> bool:
    """Whether ``at`` begins a sentence: the text's or a line's start (after a list marker or heading), or after
    ``.``, ``!``, ``?`` and a space."""
    return re.search(r"(?:\A|\n)[ \t]*(?:[-*+>#]+[ \t]+|\d+[.)][ \t]+)?\Z|[.!?][ \t]+\Z", text[max(0, at - 200): at]) \
        is not None


def cased(word: str, key: str, value: str, at_sentence_start: bool) -> str:
    """``value`` in the case ``word`` (a match of the table's ``key``) is written in, so the edit cannot be told
    by its casing: HEAT -> COOL; Heat at a sentence's start -> Cool; a key capitalised as a name (Teflon-lined
    autoclave) mid-sentence -> the value as the table writes it (open beaker); a value with its own capitals (a
    formula) as it is."""
    own_case = value != value.lower()
    if word.isupper() and len(word) > 1 and not key.isupper():
        return value if own_case else value.upper()
    if value[:1].islower() and word[:1].isupper() and (at_sentence_start or not key[:1].isupper()):
        return value[:1].upper() + value[1:]
    return value


# ------------------------------------------------------------------------------------------------ formats
_PROTECTED = re.compile(
    r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)"  # fenced code blocks (to their fence or the end)
    r"|(`+)(?!`)[^\n]*?(?<!`)\2(?!`)"  # inline code
    r"|\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)|(?<![\w$])\$(?=\S)[^$\n]+?(?<=\S)\$(?![\w$])"  # math
    r"|(?<![\w.])(?=[\w.]*_)[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\(\))?"  # identifiers: snake_case, __init__
    r"|(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\(\)", re.S | re.M)


def protected(text: str) -> list[tuple[int, int]]:
    """Where format rewrites never go: code blocks, inline code, math and identifiers (``__init__``,
    ``snake_case``, ``f()``), as (start, end)."""
    return [m.span() for m in _PROTECTED.finditer(text)]


def _outside(spans: list[Span], text: str) -> list[Span]:
    """``spans`` that touch no protected region of ``text``."""
    regions = protected(text)
    return [s for s in spans if not any(s.start < e and b < max(s.end, s.start + 1) for b, e in regions)]


def _markdown_to_plain(name: str, text: str) -> list[Span]:
    """Emphasis markers (CommonMark's rule: an opening marker before a non-space, a closing one after one, never
    inside a word), headings' and bullets' markers removed; a link written as its text and its address."""
    spans = []
    for pattern in (r"(?<![*\w])\*\*(?=\S)([^*\n]+?)(?<=\S)\*\*(?![*\w])", r"(?<![_\w])__(?=\S)([^_\n]+?)(?<=\S)__(?![_\w])",
                    r"(?<![*\w])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![*\w])",
                    r"(?<![_\w])_(?=[^\s_])([^_\n]+?)(?<=[^\s_])_(?![_\w])"):
        spans += [Span(m.start(), m.end(), name, lambda _r, g=m.group(1): g) for m in re.finditer(pattern, text)]
    spans += [Span(m.start(), m.end(), name, lambda _r, t=m.group(1), u=m.group(2): f"{t} ({u})")
              for m in re.finditer(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)\)", text)]
    spans += [Span(m.start(), m.end(), name, lambda _r: "") for m in re.finditer(r"^#{1,6}[ \t]+", text, re.M)]
    spans += [Span(m.end(1), m.end(), name, lambda _r: "") for m in re.finditer(r"^([ \t]*)[-*+][ \t]+(?=\S)", text, re.M)]
    return _outside(spans, text)


def _plain_to_markdown(name: str, text: str) -> list[Span]:
    spans = []
    lines = [(m.start(), m.group(0)) for m in re.finditer(r"^[^\n]*$", text, re.M)]
    for i, (start, line) in enumerate(lines):
        body = line.strip()
        if not body or LIST_LINE.match(line) or body.startswith(("#", "|", ">", "*", "_", "`", "$")):
            continue
        lead = len(line) - len(line.lstrip())
        if lead >= 4:
            continue  # an indented code block
        if body.endswith(":") and len(body) <= 80 and "*" not in body:
            spans.append(Span(start + lead, start + len(line.rstrip()), name, lambda _r, b=body: f"**{b}**"))
        elif (i > 0 and lines[i - 1][1].strip()) or (i + 1 < len(lines) and lines[i + 1][1].strip()):
            spans.append(Span(start + lead, start + lead, name, lambda _r: "- "))
    return _outside(spans, text)


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
    return _outside(spans, text)


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
    return _outside(spans, text)


def _number_format(name: str, text: str) -> list[Span]:
    spans = []
    for m in re.finditer(r"(?<![\w.,:/#\u2212-])(\d{1,3}(?:,\d{3})+|\d{4,})(\.\d+)?(?![\w,:/\u2212-]|\.\d)", text):
        whole = m.group(1)
        if "," not in whole and len(whole) == 4 and 1000 <= int(whole) <= 2100 and \
                re.search(r"(?:\b(?:in|since|by|until|from|to|year|of)|[©(])[ \t]*\Z", text[max(0, m.start() - 12): m.start()], re.I):
            continue  # a year ("in 2023", "(2021)") is written without a separator
        new = whole.replace(",", "") if "," in whole else f"{int(whole):,}"
        spans.append(Span(m.start(1), m.end(1), name, lambda _r, n=new: n))
    return _outside(spans, text)


FORMATS: dict[str, Callable[[str, str], list[Span]]] = {
    "markdown_to_plain": _markdown_to_plain, "plain_to_markdown": _plain_to_markdown, "list_order": _list_order,
    "whitespace": _whitespace, "number_format": _number_format,
}
