"""Ideation (tintin1027/research-ideation-arena-si-rm): research proposals, the chosen and the rejected one per row.
Plain rows score each proposal (implicit reward, or the rubric score in judge mode); pairwise rows (``order`` AB / BA,
the prompt already asks for a verdict) compare the log-probabilities of the two forced verdicts in judge mode. In
generate mode the judge is asked for a pairwise verdict in both orders and the letter picked is parsed. The unit is
a pair (both orders).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from judgetrain import data
from judgetrain.config.suites import register
from judgetrain.data.ideation import pairwise_prompt
from judgetrain.data.sampling import balanced_sample
from judgetrain.data.scoreparse import parse_verdict
from judgetrain.eval.benchmarks.base import CurvePlot, Suite, nan_or, rubric_prompt, text_of
from judgetrain.eval.requests import Request, RowScore
from judgetrain.eval.stats import Items, mean_of

FIGURES = ("accuracy", "position_consistency")


def is_pairwise(row: dict) -> bool:
    """A pairwise Ideation row: one order of a pair, its prompt asking for a verdict."""
    return row.get("order") in ("AB", "BA")


def ideation_orders(row: dict) -> list[tuple[str, str, Any]]:
    """(order, preferred letter, verdict prompt) of each pairwise verdict asked about an ideation row."""
    if is_pairwise(row):
        return [(row["order"], row.get("preferred") or ("A" if row["order"] == "AB" else "B"), row["prompt"])]
    context, chosen, rejected = text_of(row["prompt"]), text_of(row["chosen"]), text_of(row["rejected"])
    return [("AB", "A", pairwise_prompt(context, chosen, rejected)),
            ("BA", "B", pairwise_prompt(context, rejected, chosen))]


def ideation_accuracy(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Ideation accuracy: share of rows with score_chosen > score_rejected (tie = wrong).

    When rows carry ``order`` ("AB"/"BA": pairwise mode, each pair shown in both orders) and ``pair_id``, also
    ``position_consistency``: the share of pairs seen in both orders whose verdict picks the same proposal in both
    (i.e. right in both or wrong in both). Returns ``{accuracy, n_rows[, position_consistency, n_pairs_both_orders]}``.
    """
    correct = []
    by_pair: dict[Any, dict[str, bool]] = defaultdict(dict)
    has_order = False
    for row in rows:
        ok = bool(float(row["score_chosen"]) > float(row["score_rejected"]))
        correct.append(ok)
        if row.get("order") in ("AB", "BA") and row.get("pair_id") is not None:
            has_order = True
            by_pair[row["pair_id"]][row["order"]] = ok
    out: dict[str, Any] = {"accuracy": mean_of(correct), "n_rows": len(correct)}
    if has_order:
        both = [v for v in by_pair.values() if len(v) == 2]
        out["position_consistency"] = mean_of([v["AB"] == v["BA"] for v in both])
        out["n_pairs_both_orders"] = len(both)
    return out



