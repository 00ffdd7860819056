"""What a rule with no judge gets on error copies against their sources, per type: the tells a generator leaves.

For each type (or set): the copies, the edits per copy, the mean change in words (the copy's words less its
source's, `judgetrain.eval.rules.words`), and the accuracy of the shorter, longer and novel-token rules
(`judgetrain.eval.rules`) on each copy against its source, the source the right answer: a win 1, a tie 1/2. The
novel-token rule is fitted on other samples only: the samples are dealt into ``FOLDS`` folds (in order of their
id), and a fold's pairs are scored by the rule fitted on the other folds' sources and error copies.

`judgetrain perturb` prints these figures per set; the loop refuses a training set where a rule's figure on a type is
above ``LIMIT`` (`over_limit`), before any training.

    pairs = [CopyPair(sample_id, "equipment_substitution", source_text, copy_text, edits)]
    figures = copy_rule_figures(pairs)  # {type: {"copies", "edits_per_copy", "token_change", "rules"}}
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from judgetrain.eval.rules import NovelTokens, rule_verdict, words

CHECKED = ("shorter", "longer", "novel_token")
FOLDS = 5
LIMIT = 0.9


@dataclass(frozen=True)
class CopyPair:
    sample_id: Any
    key: str  # the type (or set) the figures are grouped by
    source: str
    copy: str
    edits: int


def copy_rule_figures(pairs: list[CopyPair], folds: int = FOLDS,
                      fitted: NovelTokens | None = None) -> dict[str, dict[str, Any]]:
    """Per key (in first-seen order): ``copies``, ``edits_per_copy`` (mean, min, max), ``token_change`` (mean words
    of a copy less its source's), ``rules`` (rule -> accuracy, ties half). The novel-token rule is ``fitted`` where
    given (on a training set the pairs are not in), else fitted fold by fold on the other samples."""
    ids = sorted({str(p.sample_id) for p in pairs})
    fold = {sid: k % folds for k, sid in enumerate(ids)}
    novel = {f: fitted or NovelTokens.fit({p.source for p in pairs if fold[str(p.sample_id)] != f},
                                          [p.copy for p in pairs if fold[str(p.sample_id)] != f])
             for f in range(folds)}
    out: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(p.key for p in pairs):
        mine = [p for p in pairs if p.key == key]
        edits = [p.edits for p in mine]
        scores = {rule: statistics.fmean(_right(rule, p, novel[fold[str(p.sample_id)]]) for p in mine)
                  for rule in CHECKED}
        out[key] = {"copies": len(mine),
                    "edits_per_copy": {"mean": round(statistics.fmean(edits), 3), "min": min(edits),
                                       "max": max(edits)},
                    "token_change": round(statistics.fmean(len(words(p.copy)) - len(words(p.source))
                                                           for p in mine), 3),
                    "rules": {rule: round(v, 4) for rule, v in scores.items()}}
    return out


def over_limit(figures: dict[str, dict[str, Any]], limit: float = LIMIT) -> list[tuple[str, str, float]]:
    """(key, rule, accuracy) for every rule whose figure on a key is above ``limit``."""
    return [(key, rule, acc) for key, f in figures.items() for rule, acc in f["rules"].items() if acc > limit]


def _right(rule: str, pair: CopyPair, novel: NovelTokens) -> float:
    verdict = rule_verdict(rule, pair.source, pair.copy, novel)
    return 1.0 if verdict == "A>B" else 0.5 if verdict == "A=B" else 0.0
