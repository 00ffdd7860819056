"""JudgeBench (ScalerLab/JudgeBench): pairs of responses to hard questions (knowledge, reasoning, math, coding), the
figures computed as its authors compute them (`judgebench_results`). ``split`` picks the response model (gpt,
claude: a prefix of ``subset``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from judgetrain.config.suites import register
from judgetrain.data.pairwise import load_judgebench
from judgetrain.eval.benchmarks.verdicts import (POSITION_FIGURES, _SWAP, PairSuite, first_position_prob,
                                                 first_position_share, presentation_scores, slug, swap_verdict,
                                                 verdict_from_scores)
from judgetrain.eval.stats import Items, finite_mean, mean_of

_JUDGEBENCH_SOURCES = (("knowledge", "mmlu-pro"), ("reasoning", "livebench-reasoning"), ("math", "livebench-math"),
                       ("coding", "livecodebench"))


def judgebench_category(source: str) -> str | None:
    """JudgeBench's category of a row's ``source``, as its authors' scoring groups them: knowledge (mmlu-pro-*),
    reasoning (livebench-reasoning), math (livebench-math), coding (livecodebench); None for any other source."""
    return next((cat for cat, start in _JUDGEBENCH_SOURCES if str(source).startswith(start)), None)


def judgebench_items(rows: Iterable[Mapping[str, Any]]) -> Items:
    """Per-row figures of JudgeBench (`judgebench_results` has the rules): ``accuracy`` (the row right: 1.0 / 0.0),
    ``inconsistent_rate`` (1.0 / 0.0, 1.0 when an order's verdict was not read; NaN for a row judged in one
    presentation only), ``first_position_rate`` and ``first_position_prob`` (NaN where not measured) and
    ``<category>/accuracy`` (NaN outside the category; a row without ``source`` is counted in its own ``category``,
    the generic pairwise suite's rule). A row without ``verdicts`` but with ``scores`` ([score_a, score_b], a
    score-based judge) gets the one verdict of `verdict_from_scores`. Keys: the row's ``id`` (else its place)."""
    keys, correct, inconsistent, first, lean, categories = [], [], [], [], [], []
    for i, row in enumerate(rows):
        verdicts = row.get("verdicts")
        if verdicts is None and row.get("scores") is not None:
            verdicts = [verdict_from_scores(*row["scores"])]
        if not isinstance(verdicts, (list, tuple)) or len(verdicts) not in (1, 2):
            raise ValueError(f"JudgeBench row {i}: 'verdicts' must hold one or two verdicts, got {verdicts!r}")
        label = row["label"]
        if label not in ("A>B", "B>A"):
            raise ValueError(f"JudgeBench row {i}: 'label' must be 'A>B' or 'B>A', got {label!r}")
        as_row = [verdicts[0]] + [swap_verdict(v) for v in verdicts[1:]]  # the second was shown swapped
        total = sum(1 if v == label else -1 if v == _SWAP[label] else 0 for v in as_row)
        correct.append(float(total > 0))
        # nothing read in an order is no agreement between the orders (as ideation's position_consistency counts it)
        inconsistent.append(float(None in as_row or as_row[0] != as_row[1]) if len(as_row) == 2 else math.nan)
        first.append(first_position_share(verdicts) if len(verdicts) == 2 else math.nan)
        scores = row.get("scores")  # a pointwise judge's two, when its verdicts were derived in both orders
        lean.append(first_position_prob(presentation_scores(scores) if len(verdicts) == 2 else scores))
        # JudgeBench's category of the source; a team's own pairs (no source) keep their own category
        categories.append(judgebench_category(row["source"]) if row.get("source") else row.get("category"))
        keys.append(row.get("id", row.get("pair_id", i)))
    correct_arr, cats = np.asarray(correct, dtype=np.float64), np.asarray(categories, dtype=object)
    values = {"accuracy": correct_arr, "inconsistent_rate": np.asarray(inconsistent, dtype=np.float64)}
    for cat in sorted(set(categories) - {None}):
        values[f"{cat}/accuracy"] = np.where(cats == cat, correct_arr, np.nan)
    binary = tuple(values)
    values.update(zip(POSITION_FIGURES, (np.asarray(first, dtype=np.float64), np.asarray(lean, dtype=np.float64))))
    return Items(keys, values, binary=binary)