def ideation_generated(verdicts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Pairwise verdicts the judge wrote, each pair shown in both orders.

    Each verdict holds ``pair_id``, ``order`` ("AB": the preferred proposal is A, "BA": it is B), ``preferred``
    (the preferred proposal's letter in that order) and ``choice`` ("A", "B", or None when unread). ``accuracy``: share
    of verdicts that pick the preferred proposal (unread = wrong); ``position_consistency``: share of pairs (seen in
    both orders) whose two verdicts pick the same proposal (an unread verdict: not consistent);
    ``first_position_rate``: share of read verdicts that pick the proposal shown first (A); 0.5 is no position bias.
    """
    correct, first = [], []
    picks: dict[Any, dict[str, Any]] = defaultdict(dict)
    for v in verdicts:
        choice, preferred = v.get("choice"), v["preferred"]
        correct.append(choice == preferred)
        if choice is not None:
            first.append(choice == "A")
        # the proposal picked, named by order-free identity: "preferred" or "other"
        picks[v["pair_id"]][v["order"]] = None if choice is None else ("preferred" if choice == preferred else "other")
    both = [p for p in picks.values() if len(p) == 2]
    return {
        "accuracy": mean_of(correct),
        "position_consistency": mean_of([p["AB"] is not None and p["AB"] == p["BA"] for p in both]),
        "first_position_rate": mean_of(first),
        "n_verdicts": len(correct),
        "n_pairs_both_orders": len(both),
    }


def ideation_items(records: list[dict], mode: str) -> Items:
    """Per-verdict Ideation figures for intervals and paired differences; the unit is a pair (both orders)."""
    keys, right, pairs = [], [], []
    if mode == "generate":
        for r in records:
            pair = r.get("pair_id")
            for o in r["outputs"]:
                keys.append((r.get("row_index"), pair, o.get("order")))
                right.append(float(o.get("choice") is not None and o.get("choice") == o.get("preferred")))
                pairs.append(pair)
        return Items(keys, {"accuracy": np.asarray(right)}, clusters=np.asarray(pairs, dtype=object),
                     binary=("accuracy",))
    records = [r for r in records if not r.get("skipped")]
    by_pair: dict[Any, dict[str, float]] = {}
    for r in records:
        ok = float(nan_or(r.get("score_chosen")) > nan_or(r.get("score_rejected")))
        pair = r.get("pair_id") if r.get("pair_id") is not None else r.get("row_index")
        keys.append((r.get("row_index"), r.get("sample_id"), r.get("order")))
        right.append(ok)
        pairs.append(pair)
        if r.get("order") in ("AB", "BA"):
            by_pair.setdefault(pair, {})[r["order"]] = ok
    values = {"accuracy": np.asarray(right, dtype=np.float64)}
    if by_pair:  # a pair's consistency counted once, on its AB row
        values["position_consistency"] = np.asarray(
            [float(by_pair[p]["AB"] == by_pair[p]["BA"]) if r.get("order") == "AB" and len(by_pair[p]) == 2
             else math.nan for p, r in zip(pairs, records)], dtype=np.float64)
    return Items(keys, values, clusters=np.asarray([str(p) for p in pairs], dtype=object), binary=tuple(values))


@register
class Ideation(Suite):
    """Ideation: two proposals per row, plain or one order of a pair; no groups, whole pairs drawn."""

    name = "ideation"
    title = "Ideation test"
    hub = "tintin1027/research-ideation-arena-si-rm"
    bundled = "judgetrain's bundled synthetic sample in the Research Ideation Arena schema"
    train_hub = "tintin1027/research-ideation-arena-si-rm"
    default_split = "test"
    takes_mode = True
    unit = "a pair (both orders)"
    headline = FIGURES
    headline_place = 2
    report_headline = (("accuracy", "Ideation accuracy"),
                       ("generate/parse_rate", "Ideation parse rate (written verdicts)"))
    curves = True
    generate_table = ("accuracy", "position_consistency", "first_position_rate")
    bare_figures = FIGURES

    def curve_plots(self, keys: list[str], rows: list[dict]) -> list[CurvePlot]:
        idea_keys = [k for k in keys if k.startswith(f"eval/{self.name}/")]
        return [CurvePlot(f"{self.name}.png", "Research-ideation test accuracy (and position consistency in pairwise "
                          "mode)", "Ideation", [(k[len("eval/"):], [(k, k)]) for k in idea_keys], unit="accuracy")]

    def trained_mode(self, components: Iterable[Mapping[str, Any]]) -> str | None:
        modes = [c["mode"] for c in components if c.get("dataset") == self.name and c.get("mode")]
        return modes[-1] if modes else None

    def load(self, spec: Any, source: Any, **common: Any) -> Any:
        return data.load_ideation(source, split=spec.split or self.default_split, mode=spec.mode, **common)

    def select_rows(self, rows: list[dict], max_rows: int | None, seed: int = 0) -> list[int]:
        """Whole pairs (a pairwise row's two orders stay together: position consistency needs both), drawn evenly."""
        if max_rows is None or max_rows >= len(rows):
            return super().select_rows(rows, max_rows, seed)
        units: dict[Any, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            units[r.get("pair_id", i)].append(i)
        per_unit = max(1, round(len(rows) / len(units)))
        picked = balanced_sample([None] * len(units), max(1, max_rows // per_unit), seed)
        unit_rows = list(units.values())
        return sorted(i for u in picked for i in unit_rows[u])

    def request(self, row: dict, scoring: str) -> Request:
        if scoring == "judge":
            if is_pairwise(row):  # the prompt already asks for a verdict: compare the two forced verdicts
                return Request("loglik_sum", prompt=row["prompt"], responses=[row["chosen"], row["rejected"]])
            return Request("judge", judge_prompts=[rubric_prompt(row["prompt"], row[k]) for k in ("chosen", "rejected")])
        return Request("implicit", prompt=row["prompt"], responses=[row["chosen"], row["rejected"]])

    def row_fields(self, row: dict, score: RowScore, scoring: str) -> dict[str, Any]:
        s = score.scores
        rec = {"sample_id": row.get("sample_id"), "pair_id": row.get("pair_id"),
               "score_chosen": s[0] if s else None, "score_rejected": s[1] if s else None}
        if is_pairwise(row):
            rec.update(order=row["order"], preferred=row.get("preferred"))
        return rec

    def rule_texts(self, row: dict) -> list[Any] | None:
        """None for a pairwise row: its chosen and rejected are verdicts, the proposals inside its prompt."""
        return None if is_pairwise(row) else super().rule_texts(row)

    def figures(self, records: list[dict], scoring: str) -> dict[str, Any]:
        return ideation_accuracy(records)

    def generate_prompts(self, row: dict, prompt: str | None = None) -> list[Any]:
        return [verdict_prompt for _, _, verdict_prompt in ideation_orders(row)]

    def generate_fields(self, index: int, row: dict, outputs: list[dict]) -> dict[str, Any]:
        return {"sample_id": row.get("sample_id"), "pair_id": row.get("pair_id") or row.get("sample_id") or index}

    def generate_output(self, row: dict, slot: int, generated: Any, expected: list | None) -> dict[str, Any]:
        order, preferred, _ = ideation_orders(row)[slot]
        verdict = parse_verdict(generated.text)
        return {"order": order, "preferred": preferred, "choice": verdict.choice, "reason": verdict.reason,
                "expected": None if expected is None else expected[0] - expected[1]}

    def generated_value(self, out: dict) -> float | None:
        """+1 picked the preferred proposal, -1 the other, None unread."""
        return None if out["choice"] is None else (1.0 if out["choice"] == out["preferred"] else -1.0)

    def generated_figures(self, records: list[dict]) -> dict[str, Any]:
        return ideation_generated([{**o, "pair_id": r["pair_id"]} for r in records for o in r["outputs"]])

    def log_figures(self, results: Mapping[str, Any], base: str) -> dict[str, float]:
        return {base + key: float(results[key]) for key in FIGURES if key in results}

    def items(self, records: list[dict], mode: str) -> tuple[Items | None, str | None]:
        return ideation_items(records, mode), None
