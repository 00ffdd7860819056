"""Rule operators: table substitutions, numeric perturbations and format rewrites, without a model.

Every rule operator lists the spans of a text it could edit (`Span`: where, what is there, how to draw the
replacement); a set at a rate picks a share of the spans of all its operators (`pick`: the rate times the eligible
spans, at least one, drawn with the item's seeded generator), and `apply` makes the picked edits, returning the new
text and one `Change` per edit (kind, before, after, position in the source text).

    rules = Rules(spec)
    spans = rules.spans("element_substitution", text)
    new_text, changes = apply(text, pick(spans, 0.05, rng), rng)     # judgetrain.perturb.edits

The format rewrites live in `judgetrain.perturb.formats`.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Callable

from judgetrain.perturb.edits import Aimed, Span
from judgetrain.perturb.formats import FORMATS
from judgetrain.perturb.pool import Pool, balanced, order_spans
from judgetrain.perturb.spec import Operator, Spec

# ------------------------------------------------------------------------------------------------ numbers
MINUS = "-\u2212"  # ASCII hyphen-minus and the Unicode minus sign
_NUM = r"[-\u2212]?\d+(?:\.\d+)?(?:[eE][-\u2212+]?\d+|[ \t]?[×x][ \t]?10\^[-\u2212+]?\d+)?"
_SP = "[ \t\u00a0\u202f]"


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
            return sign + self._scientific(mantissa, power, _exact_decimals(mantissa, self.figures - 1))
        if decimals is None:
            decimals = self.figures - 1 - (math.floor(math.log10(value)) if value else 0)
            if resolution:
                decimals = max(decimals, math.ceil(-math.log10(resolution) - 1e-9))
            decimals = _exact_decimals(value, decimals)
        text = f"{value:.{max(0, decimals)}f}"
        return sign + text if float(text) else text

    def write_alike(self, value: float) -> str:
        """``value`` in this number's notation and style: scientific at this mantissa's decimals where this one is
        (3.2×10^-3 x 3 is 9.6×10^-3, never 0.0096), else at this number's decimals (or its significant figures,
        where those decimals round it to zero); an edited number shows no other style than its source's."""
        if not self.exponent or not value:
            text = self.write(value, self.decimals)
            return text if Number.parse(text).value else self.write(value)
        sign, value = (self.minus if value < 0 else ""), abs(value)
        power = math.floor(math.log10(value))
        mantissa = round(value / 10.0 ** power, self.decimals)
        if mantissa >= 10:
            mantissa, power = round(mantissa / 10, self.decimals), power + 1
        return sign + self._scientific(mantissa, power, self.decimals)

    def _scientific(self, mantissa: float, power: int, decimals: int) -> str:
        return f"{mantissa:.{decimals}f}{self.exponent}{self.minus if power < 0 else ''}{abs(power)}"


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



_LABEL = re.compile(r"(?i)\b(?:step|stage|figure|fig\.|table|section|part|example|entry|scheme|item|no\.|run)"
                    r"[ \t\u00a0]*\Z")
_DIFFERENCE = re.compile(r"by|within|differ\w*|chang\w*|ris(?:e|es|en|ing)|rose|rais\w*|increas\w*|decreas\w*|"
                         r"drop\w*|fall|falls|fell|delta|gap|span|toleranc\w*|deviation|uncertainty|accuracy|precision|error|"
                         r"variation")
_ABSOLUTE = ("to", "from", "at", "than")  # among the three words before a quantity: a value (rise to 80 °C)
_JOINS = ("between", "and", "or")  # just before it: a value (between 20 and 30 °C)
# what the quantity is called, further back in its clause: the difference between the two baths was 15 K
_DIFFERENCE_NOUN = re.compile(r"differences?|changes?|rises?|drops?|gaps?|tolerances?|delta|increases?|decreases?|"
                              r"deviations?|variations?")


