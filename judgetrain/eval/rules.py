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
is the suite's own rule applied to it. A pointwise rule that cannot tell two responses apart (equal lengths, no marked
word on either side) abstains, and its abstention is broken by a seeded coin, as a judge that guesses would break it:
each response's score gets a jitter under `_COIN` (smaller than any difference a rule reads: lengths and marks are
whole numbers), drawn from the suite's name and the row's index, so the same rows give the same figures on any
machine. A rule that ties every pair scores chance (0.5 on a pair accuracy), not 0: a judge beats it only by
telling the responses apart.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from judgetrain.config.directions import direction
from judgetrain.config.recipe import SCORING_MODES
from judgetrain.data.preference import load_preference
from judgetrain.data.validate import DataValidationError, RowProblem
from judgetrain.eval.benchmarks.base import Suite, text_of
from judgetrain.eval.requests import RowScore
from judgetrain.eval.stats import Items, items_intervals, paired_difference

RULES = ("shorter", "longer", "first_shown", "novel_token")
PAIRWISE_ONLY = ("first_shown",)  # rules defined on a pair shown in an order
FITTED = ("novel_token",)  # rules fitted on training items: absent where none were given
_WORD = re.compile(r"[^\W_]+(?:[.,][0-9]+)*|[^\w\s]")  # a run of letters / digits (12.5 one word), or a symbol
_FAR = 50.0  # first_shown's log-probability gap in verdict mode: the first-shown verdict, probability ~1
_COIN = 1e-3  # a pointwise rule's tie-breaking jitter: under any difference of its whole-number scores


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
    for a judge's: each response the rules read (`Suite.rule_texts`) scored by `response_score`, or, for first_shown,
    each presentation's first-shown verdict at probability ~1 in verdict mode. ``row_index`` as the engine writes
    it."""
    mode = rule_mode(rule)
    out = []
    for index, row in enumerate(rows):
        if mode == "verdict":
            scores = [0.0, -_FAR, 0.0, -_FAR]  # as stored, swapped: the first shown likelier
        else:
            coin = random.Random(f"{suite.name}:{index}")  # seeded by text: the same draw on every machine
            scores = [response_score(rule, r, novel) + _COIN * coin.random() for r in suite.rule_texts(row) or []]
        out.append({"row_index": index, **suite.row_fields(row, RowScore(scores), mode)})
    return out


# ------------------------------------------------------------------------------------- the rules' figures
@dataclass
class RuleFigures:
    """One rule's figures on a suite's rows: ``metrics`` (the suite's own figures of the rule's records), ``items``
    (its per-item figures, the base of a judge's paired difference) and ``intervals`` (``items_intervals``)."""

    metrics: dict[str, Any]
    items: Items | None
    intervals: dict[str, dict[str, float]]


_CACHE: dict[tuple[str, str, str], dict[str, RuleFigures]] = {}  # (suite, rows' fingerprint, marks'): figures


def rule_figures(suite: Suite, rows: Sequence[dict], novel: NovelTokens | None = None) -> dict[str, RuleFigures]:
    """{rule: its figures} of each rule of `rules_for` on ``rows`` (as loaded and selected for the judge). Rules read
    no model, so each eval set's figures are computed once: a later call with the same rows (the next epoch) gets
    them from the cache. {} for rows that hold no response to read alone (`Suite.rule_texts`: Ideation's pairwise
    rows, whose responses are verdicts about proposals inside the prompt)."""
    if any(suite.rule_texts(row) is None for row in rows):
        return {}  # rows without responses to read alone (Ideation's pairwise rows): no rule applies
    key = (suite.name, fingerprint(rows), fingerprint(sorted(novel.marks)) if novel else "")
    if key not in _CACHE:
        out = {}
        for rule in rules_for(suite, novel):
            mode, records = rule_mode(rule), rule_records(suite, rows, rule, novel)
            items, _ = suite.items(records, mode)
            intervals = items_intervals(items) if items is not None and len(items.keys) else {}
            out[rule] = RuleFigures({**suite.figures(records, mode), "n_rows": len(records)}, items, intervals)
        _CACHE[key] = out
    return _CACHE[key]


def fingerprint(rows: Any) -> str:
    """SHA-256 of rows as JSON (keys sorted): equal rows, equal fingerprint."""
    text = json.dumps(rows, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def learned(judge: Items, rules: Mapping[str, RuleFigures]) -> dict[str, dict[str, Any]]:
    """Each ranked figure of the judge's items (higher or lower is better; the position figures, best at a value, are
    left out) set beside the best rule on it (the best value over the rules' figures, the first of `RULES` on a tie):
    ``{metric: {rule, rule_value, judge, delta, delta_ci_low, delta_ci_high, n_units, learned}}``, the difference
    judge minus that rule paired on the same items and units (`paired_difference`, the rule's items as the base).
    ``learned``: the judge beats the best rule, the interval of the difference excluding 0 on the better side. A
    figure no item of both holds is left out."""
    out: dict[str, dict[str, Any]] = {}
    paired: dict[str, dict[str, dict[str, float]]] = {}
    for metric in judge.values:
        way = direction(metric)
        values = {r: f.intervals[metric]["value"] for r, f in rules.items()
                  if metric in f.intervals and math.isfinite(f.intervals[metric]["value"]) and f.items is not None}
        if way not in ("higher", "lower") or not values:
            continue
        best = (max if way == "higher" else min)(values, key=values.get)
        if best not in paired:
            paired[best] = paired_difference(judge, rules[best].items)
        p = paired[best].get(metric)
        if p is None or not all(math.isfinite(p[k]) for k in ("delta_ci_low", "delta_ci_high")):
            continue
        beats = p["delta_ci_low"] > 0 if way == "higher" else p["delta_ci_high"] < 0
        out[metric] = {"rule": best, "rule_value": values[best], "judge": p["trained"], "delta": p["delta"],
                       "delta_ci_low": p["delta_ci_low"], "delta_ci_high": p["delta_ci_high"],
                       "n_units": p["n_units"], "learned": bool(beats)}
    return out


def verdict_words(verdict: Mapping[str, Any]) -> str:
    """A figure's verdict in words: "beats the best rule (shorter) by +0.120 [0.050, 0.190]" where the judge learned
    more than the rule reads, else "not above the best rule (shorter): +0.020 [-0.050, 0.090]"."""
    diff = f"{verdict['delta']:+.3f} [{verdict['delta_ci_low']:.3f}, {verdict['delta_ci_high']:.3f}]"
    if verdict["learned"]:
        return f"beats the best rule ({verdict['rule']}) by {diff}"
    return f"not above the best rule ({verdict['rule']}): {diff}"


def round_verdict(row: Mapping[str, Any]) -> str:
    """A round table row's figure against the best rule (`judgetrain.loop.table`: ``best_rule``, ``over_rule`` with
    its interval, ``learned``) in words (`verdict_words`); "" where it has none."""
    if row.get("best_rule") is None:
        return ""
    return verdict_words({"rule": row["best_rule"], "delta": row["over_rule"], "learned": row["learned"],
                          "delta_ci_low": row["over_rule_ci_low"], "delta_ci_high": row["over_rule_ci_high"]})


LEARNED_RULE = ("a judge's figure is learned only where it beats the best rule that needs no judge: the 95% interval "
                "of the paired difference (judge minus the best rule, on the same items and units) excludes 0")


def read_training_pairs(path: str) -> NovelTokens:
    """The novel-token rule fitted on a file of training pairs (`judgetrain pairs known --form response`'s
    train.parquet, or any preference rows: chosen = the source, rejected = its error copy; a tie row, a rewrite against
    its source, is neither and is left out). Bad rows, and pairs whose
    chosen and rejected are verdicts (the pairwise form: no source text in them), are a bad-input error naming the
    file before any model loads."""
    rows = load_preference(path)
    verdicts = [i for i, row in enumerate(rows) if _VERDICT.fullmatch(text_of(row["chosen"]).strip())]
    if verdicts:
        raise DataValidationError([RowProblem(str(path), "train", i, "chosen", "a verdict, not a response: the "
                                              "novel-token rule is fitted on response pairs (chosen = the source, "
                                              "rejected = its error copy: `judgetrain pairs known --form response`)")
                                   for i in verdicts[:5]], len(verdicts), len(rows))
    errors = [row for row in rows if not row.get("tie")]  # a tie (a rewrite against its source) holds no error
    return NovelTokens.fit([row["chosen"] for row in errors], [row["rejected"] for row in errors])


_VERDICT = re.compile(r"\[\[[AB][<>=][AB]\]\]")


def rule_table(summary: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of an evaluation's judge figures beside the rules (results.json: its ``intervals`` and
    ``rules``): a row per figure with a verdict, ``<suite>[/<mode>]/<metric>`` (the mode named unless it is the
    evaluation's first), the judge's value and interval, each rule's, and the verdict in words."""
    rules = summary.get("rules") or {}
    names = [r for r in RULES if any(r in (s.get("figures") or {}) for s in rules.values())]
    rows = []
    for suite, held in rules.items():
        for mode, verdicts in (held.get("learned") or {}).items():
            judge = ((summary.get("intervals") or {}).get(suite) or {}).get(mode) or {}
            for metric, verdict in verdicts.items():
                figure = f"{suite}/{metric}" if mode == summary.get("scoring") else f"{suite}/{mode}/{metric}"
                cells = [_cell((held["figures"].get(r) or {}).get("intervals", {}).get(metric)) for r in names]
                rows.append([figure, _cell(judge.get(metric)), *cells, verdict_words(verdict)])
    return ["figure", "judge", *names, "verdict"], rows


def _cell(interval: Mapping[str, Any] | None) -> str:
    """A figure and its interval ("0.738 [0.638, 0.838]"; no interval: the value alone); "-" where absent."""
    if not interval or interval.get("value") is None or not math.isfinite(interval["value"]):
        return "-"
    low, high = interval.get("ci_low"), interval.get("ci_high")
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return f"{interval['value']:.3f}"
    return f"{interval['value']:.3f} [{low:.3f}, {high:.3f}]"


def is_rule_key(key: str) -> bool:
    """A logged key of a rule's figure (``eval/<suite>/rule/...``) or of a judge figure's difference from the best
    rule (``.../over_rule/...``): shown beside the judge's figures, not as figures of their own."""
    return "/rule/" in key or "/over_rule/" in key


def flat_verdict(flat: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """A logged judge figure's verdict against the best rule, read back from the logged keys of one evaluation (a
    metrics.jsonl record): ``key`` ``eval/<suite>[/<mode>]/<metric>``, the rules' figures
    ``eval/<suite>/rule/<rule>/<metric>`` (the best as `learned` picks it) and the difference
    ``eval/<suite>[/<mode>]/over_rule/<metric>`` with its interval; None where they were not logged."""
    parts = key.split("/")
    if len(parts) < 3 or parts[0] != "eval":
        return None
    named = len(parts) > 3 and parts[2] in SCORING_MODES
    base, metric = "/".join(parts[:3 if named else 2]) + "/", "/".join(parts[3 if named else 2:])
    values = {r: flat[f"eval/{parts[1]}/rule/{r}/{metric}"] for r in RULES
              if isinstance(flat.get(f"eval/{parts[1]}/rule/{r}/{metric}"), (int, float))}
    way = direction(metric)
    over = [flat.get(f"{base}over_rule/{metric}{end}") for end in ("", "/delta_ci_low", "/delta_ci_high")]
    if not values or way not in ("higher", "lower") or not all(isinstance(x, (int, float)) for x in over):
        return None
    best = (max if way == "higher" else min)(values, key=values.get)
    return {"rule": best, "rule_value": values[best], "delta": over[0], "delta_ci_low": over[1],
            "delta_ci_high": over[2], "learned": bool(over[1] > 0 if way == "higher" else over[2] < 0)}