def judgebench_results(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """JudgeBench's figures, computed as its authors compute them.

    Each row has ``label`` ("A>B" or "B>A"), ``source`` (e.g. ``mmlu-pro-law``, ``livebench-math``) and ``verdicts``:
    one or two of "A>B", "B>A", "A=B", None, each as the judge gave it about what it was shown (the second is the
    swapped presentation: its "A" is the row's B). Per row: +1 for each verdict that agrees with the label, -1 for
    each that agrees with the opposite, 0 otherwise (a tie, nothing read); the row is correct when the sum is > 0.

    Returns ``accuracy`` (share of correct rows, 0-1), ``{knowledge, reasoning, math, coding}: {accuracy, n}`` for
    the categories present, ``inconsistent_rate`` (share of the rows judged twice whose two verdicts differ once the
    second is read back to the row's order, or one was not read; NaN when none was judged twice), and two figures of
    judgetrain's, not the authors': ``first_position_rate`` (over the rows judged twice, the share of read verdicts
    that pick the response shown first, each row weighted alike; 0.5 is no position bias, see
    `first_position_share`) and in verdict mode ``first_position_prob`` (the same lean in probabilities, see
    `first_position_prob`); ``n`` and ``n_both_orders``."""
    items = judgebench_items(rows)
    out: dict[str, Any] = {"accuracy": mean_of(items.values["accuracy"])}
    for key in items.values:
        if key.endswith("/accuracy"):
            v = items.values[key]
            out[key.split("/")[0]] = {"accuracy": float(np.nanmean(v)), "n": int(np.sum(np.isfinite(v)))}
    out["inconsistent_rate"] = finite_mean(items.values["inconsistent_rate"])
    out.update({key: finite_mean(items.values[key]) for key in POSITION_FIGURES})
    out["n"] = len(items.keys)
    out["n_both_orders"] = int(np.isfinite(items.values["inconsistent_rate"]).sum())
    return out


def record_key(record: dict) -> Any:
    """An item's identity across two evaluations of the same rows."""
    return record.get("id") if record.get("id") is not None else (record.get("row_index"), record.get("pair_id"))


@register
class JudgeBench(PairSuite):
    """JudgeBench: a verdict (or two scores) per row; accuracy per category, inconsistency, position lean."""

    name = "judgebench"
    title = "JudgeBench"
    hub = "ScalerLab/JudgeBench"
    headline = ("accuracy", "knowledge/accuracy", "reasoning/accuracy", "math/accuracy", "coding/accuracy",
                "inconsistent_rate", *POSITION_FIGURES)
    headline_place = 4
    report_headline = (("accuracy", "JudgeBench accuracy (each response scored alone)"),
                       ("verdict/accuracy", "JudgeBench accuracy (verdicts, both orders)"))
    bare_figures = ("accuracy", "inconsistent_rate")

    def load(self, spec: Any, source: Any, **common: Any) -> Any:
        ds = load_judgebench(source, **common)  # split: gpt | claude, the response model's name
        return ds.filter(lambda subset: str(subset or "").startswith(spec.split), input_columns="subset") \
            if spec.split else ds

    def pair_fields(self, row: dict, verdicts: list[str | None]) -> dict[str, Any]:
        return {"label": row["label"], "source": row.get("source"), "category": slug(row.get("category")),
                "subset": row.get("subset"), "verdicts": list(verdicts)}

    def figures(self, records: list[dict], scoring: str) -> dict[str, Any]:
        return judgebench_results(records)

    def log_figures(self, results: Mapping[str, Any], base: str) -> dict[str, float]:
        """JudgeBench's rule: accuracy, per category, inconsistent_rate."""
        out = {base + "accuracy": float(results["accuracy"]),
               base + "inconsistent_rate": float(results["inconsistent_rate"])}
        for cat, vals in results.items():
            if isinstance(vals, Mapping) and "accuracy" in vals:
                out[f"{base}{cat}/accuracy"] = float(vals["accuracy"])
        return out

    def items(self, records: list[dict], mode: str) -> tuple[Items | None, str | None]:
        records = [r for r in records if not r.get("skipped")]  # a row the engine skipped (too long) is no item
        if not all("verdicts" in r or "scores" in r for r in records):
            return None, "its records carry no verdicts"
        return judgebench_items([{**r, "id": record_key(r)} for r in records]), None
