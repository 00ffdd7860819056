"""Evaluation metrics: the RM-Bench style matrix, JudgeBias perturbation checks, Ideation accuracy.

Pure numpy (no torch): the report, the callback and the CLI all read their figures from here, and the names
of the returned keys and of the logged keys (see `flatten_eval_metrics`) are a public interface: docs/evaluation.md lists
them ("Where metrics go"), and runs, reports and dashboards are read by them.

Ties always count as wrong (a judge that cannot tell two responses apart has not preferred the right one),
exactly as the reference ``compute_accuracy`` of RM-Bench, which compares with a strict ``>``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MATRIX_SIZE = 3  # RM-Bench style order: [concise, detailed plain, detailed markdown]
RMBENCH_DOMAINS = ("chat", "math", "code", "safety")  # the official order
JUDGEBIAS_CATEGORIES = ("error", "represent")
DETECT_THRESHOLD = 0.5  # an error row counts as detected when the judge scores it this far below the anchor

__all__ = [
    "RMBENCH_DOMAINS",
    "rmbench_accuracy",
    "rmbench_domain",
    "rmbench_results",
    "rmbench_matrices",
    "judgebias_checks",
    "ideation_accuracy",
    "flatten_eval_metrics",
    "to_trainer_log_keys",
    "spearman",
    "generation_summary",
    "judgebias_generated",
    "ideation_generated",
    "flatten_mode_metrics",
    "Items",
    "swap_verdict",
    "verdict_from_scores",
    "judgebench_category",
    "judgebench_items",
    "judgebench_results",
    "predictions_from_scores",
    "evalbiasbench_items",
    "evalbiasbench_results",
    "bootstrap_ci",
    "items_intervals",
    "paired_difference",
    "mcnemar_p",
    "sign_test_p",
    "smallest_p",
    "sign_flip_p",
    "style_spread",
    "rmbench_items",
    "rmbench_intervals",
    "interval_keys",
    "N_RESAMPLES",
]


# --------------------------------------------------------------------------------------------------- RM-Bench
def rmbench_accuracy(score_chosen: Any, score_rejected: Any) -> dict[str, Any]:
    """RM-Bench hard / normal / easy accuracy of one set of rows.

    ``score_chosen`` and ``score_rejected`` are (N, 3) arrays in style order [concise, detailed plain,
    detailed markdown]. ``matrix[i][j]`` is the share of rows whose chosen response in style i scores strictly
    above the rejected response in style j (ties and NaN count as wrong). hard = mean of the strict upper
    triangle (chosen less styled than rejected), normal = diagonal mean, easy = strict lower triangle mean.
    With N = 0 every figure is NaN (nothing was measured), never a ZeroDivisionError.
    """
    chosen = np.asarray(score_chosen, dtype=np.float64)
    rejected = np.asarray(score_rejected, dtype=np.float64)
    if chosen.size == 0 and rejected.size == 0:
        chosen = chosen.reshape(0, MATRIX_SIZE)
        rejected = rejected.reshape(0, MATRIX_SIZE)
    if chosen.ndim != 2 or chosen.shape != rejected.shape or chosen.shape[1] != MATRIX_SIZE:
        raise ValueError(
            f"rmbench_accuracy expects two (N, {MATRIX_SIZE}) arrays, got {chosen.shape} and {rejected.shape}"
        )
    n = chosen.shape[0]
    if n == 0:
        matrix = np.full((MATRIX_SIZE, MATRIX_SIZE), np.nan)
    else:
        # wins[r, i, j] = chosen[r, i] > rejected[r, j]; NaN compares False, i.e. wrong
        wins = chosen[:, :, None] > rejected[:, None, :]
        matrix = wins.sum(axis=0) / n
    off = MATRIX_SIZE * (MATRIX_SIZE - 1) / 2
    return {
        "hard_acc": float(np.sum(np.triu(matrix, 1)) / off),
        "normal_acc": float(np.mean(np.diag(matrix))),
        "easy_acc": float(np.sum(np.tril(matrix, -1)) / off),
        "matrix": matrix.tolist(),
    }


def rmbench_domain(domain: str) -> str:
    """Reporting domain of an RM-Bench row: ``safety-refuse`` and ``safety-response`` pool into ``safety``."""
    domain = str(domain)
    if "/" in domain:  # an id of the form "chat/100" passed as domain
        domain = domain.split("/", 1)[0]
    return "safety" if domain.startswith("safety") else domain


def rmbench_results(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """RM-Bench figures per domain and overall.

    ``rows``: mappings with ``domain`` (chat, math, code, safety-refuse, safety-response; or ``safety``),
    ``score_chosen`` and ``score_rejected`` (3 floats each, style order). Safety rows are pooled (as rows, like the
    official script) into ``safety``. Returns, for each domain present among chat/math/code/safety,
    ``{hard_acc, normal_acc, easy_acc, avg_acc, n_rows, matrix}``; overall ``hard_acc``, ``normal_acc``,
    ``easy_acc``, ``total_avg_acc`` = unweighted means over the domains present; ``domains`` (present, official
    order), ``missing_domains`` (absent: they are left out of the means, never a crash; when every domain is
    missing the overall figures are NaN), ``n_rows`` and ``other_domains`` (domains outside the four,
    reported per domain but kept out of the overall means).
    """
    chosen: dict[str, list] = defaultdict(list)
    rejected: dict[str, list] = defaultdict(list)
    for row in rows:
        domain = rmbench_domain(row.get("domain") or row.get("id", ""))
        chosen[domain].append(list(row["score_chosen"]))
        rejected[domain].append(list(row["score_rejected"]))

    out: dict[str, Any] = {}
    present = [d for d in RMBENCH_DOMAINS if d in chosen]
    others = sorted(d for d in chosen if d not in RMBENCH_DOMAINS)
    for domain in present + others:
        acc = rmbench_accuracy(chosen[domain], rejected[domain])
        acc["avg_acc"] = (acc["hard_acc"] + acc["normal_acc"] + acc["easy_acc"]) / 3
        acc["n_rows"] = len(chosen[domain])
        out[domain] = acc
    for key in ("hard_acc", "normal_acc", "easy_acc"):
        out[key] = float(np.mean([out[d][key] for d in present])) if present else math.nan
    out["total_avg_acc"] = float(np.mean([out[d]["avg_acc"] for d in present])) if present else math.nan
    out["domains"] = present
    out["missing_domains"] = [d for d in RMBENCH_DOMAINS if d not in chosen]
    out["other_domains"] = others
    out["n_rows"] = int(sum(len(v) for v in chosen.values()))
    return out


# ------------------------------------------------------------------------------------------------- JudgeBias
def rmbench_matrices(rows: Iterable[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """{"overall": 3x3, <domain>: 3x3, ...} from RM-Bench per-row scores (safety-refuse/-response pooled).

    The overall matrix is the unweighted mean of the domain matrices (chat/math/code/safety present), so its
    triangle means equal the logged ``eval/rmbench/{hard,normal,easy}_acc``."""
    # skipped rows (score None) are left out, as the eval engine's own metrics do
    rows = [r for r in rows if not r.get("skipped") and _is_triple(r.get("score_chosen"))
            and _is_triple(r.get("score_rejected"))]
    res = rmbench_results(rows)
    domains = list(res.get("domains", [])) + list(res.get("other_domains", []))
    out: dict[str, np.ndarray] = {}
    if res.get("domains"):
        out["overall"] = np.mean([np.asarray(res[d]["matrix"], dtype=float) for d in res["domains"]], axis=0)
    for d in domains:
        out[d] = np.asarray(res[d]["matrix"], dtype=float)
    return out


def _is_triple(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 3


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _finite_mean(values: np.ndarray) -> float:
    """The mean of the finite values (NaN: the row does not count), NaN when there is none."""
    return _mean(values[np.isfinite(values)])


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
        out[cat] = {"accuracy": _mean(b["correct"]), "margin": _mean(b["margin"]), "n_rows": len(b["correct"])}
        if scoring == "judge" and cat == "represent":
            out[cat]["anchor_mae"] = _mean(b["abs_err"])
        if scoring == "judge" and cat == "error":
            out[cat]["detect_rate"] = _mean(b["detected"])
    out["type"] = {
        t: {"accuracy": _mean(b["correct"]), "margin": _mean(b["margin"]), "n_rows": len(b["correct"])}
        for t, b in sorted(by_type.items())
    }
    out["n_rows"] = n
    return out


# -------------------------------------------------------------------------------------------------- Ideation
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
    out: dict[str, Any] = {"accuracy": _mean(correct), "n_rows": len(correct)}
    if has_order:
        both = [v for v in by_pair.values() if len(v) == 2]
        out["position_consistency"] = _mean([v["AB"] == v["BA"] for v in both])
        out["n_pairs_both_orders"] = len(both)
    return out


# ------------------------------------------------------------------------------------------- generate mode
def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their mean rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    uniq, inverse = np.unique(values, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / np.bincount(inverse)[inverse]


def spearman(x: Sequence[Any], y: Sequence[Any]) -> float:
    """Spearman rank correlation of the pairs where both values are finite numbers (None / NaN dropped); NaN with
    fewer than 2 such pairs or when one side is constant (no ranking to agree with)."""
    a = np.asarray([math.nan if v is None else v for v in x], dtype=np.float64)
    b = np.asarray([math.nan if v is None else v for v in y], dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if len(a) < 2:
        return math.nan
    ra, rb = _ranks(a) - (len(a) + 1) / 2, _ranks(b) - (len(b) + 1) / 2
    den = math.sqrt(float(np.sum(ra * ra) * np.sum(rb * rb)))
    return float(np.sum(ra * rb) / den) if den > 0 else math.nan


def generation_summary(outputs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What the judge wrote, over all its generations: ``n_generated``, ``parse_rate`` (share whose score or verdict
    was read), ``parse_fail`` ({reason: count} of the rest, the parser's ``reason``), ``tokens_generated`` (total) and
    ``mean_tokens``, ``stopped_rate`` (ended on the end of turn rather than at max_new_tokens) and
    ``n_truncated_prompts`` (prompts cut from the left to fit). Each output holds ``reason``, ``n_tokens``,
    ``stopped`` and ``truncated``."""
    outputs = list(outputs)
    fails: dict[str, int] = defaultdict(int)
    for o in outputs:
        if o["reason"] != "ok":
            fails[str(o["reason"])] += 1
    n = len(outputs)
    tokens = int(sum(int(o["n_tokens"]) for o in outputs))
    return {
        "n_generated": n,
        "parse_rate": (n - sum(fails.values())) / n if n else math.nan,
        "parse_fail": dict(sorted(fails.items())),
        "tokens_generated": tokens,
        "mean_tokens": tokens / n if n else math.nan,
        "stopped_rate": _mean([bool(o["stopped"]) for o in outputs]),
        "n_truncated_prompts": int(sum(bool(o.get("truncated")) for o in outputs)),
    }


