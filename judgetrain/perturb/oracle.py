"""The checks' own reading of a text: every quantity back to its base unit, and the text outside markup, token by
token. Written apart from the operators (a character scanner, not their patterns), so an operator that misreads a
quantity is caught by a reader that does not share its mistake.

    readings = read_quantities("at -20 °C for 60-80 min", spec.units)
    lost, new = differ(readings, read_quantities(copy, spec.units))   # what the copy lost and what it added
    markup_tokens(text)                                                 # the words a format rewrite must keep

A reading is one number: a bare number, a percentage, a quantity with a unit of the spec (its value in the base
unit), each end of a range, a tolerance (a difference: scale, no offset), or a chain such as a CAS number or a date
(compared as written). Two readings are the same quantity when their dimensions agree and their values differ by at
less than half the last written digit of the finer of the two (298.15 K for 25 °C, not 298.1 K; 37.8 °C for 100 °F).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_SPACES = " \t\u00a0\u202f"
_MINUS = "-\u2212"
_DASHES = "-\u2013\u2014"


@dataclass(frozen=True)
class Reading:
    dim: str  # a dimension of the spec's units, "±<dim>" (a tolerance), "number", "%", "chain"
    value: float  # in the dimension's base unit
    step: float  # the last written digit's worth, in the base unit
    text: str  # as written (with its unit)

    def __str__(self) -> str:
        return self.text


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


class _Scanner:
    def __init__(self, text: str, units: dict[str, dict[str, tuple[float, float]]]):
        self.text, self.n = text, len(text)
        self.units = sorted(((u, d, conv) for d, us in units.items() for u, conv in us.items()),
                            key=lambda x: -len(x[0]))

    def at(self, i: int) -> str:
        return self.text[i] if 0 <= i < self.n else "\x00"

    def number(self, i: int) -> tuple[int, float, float] | None:
        """(end, value, step) of the number starting at ``i`` (its sign included), or None."""
        t, j, sign = self.text, i, 1.0
        if self.at(j) in _MINUS:
            sign, j = -1.0, j + 1
        if not self.at(j).isdigit():
            return None
        k = j
        while self.at(k).isdigit():
            k += 1
        while self.at(k) == "," and t[k + 1: k + 4].isdigit() and not self.at(k + 4).isdigit() and k - j <= 3 + 4 * 9:
            k += 4  # a thousands separator: 2,000
        decimals = 0
        if self.at(k) == "." and self.at(k + 1).isdigit():
            k += 1
            while self.at(k).isdigit():
                k, decimals = k + 1, decimals + 1
        mantissa, power = float(t[j:k].replace(",", "")), 0
        e = k
        if self.at(e) in "eE":
            e += 1
        else:
            e += 1 if self.at(e) in _SPACES else 0
            if self.at(e) in "×x":
                e += 1
                e += 1 if self.at(e) in _SPACES else 0
                e = e + 3 if t[e: e + 3] == "10^" else -1
            else:
                e = -1
        if e > 0:
            s = e + (1 if self.at(e) in _MINUS + "+" else 0)
            d = s
            while self.at(d).isdigit():
                d += 1
            if d > s:
                power = int(t[s:d]) * (-1 if self.at(e) in _MINUS else 1)
                k = d
        return k, sign * mantissa * 10.0 ** power, 10.0 ** (power - decimals)

    def unit(self, i: int) -> tuple[int, str, str, tuple[float, float]] | None:
        j = i + 1 if self.at(i) in _SPACES else i
        for u, dim, conv in self.units:
            if self.text.startswith(u, j) and not _is_word(self.at(j + len(u))):
                return j + len(u), u, dim, conv
        return None

    def read(self) -> list[Reading]:
        out: list[Reading] = []
        i = 0
        while i < self.n:
            c = self.at(i)
            start_ok = not (_is_word(self.at(i - 1)) or self.at(i - 1) in ".,:/")
            signed = c in _MINUS and self.at(i + 1).isdigit() and start_ok
            if not (c.isdigit() or signed) or not start_ok:
                if _is_word(c):  # a word, a formula (K2CO3), an identifier: nothing to read inside it
                    while i < self.n and (_is_word(self.at(i)) or (self.at(i) == "." and _is_word(self.at(i + 1)))):
                        i += 1
                    continue
                i += 1
                continue
            i = self._quantity(i, out)
        return out

    def _quantity(self, i: int, out: list[Reading]) -> int:
        first = self.number(i)
        end, value, step = first
        parts, seps = [(i, end, value, step)], []
        while True:  # a range's second end, or a chain (7647-14-5, 2023-01-05)
            j = end
            sep_end = None
            if self.at(j) in _DASHES and self.at(j + 1).isdigit():
                sep_end = j + 1
            elif self.at(j) in _SPACES and self.at(j + 1) in _DASHES + "t" and \
                    (self.text.startswith("to", j + 1) and self.at(j + 3) in _SPACES or
                     self.at(j + 1) in _DASHES and self.at(j + 2) in _SPACES):
                sep_end = j + (4 if self.at(j + 1) == "t" else 3)
            elif self.at(j) in _DASHES and self.at(j + 1) in _SPACES and self.at(j + 2).isdigit() and not seps:
                sep_end = j + 2
            if sep_end is None:
                break
            nxt = self.number(sep_end)
            if nxt is None:
                break
            parts.append((sep_end, nxt[0], nxt[1], nxt[2]))
            seps.append(self.text[j:sep_end])
            end = nxt[0]
        ratio = self.at(end) in ":/" and self.at(end + 1).isdigit()
        if len(parts) > 2 or ratio or _is_word(self.at(end)) and self.unit(end) is None:
            while _is_word(self.at(end)) or self.at(end) in _DASHES + ":/" and self.at(end + 1).isalnum():
                end += 1  # 7647-14-5, 3rd, 5x, 1:2: written as they are
            out.append(Reading("chain", 0.0, 0.0, self.text[i:end]))
            return end
        tolerance = None
        j = end + (1 if self.at(end) in _SPACES else 0)
        if self.at(j) == "±" or self.text.startswith("+/-", j):
            k = j + (1 if self.at(j) == "±" else 3)
            k += 1 if self.at(k) in _SPACES else 0
            tol = self.number(k) if self.at(k).isdigit() else None
            if tol is not None:
                tolerance, end = tol, tol[0]
        unit = self.unit(end)
        if unit is not None and self.at(unit[0]) == "/":  # 5 °C/min, 2 mg/mL: a compound unit, read as written
            stop = unit[0] + 1
            while _is_word(self.at(stop)):
                stop += 1
            out.append(Reading("chain", 0.0, 0.0, self.text[i:stop]))
            return stop
        if unit is not None:
            stop, name, dim, (scale, offset) = unit
            text = self.text[i:stop]
            for _, _, v, s in parts:
                out.append(Reading(dim, v * scale + offset, s * scale, text))
            if tolerance is not None:
                out.append(Reading("±" + dim, tolerance[1] * scale, tolerance[2] * scale, text))
            return stop
        k = end + (1 if self.at(end) in _SPACES else 0)
        for prefix in ("wt", "mol", "vol", "at"):
            if self.text.startswith(prefix, k):
                k += len(prefix) + (1 if self.at(k + len(prefix)) in _SPACES else 0)
                break
        dim = "%" if self.at(k) == "%" else "number"
        stop = k + 1 if dim == "%" else end
        text = self.text[i:stop]
        for _, _, v, s in parts:
            out.append(Reading(dim, v, s, text))
        if tolerance is not None:
            out.append(Reading("±" + dim, tolerance[1], tolerance[2], text))
        return stop


def read_quantities(text: str, units: dict[str, dict[str, tuple[float, float]]],
                    masked: tuple[str, ...] = ()) -> list[Reading]:
    """Every reading of ``text`` (see the module doc), the words ``masked`` (whole words: the abbreviations and
    names a spec's represent tables rewrite, q4h or b.i.d.) left out."""
    for word in sorted(masked, key=len, reverse=True):
        text = re.sub(rf"(?<!\w){re.escape(word)}(?!\w)", " ", text)
    return _Scanner(text, units).read()


def same(a: Reading, b: Reading) -> bool:
    if a.dim != b.dim:
        return False
    if a.dim == "chain":
        return a.text == b.text
    # under half a step: a value exactly halfway (313.15 K written 313.1 K) could have been written exactly
    return abs(a.value - b.value) < 0.5 * min(a.step, b.step) * (1 - 1e-6) or a.value == b.value


def differ(source: list[Reading], copy: list[Reading]) -> tuple[list[Reading], list[Reading]]:
    """(the source's readings the copy does not hold, the copy's readings the source does not hold)."""
    left = list(copy)
    lost = []
    for a in source:
        k = next((k for k, b in enumerate(left) if same(a, b)), None)
        if k is None:
            lost.append(a)
        else:
            left.pop(k)
    return lost, left


# ------------------------------------------------------------------------------------------------ markup
_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.S | re.M)
_INLINE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)|\$\$.+?\$\$|(?<![\w$])\$(?=\S)[^$\n]+?(?<=\S)\$(?![\w$])", re.S)
_IDENT = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\(\))?")


