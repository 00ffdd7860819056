"""The edits every operator makes: the spans of a text an operator could edit (`Span`: where, what is there, how to
draw the replacement), a rate's share of them (`pick`: the rate times the eligible spans, at least one, drawn with the
item's seeded generator), the picked edits made (`apply`: the new text and one `Change` per edit: kind, before, after,
position in the source text), and the check that a new text is its source with exactly those edits (`misplaced`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: str  # the operator's name
    draw: Callable[[random.Random], str | None]  # the replacement (None: nothing different to write)
    skip: str | None = None  # why this span is left alone (a percentage, below absolute zero): counted, never picked


class Aimed:
    """A span's draw that can be aimed at a direction of length (-1: a shorter replacement, 1: a longer one), so a
    copy's edits move its length the way its item's coin said (`aim`): ``groups`` maps each direction (0: the same
    length) to its (candidate, weight) pairs."""

    def __init__(self, groups: dict[int, list[tuple[str, int]]]):
        self.groups = {d: g for d, g in groups.items() if g}
        total = sum(w for g in self.groups.values() for _, w in g)
        self.same = sum(w for _, w in self.groups.get(0, ())) / total

    def __call__(self, rng: random.Random, direction: int | None = None) -> str:
        """Without a direction: the same length as often as its weight says, else longer or shorter as often as
        each other where both are there. Aimed: the same length as often as its weight says, else ``direction``
        (the same length, then the other way, where it has none)."""
        sides = [d for d in (-1, 1) if d in self.groups]
        if rng.random() < self.same or not sides:
            group = self.groups[0]
        elif direction in self.groups:
            group = self.groups[direction]
        else:
            group = self.groups.get(0) or self.groups[rng.choice(sides) if direction is None else -direction]
        return rng.choices([c for c, _ in group], weights=[w for _, w in group])[0]

    def goes(self, direction: int) -> bool:
        return direction in self.groups or 0 in self.groups


def aim(spans: list[Span], direction: int) -> list[Span]:
    """The spans whose draw can move the length ``direction`` or keep it (a draw that is not `Aimed` keeps it, or
    moves it no way the item chose); all of them where none can."""
    kept = [s for s in spans if not isinstance(s.draw, Aimed) or s.draw.goes(direction)]
    return kept if any(s.skip is None for s in kept) else spans


@dataclass(frozen=True)
class Change:
    kind: str
    before: str
    after: str
    position: int  # character offset of ``before`` in the source text

    def as_dict(self) -> dict:
        return {"kind": self.kind, "before": self.before, "after": self.after, "position": self.position}


def pick(spans: list[Span], rate: float, rng: random.Random, count: int | None = None) -> list[Span]:
    """A share ``rate`` of the spans (rounded, at least one), or ``count`` of them where given (as many as there are
    at most), drawn with ``rng``; overlapping spans are dropped first (the earlier one kept), so every edit stands
    alone. Returned in text order."""
    kept: list[Span] = []
    spans = [s for s in spans if s.skip is None]
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if not kept or span.start >= kept[-1].end:
            kept.append(span)
    if not kept:
        return []
    n = min(len(kept), max(1, count if count is not None else round(rate * len(kept))))
    return [kept[i] for i in sorted(rng.sample(range(len(kept)), n))]


def apply(text: str, spans: list[Span], rng: random.Random, direction: int | None = None) -> tuple[str, list[Change]]:
    """The text with every picked span replaced (replacements drawn in text order, an `Aimed` draw aimed at
    ``direction`` where given) and the changes made."""
    changes = []
    for span in spans:
        after = span.draw(rng, direction) if isinstance(span.draw, Aimed) else span.draw(rng)
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