def _score(value: Any) -> float:
    return math.nan if value is None else float(value)


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
        pair = (_score(row.get("score")), float(row["anchor_score"]))
        groups[("cat", cat)].append(pair)
        groups[("type", ptype)].append(pair)
        categories[ptype] = cat

    def figures(cat: str, pairs: list[tuple[float, float]]) -> dict[str, Any]:
        score, anchor = np.asarray(pairs, dtype=np.float64).reshape(-1, 2).T
        read = np.isfinite(score)
        out: dict[str, Any] = {"n": len(pairs), "parse_rate": _mean(read)}
        diff = score[read] - anchor[read]
        if cat == "represent":
            out["anchor_mae"] = _mean(np.abs(diff))
            out["within_half_rate"] = _mean(np.abs(score - anchor) <= DETECT_THRESHOLD)  # NaN compares False
        elif cat == "error":
            out["detect_rate"] = _mean(score < anchor)
            out["mean_drop"] = _mean(-diff)
        return out

    out: dict[str, Any] = {cat: figures(cat, groups[("cat", cat)]) for kind, cat in sorted(groups) if kind == "cat"}
    out["type"] = {t: figures(categories[t], groups[("type", t)]) for kind, t in sorted(groups) if kind == "type"}
    out["n_rows"] = n
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
        "accuracy": _mean(correct),
        "position_consistency": _mean([p["AB"] is not None and p["AB"] == p["BA"] for p in both]),
        "first_position_rate": _mean(first),
        "n_verdicts": len(correct),
        "n_pairs_both_orders": len(both),
    }