def verbatim(text: str) -> list[str]:
    """What a format rewrite must keep byte for byte, in order: code blocks, inline code, math, and identifiers
    (a name holding ``_`` or written as a call)."""
    out, rest = [], text
    for pattern in (_FENCE, _INLINE):
        out += [m.group(0) for m in pattern.finditer(rest)]
        rest = pattern.sub("\x00", rest)
    out += [m.group(0) for m in _IDENT.finditer(rest) if "_" in m.group(0) or m.group(0).endswith("()")]
    return out


def markup_tokens(text: str) -> list[str]:
    """The text's tokens outside markup: code and math out; a link as its text and address; headings', bullets'
    and quotes' markers out; emphasis markers (``*``, ``_`` runs) cut from the ends of words, a lone ``*`` kept
    (2 * 3 is content); thousands separators out of numbers."""
    for pattern in (_FENCE, _INLINE):
        text = pattern.sub(" \x00 ", text)
    text = re.sub(r"\[([^\]\n]+)\]\(([^)\s]+)\)", r"\1 (\2)", text)
    text = re.sub(r"^[ \t]*(?:#{1,6}|[-*+>]|\d+[.)])[ \t]+", "", text, flags=re.M)
    out = []
    for token in text.split():
        core = token.strip("*_") if token.strip("*_") and not _IDENT.fullmatch(token) else token
        out.append(re.sub(r"(?<=\d),(?=\d{3}\b)", "", core))
    return out


def token_differences(source: str, copy: str, ordered: bool = True) -> str | None:
    """Why ``copy`` is not ``source`` with only its markup changed (None when it is): a verbatim part changed, or a
    token outside markup differs (``ordered=False``: the same tokens in any order, for a reordered list)."""
    a, b = verbatim(source), verbatim(copy)
    if a != b:
        gone = [x for x in a if x not in b][:1] or a[:1]
        return f"code, math or identifier changed: {gone[0] if gone else b[0]!r}"
    ta, tb = markup_tokens(source), markup_tokens(copy)
    if (ta != tb) if ordered else (Counter(ta) != Counter(tb)):
        for k, (x, y) in enumerate(zip(ta, tb)):
            if x != y:
                return f"token {k}: {x!r} became {y!r}"
        return f"{len(ta)} token(s) became {len(tb)}"
    return None

