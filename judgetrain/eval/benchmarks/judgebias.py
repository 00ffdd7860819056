"""JudgeBias (iknow-lab/JudgeBias-DPO-RefFree): judge prompts over perturbed recipes, the chosen and the rejected
evaluation of each. Implicit mode: does the chosen evaluation score higher. Judge mode: the JudgeBias prompt already is
a judge prompt (rubric + the perturbed recipe), so the engine reads the judge's expected ``overall_score`` for it
(``judge_score``); the records keep the dataset's recorded overall scores of the chosen and rejected evaluations as
``score_chosen`` / ``score_rejected`` and the figures ask whether the judge lands closer to the chosen verdict, how far
it is from ``anchor_score`` on representational rows (``represent/anchor_mae``) and whether it drops >= 0.5 below the
anchor on error rows (``error/detect_rate``). See `judgebias_checks`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np

from judgetrain import data
from judgetrain.config.suites import register
from judgetrain.eval.benchmarks.base import CurvePlot, Suite, mean_sd, nan_or
from judgetrain.eval.requests import Request, RowScore
from judgetrain.eval.stats import Items, as_score, mean_of

JUDGEBIAS_CATEGORIES = ("error", "represent")
DETECT_THRESHOLD = 0.5  # an error row counts as detected when the judge scores it this far below the anchor
_FIGURES = ("accuracy", "margin", "anchor_mae", "detect_rate")


def judgebias_checks(rows: Iterable[Mapping[str, Any]], scoring: str = "implicit") -> dict[str, Any]:
    """Perturbation checks on JudgeBias validation rows.

    Every row has ``perturbation_category`` (``error`` / ``represent``), ``perturbation_type``, ``score_chosen``
    and ``score_rejected``.

    ``scoring="implicit"``: ``score_chosen`` / ``score_rejected`` are the model's scores of the chosen and of
    the rejected evaluation. A row is right when chosen > rejected (tie = wrong); margin = chosen - rejected.

    ``scoring="judge"``: each row also holds ``judge_score`` (the overall score the judge itself gives the
    recipe in the prompt) and ``anchor_score``; ``score_chosen`` / ``score_rejected`` are then the dataset's
    recorded overall scores of the chosen and rejected evaluations. A row is right when the judge's score is
    strictly closer to the chosen evaluation's score than to the rejected one's; margin =
    |judge - rejected| - |judge - chosen| (positive: the judge sides with the chosen verdict). Judge mode adds
    ``represent/anchor_mae`` = mean |judge - anchor| over represent rows (lower is better) and
    ``error/detect_rate`` = share of error rows with judge <= anchor - 0.5.

    Returns ``{<category>: {accuracy, margin, n_rows}, "type": {<type>: {accuracy, margin, n_rows}},
    "n_rows": int}`` plus, in judge mode, ``represent.anchor_mae`` and ``error.detect_rate``.
    Categories absent from the rows are simply absent (never a crash).
    """
    if scoring not in ("implicit", "judge"):
        raise ValueError(f"scoring must be 'implicit' or 'judge', got {scoring!r}")
    by_cat: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    by_type: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    n = 0
    for row in rows:
        n += 1
        chosen, rejected = float(row["score_chosen"]), float(row["score_rejected"])
        if scoring == "implicit":
            correct, margin = chosen > rejected, chosen - rejected
        else:
            judge = float(row["judge_score"])
            d_chosen, d_rejected = abs(judge - chosen), abs(judge - rejected)
            correct, margin = d_chosen < d_rejected, d_rejected - d_chosen
        cat, ptype = str(row["perturbation_category"]), str(row["perturbation_type"])
        for bucket in (by_cat[cat], by_type[ptype]):
            bucket["correct"].append(bool(correct))  # NaN comparisons are False: wrong
            bucket["margin"].append(margin)
        if scoring == "judge":
            anchor = float(row["anchor_score"])
            by_cat[cat]["abs_err"].append(abs(judge - anchor))
            by_cat[cat]["detected"].append(bool(judge <= anchor - DETECT_THRESHOLD))

    out: dict[str, Any] = {}
    for cat in sorted(by_cat):
        b = by_cat[cat]
        out[cat] = {"accuracy": mean_of(b["correct"]), "margin": mean_of(b["margin"]), "n_rows": len(b["correct"])}
        if scoring == "judge" and cat == "represent":
            out[cat]["anchor_mae"] = mean_of(b["abs_err"])
        if scoring == "judge" and cat == "error":
            out[cat]["detect_rate"] = mean_of(b["detected"])
    out["type"] = {
        t: {"accuracy": mean_of(b["correct"]), "margin": mean_of(b["margin"]), "n_rows": len(b["correct"])}
        for t, b in sorted(by_type.items())
    }
    out["n_rows"] = n
    return out



def judgebias_generated(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """JudgeBias figures of the scores the judge wrote (``score``, None when its text could not be read).

    Rows hold ``perturbation_category``, ``perturbation_type``, ``anchor_score`` and ``score``. Per category and per
    type: ``n`` (rows) and ``parse_rate``; represent rows (the recipe changed only in its surface) ``anchor_mae`` =
    mean |score - anchor| over the read scores and ``within_half_rate`` = share of rows with |score - anchor| <= 0.5;
    error rows (a real mistake put in) ``detect_rate`` = share of rows scored below the anchor and ``mean_drop`` =
    mean (anchor - score) over the read scores. A rate counts an unread score as a failure (not within, not detected);
    a mean leaves it out (NaN when nothing was read). Returns ``{<category>: {...}, "type": {<type>: {...}}, "n_rows"}``.
    """
    groups: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    categories: dict[str, str] = {}
    n = 0
    for row in rows:
        n += 1
        cat, ptype = str(row["perturbation_category"]), str(row["perturbation_type"])
        pair = (as_score(row.get("score")), float(row["anchor_score"]))
        groups[("cat", cat)].append(pair)
        groups[("type", ptype)].append(pair)
        categories[ptype] = cat

    def figures(cat: str, pairs: list[tuple[float, float]]) -> dict[str, Any]:
        score, anchor = np.asarray(pairs, dtype=np.float64).reshape(-1, 2).T
        read = np.isfinite(score)
        out: dict[str, Any] = {"n": len(pairs), "parse_rate": mean_of(read)}
        diff = score[read] - anchor[read]
        if cat == "represent":
            out["anchor_mae"] = mean_of(np.abs(diff))
            out["within_half_rate"] = mean_of(np.abs(score - anchor) <= DETECT_THRESHOLD)  # NaN compares False
        elif cat == "error":
            out["detect_rate"] = mean_of(score < anchor)
            out["mean_drop"] = mean_of(-diff)
        return out

    out: dict[str, Any] = {cat: figures(cat, groups[("cat", cat)]) for kind, cat in sorted(groups) if kind == "cat"}
    out["type"] = {t: figures(categories[t], groups[("type", t)]) for kind, t in sorted(groups) if kind == "type"}
    out["n_rows"] = n
    return out


def judgebias_items(records: list[dict], mode: str) -> Items:
    """Per-row JudgeBias figures for intervals and paired differences; the unit is a sample within a perturbation
    set (its rows at each perturbation rate)."""
    keys, cats, right, units, extra = [], [], [], [], {"represent/anchor_mae": [], "error/detect_rate": [],
                                            "represent/within_half_rate": []}
    records = [r for r in records if not r.get("skipped")]
    for r in records:
        keys.append((r.get("row_index"), r.get("sample_id"), r.get("perturbation_type")))
        sample = r.get("sample_id")  # a row without its sample is its own unit
        units.append(f"row {r.get('row_index')!r}" if sample is None else f"{sample!r}|{r.get('perturbation_type')}")
        cat = r.get("perturbation_category")
        cats.append(cat)
        anchor = nan_or(r.get("anchor_score"))
        if mode == "generate":
            score = nan_or(r["outputs"][0].get("score"))
            right.append(math.nan)
            within = float(abs(score - anchor) <= 0.5) if cat == "represent" else math.nan  # NaN compares False
            extra["represent/within_half_rate"].append(within)
            extra["error/detect_rate"].append(float(score < anchor) if cat == "error" else math.nan)
            extra["represent/anchor_mae"].append(abs(score - anchor) if cat == "represent" else math.nan)
            continue
        chosen, rejected = nan_or(r.get("score_chosen")), nan_or(r.get("score_rejected"))
        if mode == "judge":
            judge = nan_or(r.get("judge_score"))
            right.append(float(abs(judge - chosen) < abs(judge - rejected)))
            extra["represent/anchor_mae"].append(abs(judge - anchor) if cat == "represent" else math.nan)
            extra["error/detect_rate"].append(float(judge <= anchor - 0.5) if cat == "error" else math.nan)
        else:
            right.append(float(chosen > rejected))
    cats_arr, right_arr = np.asarray(cats, dtype=object), np.asarray(right, dtype=np.float64)
    values: dict[str, np.ndarray] = {}
    if mode != "generate":
        for cat in sorted({c for c in cats if c is not None}):
            values[f"{cat}/accuracy"] = np.where(cats_arr == cat, right_arr, np.nan)
    for name, column in extra.items():
        arr = np.asarray(column, dtype=np.float64)
        if len(arr) and np.isfinite(arr).any():
            values[name] = arr
    binary = tuple(k for k in values if not k.endswith("anchor_mae"))
    return Items(keys, values, clusters=np.asarray(units, dtype=object), binary=binary)


@register
class JudgeBias(Suite):
    """JudgeBias: a judge prompt and two evaluations per row; the unit is a sample within a perturbation set."""

    name = "judgebias"
    title = "JudgeBias validation"
    hub = "iknow-lab/JudgeBias-DPO-RefFree"
    bundled = "judgetrain's bundled synthetic sample in the JudgeBias-DPO-RefFree schema"
    train_hub = "iknow-lab/JudgeBias-DPO-RefFree"
    default_split = "validation"
    unit = "a sample within a perturbation set (its rows at each perturbation rate)"
    headline = ("error/accuracy", "represent/accuracy", "represent/anchor_mae", "error/detect_rate",
                "represent/within_half_rate")
    headline_place = 1
    report_headline = (("error/accuracy", "JudgeBias error accuracy"),
                       ("represent/accuracy", "JudgeBias represent accuracy"),
                       ("generate/parse_rate", "JudgeBias parse rate (written evaluations)"))
    example_figure = "error/accuracy"
    curves = True
    generate_table = ("represent/accuracy", "error/accuracy", "represent/anchor_mae", "represent/within_half_rate",
                      "error/detect_rate", "error/mean_drop")

    def judge_scores(self, records: list[dict]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"all": []}
        for row in records:
            score = row.get("judge_score")
            out["all"].append(score)
            out.setdefault(str(row.get("perturbation_category")), []).append(score)
        return out

    def flat_judge_line(self, spreads: str, scores: dict[str, list[float]]) -> str:
        by = {c: mean_sd(scores.get(c, [])) for c in ("error", "represent")}
        split = (f"; errors {by['error'][0]:.3f}, rewrites {by['represent'][0]:.3f}"
                 if by["error"] and by["represent"] else "")
        return ("JudgeBias in judge mode: the judge gives every item nearly one score ("
                f"{spreads}{split}): it does not tell an error from a rewrite, so its error figures and its "
                "representational figures move with that one score, in opposite directions: lower, it flags more "
                "errors and puts every rewrite further below its anchor (higher, the reverse). A judge that learns "
                "the difference moves them apart.")

    def curve_plots(self, keys: list[str], rows: list[dict]) -> list[CurvePlot]:
        prefix = f"eval/{self.name}/"
        cat_keys = [k for k in keys if k.startswith(prefix) and k.split("/")[2] != "type"]
        cats = {str(r["perturbation_type"]): str(r.get("perturbation_category", ""))
                for r in rows if r.get("perturbation_type") is not None}
        type_keys = [k for k in keys if k.startswith(prefix + "type/") and k.endswith("/accuracy")]
        type_keys.sort(key=lambda k: (cats.get(k.split("/")[3], "~"), k))
        return [CurvePlot(f"{self.name}_categories.png", "JudgeBias validation per perturbation category: accuracy "
                          "(chosen scored above rejected) and mean margin", "JudgeBias per category",
                          [(k[len(prefix):], [(k, k)]) for k in cat_keys]),
                CurvePlot(f"{self.name}_types.png", "JudgeBias accuracy per perturbation type (category in brackets)",
                          "JudgeBias accuracy per perturbation type",
                          [(k.split("/")[3] + (f" ({cats[k.split('/')[3]]})" if k.split("/")[3] in cats else ""),
                            [(k, k)]) for k in type_keys], unit="accuracy")]

    def load(self, spec: Any, source: Any, **common: Any) -> Any:
        return data.load_judgebias(source, split=spec.split or self.default_split, **common)

    def group_key(self, row: dict) -> Hashable:
        return row.get("perturbation_type")

    def request(self, row: dict, scoring: str) -> Request:
        if scoring == "judge":
            return Request("judge", judge_prompts=[row["prompt"]])
        return Request("implicit", prompt=row["prompt"], responses=[row["chosen"], row["rejected"]])

    def row_fields(self, row: dict, score: RowScore, scoring: str) -> dict[str, Any]:
        s = score.scores
        rec = self.generate_fields(0, row, [])
        if scoring == "judge":  # score_* are the dataset's recorded verdicts, judge_score the model's
            rec.update(score_chosen=row.get("score_chosen"), score_rejected=row.get("score_rejected"),
                       judge_score=s[0] if s else None)
        else:
            rec.update(score_chosen=s[0] if s else None, score_rejected=s[1] if s else None)
        return rec

    def figures(self, records: list[dict], scoring: str) -> dict[str, Any]:
        return judgebias_checks(records, scoring=scoring)

    def generate_fields(self, index: int, row: dict, outputs: list[dict]) -> dict[str, Any]:
        return {"sample_id": row.get("sample_id"), "perturbation_category": row.get("perturbation_category"),
                "perturbation_type": row.get("perturbation_type"), "anchor_score": row.get("anchor_score")}

    def generated_figures(self, records: list[dict]) -> dict[str, Any]:
        return judgebias_generated([{**r, "score": r["outputs"][0]["score"]} for r in records])

    def log_figures(self, results: Mapping[str, Any], base: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for cat, vals in results.items():
            if cat == "type" or not isinstance(vals, Mapping):
                continue
            for key in _FIGURES:
                if key in vals:
                    out[f"{base}{cat}/{key}"] = float(vals[key])
        for ptype, vals in results.get("type", {}).items():
            out[f"{base}type/{ptype}/accuracy"] = float(vals["accuracy"])
        return out

    def items(self, records: list[dict], mode: str) -> tuple[Items | None, str | None]:
        return judgebias_items(records, mode), None
