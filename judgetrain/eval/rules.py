"""The rules that need no judge, set beside every pairwise figure: what a figure is worth when no model reads the text.

A judge trained on generated data finds every tell its generator leaves (error copies always shorter, a word no source
holds, the better response always shown first). So each pairwise figure a suite reports is also computed, on the same
rows, through the suite's own records, figures and units, by four rules:

- ``shorter``: each response scored alone by minus its length in characters: the shorter wins, equal is a tie;
- ``longer``: the same, plus its length: the longer wins;
- ``first_shown``: in both presentations, the response shown first wins (the pairwise suites only: a response scored
  alone is shown in no order);
- ``novel_token``: fitted on training items alone (`NovelTokens.fit`): a word seen in a training error copy and in no
  training source marks a response as the error copy (score -1, else 0); no mark either way is a tie.

A rule's record is the record the suite writes for a judge whose scores are the rule's (`rule_records`), so its figure
is the suite's own rule applied to it: a tie counts as the suite counts a judge's tie.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from judgetrain.eval.benchmarks.base import Suite, text_of
from judgetrain.eval.requests import RowScore

RULES = ("shorter", "longer", "first_shown", "novel_token")
PAIRWISE_ONLY = ("first_shown",)  # rules defined on a pair shown in an order
FITTED = ("novel_token",)  # rules fitted on training items: absent where none were given
_WORD = re.compile(r"[^\W_]+(?:[.,][0-9]+)*|[^\w\s]")  # a run of letters / digits (12.5 one word), or a symbol
_FAR = 50.0  # first_shown's log-probability gap in verdict mode: the first-shown verdict, probability ~1


def words(text: Any) -> list[str]:
    """The words of a response (a string or a chat's messages) as the rules count and compare them: runs of letters or
    digits (a decimal number is one word), each other non-space character alone; case kept ("Cool" is not "cool")."""
    return _WORD.findall(text_of(text))


@dataclass(frozen=True)
class NovelTokens:
    """The novel-token rule: ``marks``, the words seen in training error copies and in no training source."""

    marks: frozenset[str]

    @classmethod
    def fit(cls, sources: Iterable[Any], error_copies: Iterable[Any]) -> NovelTokens:
        """Fitted on training items only: ``sources`` the texts the copies were made from, ``error_copies`` the copies
        holding an error (a rewrite of the same meaning is neither)."""
        seen = {w for text in sources for w in words(text)}
        return cls(frozenset(w for text in error_copies for w in words(text) if w not in seen))

    def score(self, text: Any) -> float:
        """-1.0 when the text holds a marked word (the rule calls it the error copy), else 0.0."""
        return -1.0 if any(w in self.marks for w in words(text)) else 0.0


def response_score(rule: str, text: Any, novel: NovelTokens | None = None) -> float:
    """A pointwise rule's score of one response: higher is better."""
    if rule == "shorter":
        return -float(len(text_of(text)))
    if rule == "longer":
        return float(len(text_of(text)))
    if rule == "novel_token":
        if novel is None:
            raise ValueError("the novel_token rule needs NovelTokens fitted on training items")
        return novel.score(text)
    raise ValueError(f"{rule!r} is not a pointwise rule (pointwise: shorter, longer, novel_token)")


def rule_verdict(rule: str, response_a: Any, response_b: Any, novel: NovelTokens | None = None) -> str:
    """What a rule says of a pair shown as (a, b): "A>B", "B>A" or "A=B" (first_shown: always "A>B")."""
    if rule == "first_shown":
        return "A>B"
    a, b = response_score(rule, response_a, novel), response_score(rule, response_b, novel)
    return "A>B" if a > b else "B>A" if b > a else "A=B"


def rules_for(suite: Suite, novel: NovelTokens | None = None) -> tuple[str, ...]:
    """The rules a suite's figures are set beside: first_shown for the pairwise suites, novel_token where it was
    fitted."""
    return tuple(r for r in RULES if (r not in PAIRWISE_ONLY or suite.pairwise) and (r not in FITTED or novel))


def rule_mode(rule: str) -> str:
    """The scoring mode whose records and figures a rule's record takes the form of."""
    return "verdict" if rule in PAIRWISE_ONLY else "implicit"


def rule_records(suite: Suite, rows: Sequence[dict], rule: str,
                 novel: NovelTokens | None = None) -> list[dict[str, Any]]:
    """The records the suite writes for ``rows`` (as loaded and selected for the judge) when the rule's scores stand in
    for a judge's: each response of the row's implicit request scored by `response_score`, or, for first_shown, each
    presentation's first-shown verdict at probability ~1 in verdict mode. ``row_index`` as the engine writes it."""
    mode = rule_mode(rule)
    out = []
    for index, row in enumerate(rows):
        if mode == "verdict":
            scores = [0.0, -_FAR, 0.0, -_FAR]  # as stored, swapped: the first shown likelier
        else:
            scores = [response_score(rule, r, novel) for r in suite.request(row, "implicit").responses]
        out.append({"row_index": index, **suite.row_fields(row, RowScore(scores), mode)})
    return out
