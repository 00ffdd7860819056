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
# the words that make the quantity after them a difference (by 10 °C, a rise of 5 °C) or a value again (rise to 80 °C)
_DIFFERENCE_WORDS = frozenset(
    "by within difference differences differ differs differed change changes changed changing rise rises rose risen "
    "rising raise raises raised raising increase increases increased increasing decrease decreases decreased "
    "decreasing drop drops dropped dropping fall falls fell fallen delta gap span tolerance tolerances deviation "
    "deviations uncertainty accuracy precision error variation".split())
_VALUE_WORDS = frozenset("to from at than".split())
_JOIN_WORDS = frozenset("between and or".split())  # a value only just before it: between 20 and 30 °C
# what a quantity is called further back (the difference between the two baths was 15 K)
_DIFFERENCE_NOUNS = frozenset(
    "difference differences change changes rise rises drop drops gap gaps tolerance tolerances delta increase "
    "increases decrease decreases deviation deviations variation variations".split())


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

    def difference(self, i: int) -> bool:
        """Whether the quantity starting at ``i`` is a difference: ``±`` or ``+/-`` just before it; among the four
        words before it in its clause (back to a digit or a sentence's mark), a word of `_DIFFERENCE_WORDS` nearer to
        it than any of `_VALUE_WORDS` (and not after one of `_JOIN_WORDS` just before it); or, with neither among
        the four, one of `_DIFFERENCE_NOUNS` among the twelve."""
        j = i - 1
        j -= 1 if self.at(j) in _SPACES else 0
        if self.at(j) == "±" or self.text[max(0, j - 2): j + 1] == "+/-":
            return True
        words, word = [], ""
        while j >= 0 and len(words) < 12:
            c = self.text[j]
            if c.isdigit() or c in ".;:!?\n":
                break
            if c.isalpha():
                word = c + word
            elif word:
                words.append(word.lower())
                word = ""
            j -= 1
        words += [word.lower()] if word and len(words) < 12 else []
        for k, w in enumerate(words[:4]):
            if w in _VALUE_WORDS or (k == 0 and w in _JOIN_WORDS):
                return False
            if w in _DIFFERENCE_WORDS:
                return True
        return any(w in _DIFFERENCE_NOUNS for w in words[4:])

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

    def _range(self, i: int) -> tuple[list[tuple], int]:
        """The numbers read from ``i``: one, a range's two ends, or a chain's (7647-14-5, 2023-01-05), each
        (start, end, value, step); and where the last ends."""
        end, value, step = self.number(i)
        parts, seps = [(i, end, value, step)], []
        while True:
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
        return parts, end

    def _quantity(self, i: int, out: list[Reading]) -> int:
        parts, end = self._range(i)
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
            dim, offset = ("±" + dim, 0.0) if self.difference(i) else (dim, offset)  # a difference: no offset
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
# Read line by line as a CommonMark reader would (blocks first, then code spans and math within them), apart from
# the format rewrites' patterns: a rewrite that misreads the markup is caught by a reader that does not share it.

@dataclass(frozen=True)
class _Block:
    kind: str  # code, paragraph, item, heading, quote, rule
    lines: tuple[tuple[int, str], ...]  # (line number, content): markers out; code: its lines as written