def marked_difference(text: str, start: int) -> str | None:
    """Whether the quantity at ``start`` is a difference, not a value: ``"tolerance"`` (``±`` or ``+/-`` standing
    before it: within ±2 °C), ``"difference"`` (one of the three words before it in its clause says so: by 10 °C, a
    rise of 5 °C; a word such as "to" or "from" nearer to it, or "between", "and" or "or" just before it, says it is a
    value: rise to 80 °C; or, with none of those among the three, one of the twelve words before it names it a
    difference, change, rise, drop, gap or tolerance: the difference between the two baths was 15 K), else None."""
    before = text[max(0, start - 160): start]
    if re.search(r"(?:±|\+/-)[ \t\u00a0\u202f]?\Z", before):
        return "tolerance"
    clause = re.split(r"[.;:!?\n\d]", before)[-1]
    words = [w.lower() for w in reversed(re.findall(r"[^\W\d_]+", clause)[-12:])]
    for k, word in enumerate(words[:3]):
        if word in _ABSOLUTE or (k == 0 and word in _JOINS):
            return None
        if _DIFFERENCE.fullmatch(word):
            return "difference"
    return "difference" if any(_DIFFERENCE_NOUN.fullmatch(w) for w in words[3:]) else None


class Rules:
    """The compiled rule operators of a spec (patterns built once, for every text)."""

    read = staticmethod(read_quantity)

    def __init__(self, spec: Spec, texts: list[str] = ()):
        """``texts``: every source text of the run, what the swap, borrow and pooled unit_swap operators draw from
        (`judgetrain.perturb.pool`)."""
        self.spec = spec
        self.unit_dim = {u: d for d, units in spec.units.items() for u in units}
        self.quantity = quantity_pattern(list(self.unit_dim))
        self.compiled: dict[str, list[tuple[re.Pattern, Callable[[re.Match], str]]]] = {}
        for op in spec.operators.values():
            if op.kind == "table":
                self.compiled[op.name] = self._table(op)
        self.pool = Pool(self, list(texts))

    def spans(self, name: str, text: str) -> list[Span]:
        """The spans operator ``name`` could edit in ``text``, and those it leaves alone (``skip``: why)."""
        op = self.spec.operators[name]
        if op.kind == "table":
            return [Span(m.start(), m.end(), name, lambda _rng, m=m, f=f: f(m))
                    for pattern, f in self.compiled[name] for m in pattern.finditer(text)]
        if op.kind == "numeric":
            return self._numeric(op, text)
        if op.kind == "swap":
            return self._swap(op, text)
        if op.kind == "order":
            return order_spans(name, text)
        return FORMATS[op.options["rewrite"]](name, text)

    def _swap(self, op: Operator, text: str) -> list[Span]:
        """A word of a class replaced by another of its class, as the text would write it, drawn from what the other
        sources hold (`Pool`)."""
        preserve, spans = op.options["case"] == "preserve", []
        for terms in op.options["classes"]:
            pattern = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, sorted(terms, key=len, reverse=True)))
                                 + r")(?!\w)", re.IGNORECASE if preserve else 0)
            for m in pattern.finditer(text):
                word = m.group(0)
                key = next((t for t in terms if t.casefold() == word.casefold()), word) if preserve else word
                start = sentence_start(text, m.start())
                written = [cased(word, key, t, start) if preserve else t for t in terms if t != key]
                spans.append(_drawn(m, op.name, self.pool.draw(written, self.pool.forms, text, word)))
        return spans

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
            needs_unit = mode in ("unit_swap", "convert") or op.options.get("require_unit", True)
            if q.other or (needs_unit and q.unit is None):
                if q.other:
                    spans.append(Span(m.start(), m.end(), op.name, lambda _r: None, q.other))
                continue
            difference = marked_difference(text, m.start()) if q.unit and self._offset(q.unit) else None
            why = "compound_unit" if q.unit and text[m.end(): m.end() + 1] == "/" else \
                "label" if q.unit is None and _LABEL.search(text[max(0, m.start() - 20): m.start()]) else \
                None if difference else self._unphysical(q, [n.value for n in q.numbers], q.unit)
            if why:  # 5 °C/min: a rate; Step 2: a label (by 10 °C: a difference, converted as one)
                spans.append(Span(m.start(), m.end(), op.name, lambda _r: None, why))
            elif mode == "unit_swap" and op.options.get("pool"):
                spans.append(_drawn(m, op.name, self._pooled_unit(q, m.group(0), text)))
            elif mode in ("unit_swap", "convert"):
                if len(self.spec.units[self.unit_dim[q.unit]]) > 1:
                    spans.append(Span(m.start(), m.end(), op.name, self._unit_draw(op, q, difference is not None)))
            elif mode == "borrow":
                spans.append(_drawn(m, op.name, self.pool.borrow_draw(q, m.group(0), text)))
            elif mode == "scale" and all(n.value == 0 for n in q.numbers):
                spans.append(Span(m.start(), m.end(), op.name, lambda _r: None, "zero"))
            else:
                spans.append(Span(m.start(), m.end(), op.name, self._value_draw(op, q, difference is not None)))
        return spans

    def _pooled_unit(self, q: Quantity, written: str, text: str) -> Aimed | None:
        """Another unit of the dimension that other sources write, the number unconverted (an error), drawn by
        `judgetrain.perturb.pool.balanced`; a unit where the value would be below absolute zero is not drawn."""
        others = [u for u in sorted(self.spec.units[self.unit_dim[q.unit]]) if u != q.unit
                  and not self._unphysical(q, [n.value for n in q.numbers], u)]
        return balanced([q.write([n.text for n in q.numbers], q.tolerance and q.tolerance.text, u) for u in others],
                        [self.pool.unit_weight(u, text) for u in others], written)

    def _offset(self, unit: str) -> bool:
        """Whether ``unit``'s dimension has units with an offset (a temperature): its differences convert apart."""
        return any(offset for _, offset in self.spec.units[self.unit_dim[unit]].values())

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

    def _value_draw(self, op: Operator, q: Quantity, difference: bool = False) -> Callable[[random.Random], str | None]:
        """A scaled (one factor for a range's ends) or shifted value, written in the source's notation at its
        decimals (`Number.write_alike`; the spec's ``decimals`` where it sets them): never the source's value after
        rounding, never zero, never of the other sign, never below absolute zero (a difference aside); None when 20
        draws find none."""
        decimals = op.options.get("decimals")

        def draw(rng: random.Random) -> str | None:
            for _ in range(20):
                if op.options["mode"] == "scale":
                    factor = rng.uniform(*op.options["factor"])
                    new = [n.value * factor for n in q.numbers]
                else:
                    shift = rng.uniform(*op.options["shift"])
                    new = [n.value + shift for n in q.numbers]
                written = [n.write_alike(v) if decimals is None else n.write(v, decimals) for n, v in zip(q.numbers, new)]
                written = [t if Number.parse(t).value else n.write(v) for t, n, v in zip(written, q.numbers, new)]
                values = [Number.parse(t).value for t in written]
                if any(v == 0 or (v < 0) != (n.value < 0) for v, n in zip(values, q.numbers)) \
                        or all(v == n.value for v, n in zip(values, q.numbers)) \
                        or (not difference and self._unphysical(q, values, q.unit)):
                    continue
                return q.write(written, q.tolerance and q.tolerance.text, q.unit)
            return None

        return draw

    def _unit_draw(self, op: Operator, q: Quantity, difference: bool = False) -> Callable[[random.Random], str | None]:
        """Another unit of the dimension: without converting (unit_swap: an error; a unit where the value would be
        below absolute zero is not drawn), or converted, every number at the source's significant figures and a
        tolerance, or a quantity that is one (``difference``: ``±2 °C`` standing alone, ``a rise of 10 °C``), as a
        difference (no offset: 2 °C is 2 K and 3.6 °F)."""
        units = self.spec.units[self.unit_dim[q.unit]]
        scale, offset = units[q.unit]
        offset = 0.0 if difference else offset

        def draw(rng: random.Random) -> str | None:
            others = sorted(u for u in units if u != q.unit)
            if op.options["mode"] == "unit_swap":  # a difference's unit of the same scale is no error: 2 °C is 2 K
                others = [u for u in others if not math.isclose(units[u][0], scale)] if difference else \
                    [u for u in others if not self._unphysical(q, [n.value for n in q.numbers], u)]
                if not others:
                    return None
                return q.write([n.text for n in q.numbers], q.tolerance and q.tolerance.text, rng.choice(others))
            target = rng.choice(others)
            to_scale, to_offset = units[target][0], 0.0 if difference else units[target][1]
            numbers = [n.write((n.value * scale + offset - to_offset) / to_scale, resolution=n.step() * scale / to_scale)
                       for n in q.numbers]
            tolerance = None if q.tolerance is None else q.tolerance.write(
                q.tolerance.value * scale / to_scale, resolution=q.tolerance.step() * scale / to_scale)
            return q.write(numbers, tolerance, target)

        return draw


def _drawn(m: re.Match, name: str, draw: Aimed | None) -> Span:
    """The span of ``m`` drawn by ``draw``; left alone (``unused_elsewhere``) where no other source holds any
    replacement."""
    if draw is None:
        return Span(m.start(), m.end(), name, lambda _r: None, "unused_elsewhere")
    return Span(m.start(), m.end(), name, draw)


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