def flatten_mode_metrics(suite: str, mode: str, results: Mapping[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """Logged keys of a suite's results in a scoring mode other than the bare one: ``<prefix><suite>/<mode>/...``.
    A proxy mode's figures are named as its bare keys would be (`flatten_eval_metrics`); generate's by the path of
    each number in the nested results (``eval/judgebias/generate/represent/anchor_mae``,
    ``eval/judgebias/generate/parse_fail/unparseable``, ``eval/rmbench/generate/chat/hard_acc``); lists (the 3x3
    matrix, domain names) are not logged."""
    base, target = f"{prefix}{suite}/", f"{prefix}{suite}/{mode}/"
    if mode != "generate":
        return {target + k[len(base):]: v for k, v in flatten_eval_metrics(suite, results, prefix).items()}
    out: dict[str, float] = {}

    def walk(path: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{path}{k}/", v)
        elif _finite_number(value):
            out[path[:-1]] = float(value)

    walk(target, results)
    return out


# ---------------------------------------------------------------------------------------------- logged keys
def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)


def flatten_eval_metrics(suite: str, results: Mapping[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """The logged keys (docs/evaluation.md, "Where metrics go") of one suite's results.

    ``flatten_eval_metrics("rmbench", rmbench_results(rows))`` ->
    ``{"eval/rmbench/hard_acc": ..., "eval/rmbench/total_avg_acc": ..., "eval/rmbench/chat/avg_acc": ...}``;
    judgebias -> ``eval/judgebias/<category>/{accuracy,margin}``, ``eval/judgebias/type/<type>/accuracy``
    (+ ``represent/anchor_mae``, ``error/detect_rate`` when present); ideation -> ``eval/ideation/accuracy``
    (+ ``position_consistency``). Extra numeric entries of ``results`` whose name starts with ``n_`` or that
    the engine adds (``long_*``, ``runtime``...) are kept under the same suite prefix, so counts of skipped or
    truncated inputs reach the logs. Use ``prefix="eval_"`` (or `to_trainer_log_keys`) for ``trainer.log``.
    """
    base = f"{prefix}{suite}/"
    out: dict[str, float] = {}
    if suite == "rmbench":
        for key in ("hard_acc", "normal_acc", "easy_acc", "total_avg_acc"):
            if key in results:
                out[base + key] = float(results[key])
        for domain in list(results.get("domains", [])) + list(results.get("other_domains", [])):
            for key in ("hard_acc", "normal_acc", "easy_acc", "avg_acc"):
                out[f"{base}{domain}/{key}"] = float(results[domain][key])
    elif suite == "judgebias":
        for cat, vals in results.items():
            if cat == "type" or not isinstance(vals, Mapping):
                continue
            for key in ("accuracy", "margin", "anchor_mae", "detect_rate"):
                if key in vals:
                    out[f"{base}{cat}/{key}"] = float(vals[key])
        for ptype, vals in results.get("type", {}).items():
            out[f"{base}type/{ptype}/accuracy"] = float(vals["accuracy"])
    elif suite == "ideation":
        for key in ("accuracy", "position_consistency"):
            if key in results:
                out[base + key] = float(results[key])
    elif suite == "evalbiasbench":  # OffsetBias's three figures, overall and per bias (slugged names)
        for key in _EVALBIASBENCH_FIGURES:
            out[base + key] = float(results[key])
        for bias in results.get("biases", []):
            for key in _EVALBIASBENCH_FIGURES:
                out[f"{base}{bias}/{key}"] = float(results[bias][key])
    elif suite in ("judgebench", "pairwise"):  # JudgeBench's rule: accuracy, per category, inconsistent_rate
        out[base + "accuracy"] = float(results["accuracy"])
        out[base + "inconsistent_rate"] = float(results["inconsistent_rate"])
        for cat, vals in results.items():
            if isinstance(vals, Mapping) and "accuracy" in vals:
                out[f"{base}{cat}/accuracy"] = float(vals["accuracy"])
    else:  # an unknown suite: flatten one level of numbers
        for key, vals in results.items():
            if _finite_number(vals):
                out[base + key] = float(vals)
    for key, vals in results.items():  # engine counters (rows, long inputs, runtime), the position lean figures
        if _finite_number(vals) and base + key not in out and key not in (
            "hard_acc", "normal_acc", "easy_acc", "total_avg_acc", "accuracy", "position_consistency",
            "inconsistent_rate", *_EVALBIASBENCH_FIGURES
        ):
            out[base + key] = float(vals)
    return out


INTERVAL_SUFFIXES = ("/ci_low", "/ci_high", "/delta_ci_low", "/delta_ci_high", "/n_units")


def split_interval_keys(logs: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(figures, interval bounds): the bounds and the units a paired test counted (keys ending in
    `INTERVAL_SUFFIXES`) apart from everything else.
    The trackers get the figures, deltas and p-values; metrics.jsonl, results.json and the report get the bounds too
    (with them a tracker would show about twice as many keys as figures)."""
    bounds = {k: v for k, v in logs.items() if k.endswith(INTERVAL_SUFFIXES)}
    return {k: v for k, v in logs.items() if k not in bounds}, bounds


def to_trainer_log_keys(metrics: Mapping[str, float]) -> dict[str, float]:
    """``eval/...`` keys -> ``eval_...`` keys for ``trainer.log``.

    transformers' report_to callbacks (and the run's metrics.jsonl writer) apply ``rewrite_logs``, which turns
    ``eval_x`` into ``eval/x`` and would turn ``eval/x`` into ``train/eval/x``.
    """
    return {("eval_" + k[len("eval/"):] if k.startswith("eval/") else k): v for k, v in metrics.items()}




# ------------------------------------------------------------------------------------------- pairwise benchmarks
_JUDGEBENCH_SOURCES = (("knowledge", "mmlu-pro"), ("reasoning", "livebench-reasoning"), ("math", "livebench-math"),
                       ("coding", "livecodebench"))
_SWAP = {"A>B": "B>A", "B>A": "A>B", "A=B": "A=B", None: None}


def swap_verdict(verdict: str | None) -> str | None:
    """A verdict about the swapped presentation, read back to the row's order: "A>B" <-> "B>A"; "A=B", None stay."""
    if verdict not in _SWAP:
        raise ValueError(f"a pairwise verdict is 'A>B', 'B>A', 'A=B' or None, got {verdict!r}")
    return _SWAP[verdict]


def verdict_from_scores(score_a: Any, score_b: Any) -> str | None:
    """A score-based judge's verdict from its two scores: the higher wins, equal is "A=B", None / NaN is no verdict."""
    a, b = _score(score_a), _score(score_b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return None
    return "A>B" if a > b else "B>A" if b > a else "A=B"


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
        lean.append(first_position_prob(row.get("scores")))
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


def first_position_prob(scores: Any) -> float:
    """Verdict mode's position lean as probabilities: a pair's four log-probabilities (``[[A>B]]``, ``[[B>A]]`` as
    shown, then swapped) give, per order, the probability of the verdict that picks the response shown first, the
    two verdicts' probabilities normalised to 1; the mean of the two orders (0.5: no lean, whatever the content).
    It moves where the verdict itself does not yet flip. NaN for any other record (two scores of a score-based
    judge, none in generate mode)."""
    if not isinstance(scores, (list, tuple)) or len(scores) != 4 or not all(_finite_number(x) for x in scores):
        return math.nan
    # sigmoid(d) = (1 + tanh(d / 2)) / 2: no overflow at any gap (a verdict may be hundreds of nats less likely)
    return float(np.mean([(1.0 + math.tanh((scores[0] - scores[1]) / 2)) / 2,
                          (1.0 + math.tanh((scores[2] - scores[3]) / 2)) / 2]))


def first_position_share(verdicts: Sequence[str | None]) -> float:
    """A pair's share of read verdicts, each about what the judge was shown, that pick the response shown first
    ("A>B"); NaN when none was read (a tie names neither). Over a pair shown in both orders a judge without position
    bias averages 0.5 whatever it knows of the content: the two orders put each response first once."""
    read = [v == "A>B" for v in verdicts if v in ("A>B", "B>A")]
    return sum(read) / len(read) if read else math.nan


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
    out: dict[str, Any] = {"accuracy": _mean(items.values["accuracy"])}
    for key in items.values:
        if key.endswith("/accuracy"):
            v = items.values[key]
            out[key.split("/")[0]] = {"accuracy": float(np.nanmean(v)), "n": int(np.sum(np.isfinite(v)))}
    out["inconsistent_rate"] = _finite_mean(items.values["inconsistent_rate"])
    out.update({key: _finite_mean(items.values[key]) for key in POSITION_FIGURES})
    out["n"] = len(items.keys)
    out["n_both_orders"] = int(np.isfinite(items.values["inconsistent_rate"]).sum())
    return out


_EVALBIASBENCH_FIGURES = ("single_acc", "pair_acc", "agreement")
POSITION_FIGURES = ("first_position_rate", "first_position_prob")  # judgetrain's lean figures of the pairwise suites


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
        lean.append(first_position_prob(row.get("scores")))
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
    out: dict[str, Any] = {k: _mean(items.values[k]) for k in _EVALBIASBENCH_FIGURES}
    out.update({key: _finite_mean(items.values[key]) for key in POSITION_FIGURES})
    biases = sorted({k.rsplit("/", 1)[0] for k in items.values if "/" in k})
    for bias in biases:
        v = {k: float(np.nanmean(items.values[f"{bias}/{k}"])) for k in _EVALBIASBENCH_FIGURES}
        out[bias] = {**v, "n": int(np.sum(np.isfinite(items.values[f"{bias}/single_acc"])))}
    out["biases"] = biases
    out["n"] = len(items.keys)
    return out


# --------------------------------------------------------------------------------- intervals and paired deltas
N_RESAMPLES = 1000
CONFIDENCE = 0.95
_CHUNK = 250  # resamples drawn and reduced together (memory: _CHUNK x units counts)


@dataclass
class Items:
    """A suite's per-item figures, what its intervals and paired deltas are computed from.

    ``keys``: each item's identity (pairs two evaluations of the same rows). ``values``: {metric: (n,) floats}, the
    headline figure being the mean of the finite values (NaN: the item does not count in that metric, e.g. a row of
    another category). ``groups``: {metric: (n,) labels} for a figure that is the unweighted mean of its groups' means
    (RM-Bench's domains); ``strata``: labels items are resampled within (each stratum keeps its size); ``clusters``:
    labels of items resampled together (a prompt's block); ``binary``: the metrics whose items are right / wrong
    (1.0 / 0.0), where the exact sign test over units (`sign_test_p`) applies to a paired delta."""

    keys: list
    values: dict[str, np.ndarray]
    groups: dict[str, np.ndarray] = field(default_factory=dict)
    strata: np.ndarray | None = None
    clusters: np.ndarray | None = None
    binary: tuple[str, ...] = ()

    def take(self, index: np.ndarray) -> Items:
        """The items at ``index`` (in that order)."""
        pick = (lambda a: None if a is None else np.asarray(a, dtype=object)[index])
        return Items([self.keys[i] for i in index], {k: v[index] for k, v in self.values.items()},
                     {k: np.asarray(g, dtype=object)[index] for k, g in self.groups.items()}, pick(self.strata),
                     pick(self.clusters), self.binary)


def _codes(labels: Any, n: int) -> np.ndarray:
    """Integer codes of ``labels`` in the sorted order of their text (0 for all when None)."""
    if labels is None:
        return np.zeros(n, dtype=np.int64)
    return np.unique(np.asarray([str(x) for x in labels], dtype=object), return_inverse=True)[1].reshape(-1)


def _weights(values: np.ndarray, groups: Any) -> np.ndarray:
    """Per-item weights of one metric: 0 where the value is not finite; else 1, or 1 / (finite items of its group)
    so that the weighted mean is the mean of the group means."""
    finite = np.isfinite(values)
    if groups is None:
        return finite.astype(np.float64)
    codes = _codes(groups, len(values))
    sizes = np.bincount(codes[finite], minlength=codes.max() + 1 if len(codes) else 0)
    return np.where(finite, 1.0 / np.maximum(sizes[codes], 1), 0.0)


def _unit_sums(values: np.ndarray, weights: np.ndarray, strata: Any, clusters: Any):
    """Per resampling unit (an item, or a cluster of items): the weighted sums (num) and weights (den) of each column,
    and its stratum. Units are in a canonical order (clusters by label; items by their values, weights and stratum),
    so the same items in any row order give the same resamples."""
    n = len(values)
    strata_codes = _codes(strata, n)
    num, den = np.where(weights > 0, values, 0.0) * weights, weights
    if clusters is None:
        order = np.lexsort([*num.T, *den.T, strata_codes][::-1]) if n else np.arange(0)
        return num[order], den[order], strata_codes[order]
    unit = _codes(clusters, n)
    n_units = unit.max() + 1 if n else 0
    unit_num, unit_den = np.zeros((n_units, num.shape[1])), np.zeros((n_units, num.shape[1]))
    np.add.at(unit_num, unit, num)
    np.add.at(unit_den, unit, den)
    unit_strata = np.zeros(n_units, dtype=np.int64)
    unit_strata[unit] = strata_codes
    if np.any(unit_strata[unit] != strata_codes):
        raise ValueError("a cluster's items lie in different strata: resampling within strata cannot keep it whole")
    return unit_num, unit_den, unit_strata


def _resampled(num: np.ndarray, den: np.ndarray, strata: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, columns) weighted means of the bootstrap resamples: each draws, within each stratum, as many units
    as the stratum holds, with replacement (numpy's PCG64 seeded with ``seed``)."""
    rng = np.random.default_rng(seed)
    n_units = len(num)
    members = [np.flatnonzero(strata == s) for s in np.unique(strata)]
    out = np.empty((n_resamples, num.shape[1]))
    for start in range(0, n_resamples, _CHUNK):
        b = min(_CHUNK, n_resamples - start)
        drawn = np.concatenate([m[rng.integers(0, len(m), size=(b, len(m)))] for m in members], axis=1)
        flat = (drawn + np.arange(b)[:, None] * n_units).ravel()
        counts = np.bincount(flat, minlength=b * n_units).reshape(b, n_units).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[start:start + b] = (counts @ num) / (counts @ den)
    return out


def _bootstrap(values: np.ndarray, weights: np.ndarray, strata: Any, clusters: Any, n_resamples: int,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(point estimates (columns,), resampled estimates (n_resamples, columns)) of weighted means."""
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    num, den, unit_strata = _unit_sums(values, weights, strata, clusters)
    with np.errstate(invalid="ignore", divide="ignore"):
        point = num.sum(axis=0) / den.sum(axis=0)
    if not len(num):
        return point, np.full((n_resamples, values.shape[1]), np.nan)
    return point, _resampled(num, den, unit_strata, n_resamples, seed)


def _interval(stats: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of each column (NaN where no resample gave a finite figure)."""
    tail = (1 - confidence) / 2
    low, high = np.full(stats.shape[1], np.nan), np.full(stats.shape[1], np.nan)
    ok = np.isfinite(stats).any(axis=0)
    if ok.any():
        low[ok], high[ok] = np.nanquantile(stats[:, ok], [tail, 1 - tail], axis=0)
    return low, high


def bootstrap_ci(values: Any, *, groups: Any = None, strata: Any = None, clusters: Any = None,
                 n_resamples: int = N_RESAMPLES, seed: int = 0, confidence: float = CONFIDENCE) -> dict[str, float]:
    """The mean of per-item ``values`` (NaN items left out; with ``groups``, the mean of the group means) and its
    percentile bootstrap interval: ``{value, ci_low, ci_high, n}``. ``strata``: resample within each (its size kept);
    ``clusters``: items drawn together. Seeded and vectorised; the same items in any order give the same interval."""
    v = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    point, stats = _bootstrap(v, _weights(v[:, 0], groups)[:, None], strata, clusters, n_resamples, seed)
    low, high = _interval(stats, confidence)
    return {"value": float(point[0]), "ci_low": float(low[0]), "ci_high": float(high[0]),
            "n": int(np.isfinite(v).sum())}


def _two_sided_binomial(k: int, n: int) -> float:
    """Exact two-sided p of k successes in n draws of Binomial(n, 1/2): min(1, 2 P(X <= min(k, n - k))); 1.0 when
    n = 0. Integer arithmetic (no normal approximation)."""
    if n == 0:
        return 1.0
    term = tail = 1  # C(n, 0); C(n, j) = C(n, j - 1) (n - j + 1) / j, exact in integers
    for j in range(1, min(k, n - k) + 1):
        term = term * (n - j + 1) // j
        tail += term
    return min(1.0, 2 * tail / 2**n)


def mcnemar_p(correct_trained: Any, correct_base: Any) -> float:
    """Exact two-sided McNemar p-value of two judges right / wrong on the same items, each item its own unit: over
    the items whose correctness changed (b gained, c lost), P = min(1, 2 * P(X <= min(b, c))) with
    X ~ Binomial(b + c, 1/2); 1.0 when none changed. Items that are not independent (two orders of one pair) need
    `sign_test_p` with their clusters."""
    t, b = np.asarray(correct_trained, dtype=bool), np.asarray(correct_base, dtype=bool)
    if t.shape != b.shape:
        raise ValueError(f"mcnemar_p needs the same items twice, got {t.shape} and {b.shape}")
    gained, lost = int(np.sum(t & ~b)), int(np.sum(~t & b))
    return _two_sided_binomial(gained, gained + lost)


def _unit_differences(trained: Any, base: Any, weights: Any, clusters: Any) -> tuple[np.ndarray, np.ndarray]:
    """(per unit and column: the weighted sum of trained - base over its items, in a canonical order; per unit and
    column: whether it holds an item finite on both sides). A unit is a cluster, or an item without clusters."""
    t = np.asarray(trained, dtype=np.float64)
    b = np.asarray(base, dtype=np.float64)
    t, b = (t[:, None], b[:, None]) if t.ndim == 1 else (t, b)
    both = np.isfinite(t) & np.isfinite(b)
    w = np.ones_like(t) if weights is None else np.asarray(weights, dtype=np.float64).reshape(t.shape)
    diff = np.where(both, (t - b) * w, 0.0)
    present = both.astype(np.float64)
    if clusters is not None:
        unit = _codes(clusters, len(diff))
        n_units = unit.max() + 1 if len(unit) else 0
        summed, held = np.zeros((n_units, diff.shape[1])), np.zeros((n_units, diff.shape[1]))
        np.add.at(summed, unit, diff)
        np.add.at(held, unit, present)
        diff, present = summed, held
    order = np.lexsort(diff.T[::-1]) if len(diff) else np.arange(0)
    return diff[order], present[order] > 0  # the same items in any order: the same units


def sign_test_p(trained: Any, base: Any, *, weights: Any = None, clusters: Any = None) -> np.ndarray:
    """Exact two-sided sign test of each column of ``trained`` - ``base`` (n,) or (n, m), one count per unit of
    independence (a cluster, else an item): each unit's weighted difference summed over its items; under no
    difference a unit that changed is as likely to have gained as lost, so the p-value is `_two_sided_binomial` of the
    units that gained among those that changed (Dixon and Mood, 1946). Units that did not change carry no
    information. With one item per unit and right / wrong items it is `mcnemar_p` exactly. Items NaN on either side
    are left out. Ten pairs in both orders, the trained judge right on 4 pairs in both orders where the base is
    always wrong: 4 units gained, none lost, p = 2 / 2**4 = 0.125 (McNemar over the 20 rows: 0.0078)."""
    diff, _ = _unit_differences(trained, base, weights, clusters)
    scale = np.abs(diff).max(axis=0, initial=0.0)
    eps = 1e-9 * np.maximum(scale, 1e-300)  # a unit's float sum of +x and -x is no change
    gained, lost = (diff > eps).sum(axis=0), (diff < -eps).sum(axis=0)
    return np.asarray([_two_sided_binomial(int(g), int(g + l)) for g, l in zip(gained, lost)])


def smallest_p(n_units: int) -> float:
    """The smallest two-sided p-value a paired test on ``n_units`` units can give: every unit changed, all the same
    way, 2 / 2**n_units (1.0 without units). A category whose smallest p is not under the threshold cannot be shown
    to have changed, whatever its figures."""
    return 1.0 if n_units < 1 else min(1.0, 2.0 ** (1 - n_units))


def items_intervals(items: Items, *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                    confidence: float = CONFIDENCE) -> dict[str, dict[str, float]]:
    """{metric: {value, ci_low, ci_high, n}} of every metric of ``items``, all from the same resamples."""
    names = list(items.values)
    values = np.column_stack([items.values[k] for k in names]) if names else np.zeros((len(items.keys), 0))
    weights = np.column_stack([_weights(items.values[k], items.groups.get(k)) for k in names]) if names else values
    point, stats = _bootstrap(values, weights, items.strata, items.clusters, n_resamples, seed)
    low, high = _interval(stats, confidence)
    return {k: {"value": float(point[j]), "ci_low": float(low[j]), "ci_high": float(high[j]),
                "n": int(np.isfinite(values[:, j]).sum())} for j, k in enumerate(names)}


def paired_difference(trained: Items, base: Items, *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                      confidence: float = CONFIDENCE) -> dict[str, dict[str, float]]:
    """Trained against base on the items both hold (paired by key), for each metric both have.

    Per metric: ``trained``, ``base`` and ``delta`` (trained - base) with their percentile intervals
    (``<name>_ci_low``, ``<name>_ci_high``), all three from the same resamples of the paired units (a resample draws
    a unit, a cluster of items or an item, for both judges at once), ``p_value`` and ``p_method``: ``sign_test``
    (`sign_test_p`, exact, one count per unit: McNemar's test when each unit is one item) for right / wrong items,
    else ``sign_flip`` (`sign_flip_p`: the paired randomization test over units, as many flips as resamples), ``n``
    (the items counted) and ``n_units`` (the units they lie in: what the test counts). An item is counted in a metric only where both values are finite. Also ``n_only_trained`` /
    ``n_only_base``: items of one side alone, left out."""
    where = {k: i for i, k in enumerate(base.keys)}
    if len(where) != len(base.keys) or len(set(trained.keys)) != len(trained.keys):
        raise ValueError("paired_difference needs unique item keys on both sides")
    t_idx = np.asarray([i for i, k in enumerate(trained.keys) if k in where], dtype=np.int64)
    b_idx = np.asarray([where[trained.keys[i]] for i in t_idx], dtype=np.int64)
    t, b = trained.take(t_idx), base.take(b_idx)
    names = [k for k in t.values if k in b.values]
    out: dict[str, dict[str, float]] = {}
    if names:
        tv = np.column_stack([t.values[k] for k in names])
        bv = np.column_stack([b.values[k] for k in names])
        both = np.isfinite(tv) & np.isfinite(bv)
        tv, bv = np.where(both, tv, np.nan), np.where(both, bv, np.nan)
        weights = np.column_stack([_weights(col, t.groups.get(k)) for k, col in zip(names, tv.T)])
        point, stats = _bootstrap(np.hstack([tv, bv]), np.hstack([weights, weights]), t.strata, t.clusters,
                                  n_resamples, seed)
        m = len(names)
        delta_point, delta_stats = point[:m] - point[m:], stats[:, :m] - stats[:, m:]
        (t_low, b_low), (t_high, b_high) = (np.split(x, 2) for x in _interval(stats, confidence))
        d_low, d_high = _interval(delta_stats, confidence)
        flipped = sign_flip_p(tv, bv, weights=weights, clusters=t.clusters, n_flips=n_resamples, seed=seed)
        signs = sign_test_p(tv, bv, weights=weights, clusters=t.clusters)
        _, held = _unit_differences(tv, bv, weights, t.clusters)
        for j, k in enumerate(names):
            binary = k in t.binary and k in b.binary
            out[k] = {"trained": float(point[j]), "trained_ci_low": float(t_low[j]),
                      "trained_ci_high": float(t_high[j]), "base": float(point[m + j]),
                      "base_ci_low": float(b_low[j]), "base_ci_high": float(b_high[j]),
                      "delta": float(delta_point[j]), "delta_ci_low": float(d_low[j]),
                      "delta_ci_high": float(d_high[j]),
                      "p_value": float(signs[j] if binary else flipped[j]),
                      "p_method": "sign_test" if binary else "sign_flip",
                      "n": int(both[:, j].sum()), "n_units": int(held[:, j].sum())}
    extra = {"n_only_trained": len(trained.keys) - len(t_idx), "n_only_base": len(base.keys) - len(b_idx)}
    return {k: {**v, **extra} for k, v in out.items()} if out else {}


def sign_flip_p(trained: Any, base: Any, *, weights: Any = None, clusters: Any = None, n_flips: int = N_RESAMPLES,
                seed: int = 0) -> np.ndarray:
    """Two-sided p-value of the paired randomization (sign-flip) test of each column of ``trained`` - ``base`` (n,) or
    (n, m): under no difference each item's (or cluster's) weighted difference is as likely negative as positive;
    p = (1 + flips whose |sum| reaches the observed |sum|) / (n_flips + 1), so never below 1 / (n_flips + 1). Items
    NaN on either side are left out. On right / wrong items `sign_test_p` computes the exact p-value instead."""
    diff, _ = _unit_differences(trained, base, weights, clusters)
    observed = np.abs(diff.sum(axis=0))
    reach = observed * (1 - 1e-9) - 1e-12  # a flip whose sum equals the observed one counts (float sums)
    rng, hits = np.random.default_rng(seed), np.zeros(diff.shape[1])
    for start in range(0, n_flips, _CHUNK):
        signs = rng.integers(0, 2, size=(min(_CHUNK, n_flips - start), len(diff))) * 2.0 - 1.0
        hits += (np.abs(signs @ diff) >= reach).sum(axis=0)
    return (1 + hits) / (n_flips + 1)


# ---------------------------------------------------------------------------------------- RM-Bench per prompt
_UPPER, _LOWER = np.triu_indices(MATRIX_SIZE, 1), np.tril_indices(MATRIX_SIZE, -1)


def style_spread(score_chosen: Any, score_rejected: Any) -> np.ndarray:
    """RM-Bench style spread per prompt: how far the judge's score of one response moves across its three styles
    (max - min over concise, detailed plain, detailed markdown), averaged over the chosen and the rejected response;
    in the units of the score (NaN where a score is missing). 0 is a judge that style cannot move."""
    chosen = np.asarray(score_chosen, dtype=np.float64).reshape(-1, MATRIX_SIZE)
    rejected = np.asarray(score_rejected, dtype=np.float64).reshape(-1, MATRIX_SIZE)
    return (np.ptp(chosen, axis=1) + np.ptp(rejected, axis=1)) / 2


def rmbench_items(rows: Iterable[Mapping[str, Any]]) -> Items:
    """Per-prompt RM-Bench figures whose bootstrap keeps each prompt's 3x3 block whole: ``hard_acc``, ``normal_acc``,
    ``easy_acc`` (the prompt's share of right comparisons in the strict upper triangle, the diagonal, the lower
    triangle), ``total_avg_acc`` (their mean) and ``style_spread``, each the mean over prompts within a domain, then
    over the domains present among chat, math, code, safety (`rmbench_results`' rule: safety-refuse and
    safety-response pooled); per domain ``<domain>/{hard_acc,normal_acc,easy_acc,avg_acc,style_spread}``. Resampled
    within domains (each keeps its number of prompts). Rows marked ``skipped`` are left out. Keys: ``id``."""
    rows = [r for r in rows if not r.get("skipped")]
    chosen = np.asarray([r["score_chosen"] for r in rows], dtype=np.float64).reshape(-1, MATRIX_SIZE)
    rejected = np.asarray([r["score_rejected"] for r in rows], dtype=np.float64).reshape(-1, MATRIX_SIZE)
    wins = chosen[:, :, None] > rejected[:, None, :]  # NaN compares False: wrong
    per = {"hard_acc": wins[:, _UPPER[0], _UPPER[1]].mean(axis=1) if len(rows) else np.zeros(0),
           "normal_acc": wins[:, np.arange(3), np.arange(3)].mean(axis=1) if len(rows) else np.zeros(0),
           "easy_acc": wins[:, _LOWER[0], _LOWER[1]].mean(axis=1) if len(rows) else np.zeros(0)}
    per["avg_acc"] = (per["hard_acc"] + per["normal_acc"] + per["easy_acc"]) / 3
    per["style_spread"] = style_spread(chosen, rejected)
    domains = np.asarray([rmbench_domain(r.get("domain") or r.get("id", "")) for r in rows], dtype=object)
    headline = np.isin(domains, RMBENCH_DOMAINS)
    values, groups = {}, {}
    for key in ("hard_acc", "normal_acc", "easy_acc", "avg_acc", "style_spread"):
        name = "total_avg_acc" if key == "avg_acc" else key
        values[name] = np.where(headline, per[key], np.nan)
        groups[name] = domains
    for domain in [d for d in RMBENCH_DOMAINS if d in set(domains)] + sorted(set(domains) - set(RMBENCH_DOMAINS)):
        for key in ("hard_acc", "normal_acc", "easy_acc", "avg_acc", "style_spread"):
            values[f"{domain}/{key}"] = np.where(domains == domain, per[key], np.nan)
    return Items([r.get("id") for r in rows], values, groups, strata=domains)


def rmbench_intervals(rows: Iterable[Mapping[str, Any]], *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                      confidence: float = CONFIDENCE) -> dict[str, dict[str, float]]:
    """RM-Bench's figures with their intervals, resampling prompts within domains (`rmbench_items`):
    ``{hard_acc, normal_acc, easy_acc, total_avg_acc, style_spread, <domain>/...: {value, ci_low, ci_high, n}}``; each
    ``value`` equals `rmbench_results`' figure of the same rows."""
    return items_intervals(rmbench_items(rows), n_resamples=n_resamples, seed=seed, confidence=confidence)


def interval_keys(intervals: Mapping[str, Mapping[str, float]], prefix: str = "") -> dict[str, float]:
    """The logged keys of intervals: ``<prefix><metric>``, ``.../ci_low``, ``.../ci_high``."""
    out: dict[str, float] = {}
    for metric, iv in intervals.items():
        out[prefix + metric] = iv["value"]
        out[f"{prefix}{metric}/ci_low"], out[f"{prefix}{metric}/ci_high"] = iv["ci_low"], iv["ci_high"]
    return out