def _indent(line: str) -> int:
    width = 0
    for c in line:
        if c not in " \t":
            break
        width = width + 1 if c == " " else (width // 4 + 1) * 4
    return width


def _fence(line: str) -> str | None:
    """The fence a line opens (its run of backticks or tildes), or None."""
    body = line[len(line) - len(line.lstrip(" ")):]
    if len(line) - len(body) > 3 or body[:1] not in ("`", "~"):
        return None
    run = len(body) - len(body.lstrip(body[0]))
    if run < 3 or (body[0] == "`" and "`" in body[run:]):
        return None
    return body[:run]


def _closes(line: str, fence: str) -> bool:
    body = line.lstrip(" ")
    return len(line) - len(body) <= 3 and body.rstrip(" \t").startswith(fence) and \
        set(body.rstrip(" \t")) == {fence[0]}


def _is_rule(body: str) -> bool:
    chars = body.replace(" ", "").replace("\t", "")
    return len(chars) >= 3 and chars[0] in "-*_" and set(chars) == {chars[0]}


def _list_marker(body: str) -> int:
    """The length of a list item's marker and the space after it (``- ``, ``12. ``), 0 when there is none."""
    k = 0
    while k < len(body) and k < 9 and body[k].isdigit():
        k += 1
    k = k + 1 if (k and body[k: k + 1] in (".", ")")) or (not k and body[:1] in ("-", "*", "+")) else 0
    if not k or (k < len(body) and body[k] not in " \t"):
        return 0
    return len(body) - len(body[k:].lstrip(" \t"))


def _indented_code(lines: list[str], n: int) -> _Block:
    """The indented code block starting at line ``n``: its lines indented 4 columns and the blank lines between."""
    m = n
    while m < len(lines) and (_indent(lines[m]) >= 4 or not lines[m].strip()):
        m += 1
    while not lines[m - 1].strip():
        m -= 1
    return _Block("code", tuple((k, lines[k]) for k in range(n, m)))


def blocks(text: str) -> list[_Block]:
    """The blocks of ``text`` in order: fenced code (a shorter fence inside a longer one is content) and indented
    code (4 columns, not continuing a paragraph) as written; headings (ATX, and setext: the underline is markup),
    list items, quotes and paragraphs with their markers out; rules (no content)."""
    lines = text.split("\n")
    out: list[_Block] = []
    open_: list[tuple[int, str]] | None = None  # the lines of the paragraph, item or quote being read
    kind = ""
    n = 0

    def close() -> None:
        nonlocal open_
        if open_:
            out.append(_Block(kind, tuple(open_)))
        open_ = None

    while n < len(lines):
        line = lines[n]
        body = line.lstrip(" \t")
        fence = _fence(line)
        if fence:
            close()
            m = n + 1
            while m < len(lines) and not _closes(lines[m], fence):
                m += 1
            out.append(_Block("code", tuple((k, lines[k]) for k in range(n, min(m + 1, len(lines))))))
            n = m + 1
            continue
        if not body:
            close()
        elif _indent(line) >= 4 and open_ is None:
            out.append(_indented_code(lines, n))
            n = out[-1].lines[-1][0] + 1
            continue
        elif open_ is not None and kind == "paragraph" and _indent(line) < 4 and \
                (set(body.rstrip()) == {"="} or set(body.rstrip()) == {"-"}):
            kind = "heading"  # a setext underline: the paragraph above is a heading
            close()
        elif _indent(line) < 4 and _is_rule(body):
            close()
            out.append(_Block("rule", ()))
        elif _indent(line) < 4 and body.startswith("#") and len(body) - len(body.lstrip("#")) <= 6 and \
                body.lstrip("#")[:1] in ("", " ", "\t"):
            close()
            out.append(_Block("heading", ((n, body.lstrip("#").strip(" \t#")),)))
        elif _indent(line) < 4 and (body.startswith(">") or _list_marker(body)):
            close()
            kind = "quote" if body.startswith(">") else "item"
            open_ = [(n, body[1:] if kind == "quote" else body[_list_marker(body):])]
        elif open_ is not None:
            open_.append((n, body))  # a continuation line (lazy, in an item or a quote too)
        else:
            kind, open_ = "paragraph", [(n, body)]
        n += 1
    close()
    return out


def _spans(text: str) -> list[tuple[int, int]]:
    r"""Code spans (a run of backticks to the next run of as many) and math (``$$..$$``, ``\(..\)``, ``\[..\]``,
    ``$..$`` hugging its content, not after a word or before one) of a block's text, as (start, end)."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "`":
            run = len(text) - len(text[i:].lstrip("`")) - i
            j = i + run
            while j < len(text):
                k = text.find("`" * run, j)
                if k < 0:
                    break
                end = len(text) - len(text[k:].lstrip("`"))
                if end - k == run:
                    out.append((i, end))
                    break
                j = end
            i = out[-1][1] if out and out[-1][0] == i else i + run
            continue
        for opener, closer in (("$$", "$$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if text.startswith(opener, i) and text.find(closer, i + 2) > i + 2:
                out.append((i, text.find(closer, i + 2) + 2))
                break
        else:
            k = text.find("$", i + 1) if c == "$" else -1
            if k > i + 1 and "\n" not in text[i:k] and not text[i + 1].isspace() and not text[k - 1].isspace() \
                    and not (i and (text[i - 1].isalnum() or text[i - 1] in "_$")) \
                    and not (k + 1 < len(text) and (text[k + 1].isalnum() or text[k + 1] in "_$")):
                out.append((i, k + 1))
        i = out[-1][1] if out and out[-1][0] == i else i + 1
    return out


def _identifier(word: str) -> bool:
    """A name written as code: holding ``_`` (snake_case, __init__) or written as a call (``f()``)."""
    core = word.rstrip(",;:!?").rstrip(".") if not word.endswith("()") else word
    name = core[:-2] if core.endswith("()") else core
    parts = name.split(".")
    return bool(name) and all(p and (p[0].isalpha() or p[0] == "_") and p.replace("_", "a").isalnum() for p in parts) \
        and ("_" in name or core.endswith("()"))


def _reading(text: str) -> tuple[list[str], list[tuple[str, int, int]]]:
    """(what must stay verbatim: code blocks, code spans and math, identifiers; the tokens outside them, each with
    its block and its line number in ``text``)."""
    code, spans, tokens = [], [], []
    for b, block in enumerate(blocks(text)):
        if block.kind == "code":
            code.append("\n".join(line for _, line in block.lines))
            continue
        for number, line in block.lines:
            cut, pos = [], 0
            for start, end in _spans(line):
                spans.append(line[start:end])
                cut += [line[pos:start], " \x00 "]
                pos = end
            line = "".join(cut) + line[pos:]
            line = re.sub(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)\)", r"\1 (\2)", line)
            tokens += [(word, b, number) for word in line.split()]
    names = [w for w, _, _ in tokens if _identifier(w.strip("*"))]
    return code + spans + [n.strip("*").rstrip(",;:!?") for n in names], tokens


def _plain_token(word: str) -> str:
    """A token without emphasis: ``*``/``_`` runs cut at its start and at its end (before the punctuation that ends
    it: ``**bold**,`` is ``bold,``); a lone ``*`` stays (2 * 3 is content), and so does an identifier."""
    if _identifier(word) or not word.strip("*_"):
        return word
    head = word.lstrip("*_")
    core = head.rstrip(".,;:!?)'\"")
    return core.rstrip("*_") + head[len(core):]


def markup_tokens(text: str) -> list[str]:
    """The text's tokens outside markup: code and math out; a link as its text and address; headings', bullets'
    and quotes' markers out; emphasis cut from the ends of words (`_plain_token`); thousands separators out of
    numbers."""
    return [re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", _plain_token(w)) for w, _, _ in _reading(text)[1]]


# the words after a number that make it a quantity with a unit (1,500 mL), and the words before one that make it a
# name (ISO 9001, port 8080, step 1200)
_PLAIN_WORDS = frozenset("a an and as at be by for from in is it its of on or the to was were we with".split())
_NAME_WORDS = frozenset("port ports no no. number step stage figure fig fig. table section version model code id "
                        "room page line item entry run batch sample".split())


def _named_number(tokens: list[str], k: int) -> bool:
    """Whether the number token ``k`` (separators out) names something, so its digits are its meaning: after a word
    in capitals or a label (`_NAME_WORDS`), or a year (1000 to 2100, of four digits, alone or in a range) that no
    short unit-like word follows."""
    before = tokens[k - 1] if k else ""
    if (len(before) > 1 and before.isalpha() and before.isupper()) or before.lower().rstrip(":") in _NAME_WORDS \
            or before.endswith("#"):
        return True
    after = tokens[k + 1].rstrip(".,;:!?)") if k + 1 < len(tokens) else ""
    unit_like = 0 < len(after) <= 4 and after.lower() not in _PLAIN_WORDS and not after.isdigit()
    years = [int(p) for p in re.split(r"[-\u2013\u2014]", tokens[k].strip("(),.;:")) if p.isdigit() and len(p) == 4]
    return any(1000 <= y <= 2100 for y in years) and not unit_like


def _cut_sentence(source: list[tuple[str, int, int]], copy: list[tuple[str, int, int]], text: str) -> str | None:
    """Where the copy starts a block (an item, a heading) inside a sentence of the source: a line break of one
    source paragraph is a place a block may start only after a sentence's end (``.``, ``!``, ``?``, ``:``, ``;``)
    or after a line of that paragraph ending in ``:`` (its lines are a list's items)."""
    lines = text.split("\n")
    for k in range(1, len(copy)):
        if copy[k][1] == copy[k - 1][1] or source[k][1] != source[k - 1][1]:
            continue
        line = source[k][2]
        first = line
        while first > 0 and lines[first - 1].strip():
            first -= 1
        split_ok = line != source[k - 1][2] and (lines[line - 1].rstrip().endswith((".", "!", "?", ":", ";")) or
                                                 any(lines[j].rstrip().endswith(":") for j in range(first, line)))
        if not split_ok:
            return f"a sentence cut in two blocks between token {k - 1} {source[k - 1][0]!r} and {source[k][0]!r}"
    return None


def token_differences(source: str, copy: str, ordered: bool = True) -> str | None:
    """Why ``copy`` is not ``source`` with only its markup changed (None when it is): a verbatim part changed (code,
    math, an identifier), a token outside markup differs (``ordered=False``: the same tokens in any order, for a
    reordered list), a number that names something (a year, ISO 9001) written otherwise, or a sentence of the
    source cut into two blocks."""
    (va, ra), (vb, rb) = _reading(source), _reading(copy)
    if va != vb:
        gone = [x for x in va if x not in vb][:1] or va[:1]
        return f"code, math or identifier changed: {gone[0] if gone else vb[0]!r}"
    ta, tb = markup_tokens(source), markup_tokens(copy)
    if (ta != tb) if ordered else (Counter(ta) != Counter(tb)):
        for k, (x, y) in enumerate(zip(ta, tb)):
            if x != y:
                return f"token {k}: {x!r} became {y!r}"
        return f"{len(ta)} token(s) became {len(tb)}"
    if not ordered:
        return None
    for k, ((a, _, _), (b, _, _)) in enumerate(zip(ra, rb)):
        if _plain_token(a) != _plain_token(b) and any(c.isdigit() for c in a) and _named_number(ta, k):
            return f"token {k}: {a!r} became {b!r}, a number that names something"
    return _cut_sentence(ra, rb, source)
