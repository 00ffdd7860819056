"""EvalBiasBench (OffsetBias): pairs built to tempt a judge with a bias (length, concreteness, ...), the figures
computed as OffsetBias computes them (`evalbiasbench_results`). On GitHub only: no bundled copy, no hub id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from judgetrain.config.suites import register
from judgetrain.data.pairwise import load_evalbiasbench
from judgetrain.eval.benchmarks.judgebench import record_key
from judgetrain.eval.benchmarks.verdicts import (POSITION_FIGURES, PairSuite, first_position_prob,
                                                 first_position_share, presentation_scores, slug,
                                                 verdict_from_scores)
from judgetrain.eval.stats import Items, finite_mean, mean_of

_EVALBIASBENCH_FIGURES = ("single_acc", "pair_acc", "agreement")
_PICK = {"A>B": 1, "B>A": 2, "A=B": 3, None: None}  # EvalBiasBench's pick of a verdict about what was shown


def predictions_from_scores(score_1: Any, score_2: Any) -> list[int | None]:
    """A score-based judge's EvalBiasBench picks in both presentations (it reads each response on its own, so the
    order cannot move it): [pick as stored, pick swapped], 1 / 2 the response shown first / second, 3 a tie."""
    verdict = verdict_from_scores(score_1, score_2)
    pick = {"A>B": 1, "B>A": 2, "A=B": 3, None: None}[verdict]
    return [pick, {1: 2, 2: 1}.get(pick, pick)]


def evalbiasbench_items(rows: Iterable[Mapping[str, Any]]) -> Items:
    """Per-row figures of EvalBiasBench (`evalbiasbench_results` has the rules): ``single_acc`` (0, 0.5 or 1: the share
    of the row's two picks that are right), ``pair_acc`` and ``agreement`` (1.0 / 0.0), each also as
    ``<bias>/<figure>`` (NaN outside the bias). Keys: the row's ``id`` (else its place)."""
    keys, single, pair, agree, first_shown, lean, biases = [], [], [], [], [], [], []
    for i, row in enumerate(rows):
        label, picks = row["label"], row.get("predictions")
        if label not in (1, 2) or isinstance(label, bool):
            raise ValueError(f"EvalBiasBench row {i}: 'label' must be 1 or 2, got {label!r}")
        if not isinstance(picks, (list, tuple)) or len(picks) != 2 or any(p not in (1, 2, 3, None) for p in picks):
            raise ValueError(f"EvalBiasBench row {i}: 'predictions' must be two picks (as stored, swapped), each 1, 2, "
                             f"3 (tie) or None, got {picks!r}")
        first, second = picks
        right = [first == label, second in (1, 2) and second + label == 3]
        single.append(sum(right) / 2)
        pair.append(float(all(right)))
        agree.append(float((first in (1, 2) and second in (1, 2) and first + second == 3) or first == second == 3))
        first_shown.append(first_position_share([{1: "A>B", 2: "B>A"}.get(p) for p in picks]))
        lean.append(first_position_prob(presentation_scores(row.get("scores"))))  # two scores: mirrored picks
        biases.append(str(row["bias"]))
        keys.append(row.get("id", i))
    values = {"single_acc": np.asarray(single), "pair_acc": np.asarray(pair), "agreement": np.asarray(agree)}
    cats = np.asarray(biases, dtype=object)
    for bias in sorted(set(biases)):
        for fig in _EVALBIASBENCH_FIGURES:
            values[f"{bias}/{fig}"] = np.where(cats == bias, values[fig], np.nan)
    binary = tuple(k for k in values if not k.endswith("single_acc"))
    values.update(zip(POSITION_FIGURES, (np.asarray(first_shown, dtype=np.float64),
                                         np.asarray(lean, dtype=np.float64))))
    return Items(keys, values, binary=binary)


def evalbiasbench_results(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """EvalBiasBench's figures, computed as OffsetBias computes them.

    Each row has ``bias`` (the category), ``label`` (1 or 2: the better response in the file's order) and
    ``predictions``: the judge's pick in the stored and in the swapped presentation (1 the response shown first, 2
    the second, 3 a tie, None nothing read), each about what it was shown. A pick as stored is right when it equals
    the label; a swapped pick when it names the label's response in its new place (pick + label == 3).

    Returns, overall (all rows pooled) and per bias ``{<bias>: {...}}``: ``single_acc`` (right picks / (2 x rows)),
    ``pair_acc`` (rows whose two picks are both right / rows), ``agreement`` (rows whose two picks name the same
    response, or are both ties / rows) and ``n``; overall also ``first_position_rate`` (judgetrain's figure, not
    OffsetBias': the share of read picks that name the response shown first, each row weighted alike; 0.5 is no
    position bias) and, in verdict mode, ``first_position_prob`` (the same lean in probabilities); ``biases`` lists
    the biases present. Shares 0-1 (the paper: x100)."""
    items = evalbiasbench_items(rows)
    out: dict[str, Any] = {k: mean_of(items.values[k]) for k in _EVALBIASBENCH_FIGURES}
    out.update({key: finite_mean(items.values[key]) for key in POSITION_FIGURES})
    biases = sorted({k.rsplit("/", 1)[0] for k in items.values if "/" in k})
    for bias in biases:
        v = {k: float(np.nanmean(items.values[f"{bias}/{k}"])) for k in _EVALBIASBENCH_FIGURES}
        out[bias] = {**v, "n": int(np.sum(np.isfinite(items.values[f"{bias}/single_acc"])))}
    out["biases"] = biases
    out["n"] = len(items.keys)
    return out


@register
class EvalBiasBench(PairSuite):
    """EvalBiasBench: the pick in each presentation; single / pair accuracy and agreement, overall and per bias."""

    name = "evalbiasbench"
    title = "EvalBiasBench (OffsetBias)"
    hub = "evalbiasbench"
    headline = (*_EVALBIASBENCH_FIGURES, *POSITION_FIGURES)
    headline_place = 3
    report_headline = (("pair_acc", "EvalBiasBench pair accuracy (each response scored alone)"),
                       ("verdict/single_acc", "EvalBiasBench single accuracy (verdicts, both orders)"),
                       ("verdict/pair_acc", "EvalBiasBench pair accuracy (verdicts, both orders)"))
    example_figure = "pair_acc"
    bare_figures = _EVALBIASBENCH_FIGURES

    def load(self, spec: Any, source: Any, **common: Any) -> Any:
        return load_evalbiasbench(source, **common)

    def pair_fields(self, row: dict, verdicts: list[str | None]) -> dict[str, Any]:
        """``bias`` (slugged: no spaces), ``label`` 1 / 2 and ``predictions`` (the pick in the stored and in the
        swapped presentation; one verdict from two scores is mirrored: the order cannot move a judge that scores each
        response alone)."""
        picks = [_PICK[v] for v in verdicts]
        if len(picks) == 1:
            picks.append({1: 2, 2: 1}.get(picks[0], picks[0]))
        return {"bias": slug(row.get("category")), "label": 1 if row["label"] == "A>B" else 2, "predictions": picks}

    def figures(self, records: list[dict], scoring: str) -> dict[str, Any]:
        return evalbiasbench_results(records)

    def log_figures(self, results: Mapping[str, Any], base: str) -> dict[str, float]:
        """OffsetBias's three figures, overall and per bias (slugged names)."""
        out = {base + key: float(results[key]) for key in _EVALBIASBENCH_FIGURES}
        for bias in results.get("biases", []):
            for key in _EVALBIASBENCH_FIGURES:
                out[f"{base}{bias}/{key}"] = float(results[bias][key])
        return out

    def items(self, records: list[dict], mode: str) -> tuple[Items | None, str | None]:
        records = [r for r in records if not r.get("skipped")]  # a row the engine skipped (too long) is no item
        if not all("predictions" in r for r in records):
            return None, "its records carry no predictions"
        return evalbiasbench_items([{**r, "id": record_key(r), "label": {"A>B": 1, "B>A": 2}.get(r["label"], r["label"])}
                                    for r in records]), None
