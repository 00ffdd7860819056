"""What the domain's sources use, the only place an error copy's replacements are drawn from: so no word of an error
copy is new to the sources, and a word's or a number's length moves no way on average.

- ``swap`` operators: a word of a class (``classes``: lists of interchangeable words, such as the pieces of equipment
  or an action and its opposite) is replaced by another word of its class, written as the text writes it (its case,
  at a sentence's start), drawn in proportion to how many other sources hold it as written;
- numeric ``borrow``: a quantity is replaced by a quantity of the same unit and shape that another source writes,
  drawn in proportion to how many other sources write it (so a changed number stays in that quantity's range);
- numeric ``unit_swap`` with ``pool: true``: the unit is another of its dimension that other sources use;
- ``order``: two adjacent numbered steps (their texts swapped, the numbers kept), or two adjacent sentences of a
  paragraph, in the other order: no word added or removed.

"Other sources": a draw's weight is the number of source texts holding the replacement, less the text being edited
where it holds it; a replacement no other source uses is never drawn.

    pool = Pool(rules, [s.text for s in samples])     # rules: judgetrain.perturb.operators.Rules
    pool.draw(["muffle furnace", "drying oven"], pool.forms, text)(rng)
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any

from judgetrain.perturb.edits import Aimed, Span

_ITEM = re.compile(r"^([ \t]*\d+[.)][ \t]+)(.+)$", re.M)
_SENTENCE_END = re.compile(r"(?<=[.!?])[ \t]+(?=[A-Z])")
_LIST_LINE = re.compile(r"^[ \t]*(?:[-*+#>]|\d+[.)])")


class Pool:
    """Counts of what the sources write (see the module doc), built once for every text of a run."""

    def __init__(self, rules: Any, texts: list[str]):
        self.rules = rules
        self.forms: Counter[str] = Counter()  # a swap class's word as written -> texts holding it
        self.quantities: dict[tuple, Counter[str]] = {}  # (unit, numbers) -> quantity as written -> texts
        self.units: Counter[str] = Counter()  # unit -> texts writing a quantity in it
        words = {w for op in rules.spec.operators.values() if op.kind == "swap" for c in op.options["classes"]
                 for w in c}
        forms = {f for w in words for f in (w, w[:1].upper() + w[1:], w.upper())}
        for text in texts:
            self.forms.update(f for f in forms if _holds(text, f))
            quantities = self.text_quantities(text)
            for key, written in quantities:
                self.quantities.setdefault(key, Counter())[written] += 1
            self.units.update({key[0] for key, _ in quantities})

    def text_quantities(self, text: str) -> set[tuple[tuple, str]]:
        """The quantities of ``text`` with a unit, as ((unit, numbers), written) once each."""
        out = set()
        for m in self.rules.quantity.finditer(text):
            q = self.rules.read(m)
            if q.unit and not q.other and q.tolerance is None and text[m.end(): m.end() + 1] != "/":
                out.add(((q.unit, len(q.numbers)), m.group(0)))
        return out

    def draw(self, candidates: list[str], counts: Counter, text: str,
             before: str) -> Aimed | None:
        """A candidate for ``before`` drawn in proportion to the other sources holding it (`balanced`); None where no
        other source holds any."""
        return balanced(candidates, [counts.get(c, 0) - _holds(text, c) for c in candidates], before)

    # ------------------------------------------------------------------------------------------ numbers
    def borrow_draw(self, q: Any, written: str, text: str) -> Aimed | None:
        """Another source's quantity of the same unit and shape (a value, or a range) as ``q`` (a
        `judgetrain.perturb.operators.Quantity`), of another value."""
        counts = self.quantities.get((q.unit, len(q.numbers)), Counter())
        values = tuple(n.value for n in q.numbers)
        # sorted: the counts were filled from sets of strings, whose order Python randomises per process
        return self.draw(sorted(w for w in counts if _values(self.rules, w) != values), counts, text, written)

    def unit_weight(self, unit: str, text: str) -> int:
        """How many other sources write a quantity in ``unit``."""
        return self.units.get(unit, 0) - any(k[0] == unit for k, _ in self.text_quantities(text))


def balanced(candidates: list[str], weights: list[int], before: str) -> Aimed | None:
    """An `Aimed` draw among the candidates of positive weight, in proportion to it within a direction of length
    against ``before``; None where no weight is positive."""
    kept = [(c, w) for c, w in zip(candidates, weights) if w > 0]
    if not kept:
        return None
    return Aimed({d: [(c, w) for c, w in kept if (len(c) > len(before)) - (len(c) < len(before)) == d]
                  for d in (-1, 0, 1)})


def order_spans(name: str, text: str) -> list[Span]:
    """Two adjacent numbered steps (their texts swapped, numbers kept), and two adjacent sentences of a line that is
    no list item or heading, each pair one span drawn as the other order."""
    spans = []
    items = list(_ITEM.finditer(text))
    for a, b in zip(items, items[1:]):
        if text[a.end(): b.start()] == "\n":  # adjacent steps of one list
            between = text[a.end(): b.start(2)]
            spans.append(Span(a.start(2), b.end(2), name,
                              lambda _r, a=a.group(2), b=b.group(2), between=between: b + between + a))
    pos = 0
    for line in text.split("\n"):
        if line.strip() and not _LIST_LINE.match(line):
            cuts = [0] + [x for m in _SENTENCE_END.finditer(line) for x in (m.start(), m.end())] + [len(line)]
            sentences = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)]
            for (s1, e1), (s2, e2) in zip(sentences, sentences[1:]):
                first, gap, second = line[s1:e1], line[e1:s2], line[s2:e2]
                spans.append(Span(pos + s1, pos + e2, name,
                                  lambda _r, f=first, g=gap, s=second: s + g + f))
        pos += len(line) + 1
    return spans


def _holds(text: str, form: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(form)}(?!\w)", text) is not None


def _values(rules: Any, written: str) -> tuple[float, ...]:
    m = rules.quantity.search(written)
    return tuple(n.value for n in rules.read(m).numbers) if m else ()
