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
    else:  # an unknown suite: flatten one level of numbers
        for key, vals in results.items():
            if _finite_number(vals):
                out[base + key] = float(vals)
    for key, vals in results.items():  # engine counters (rows, long inputs, runtime)
        if _finite_number(vals) and base + key not in out and key not in (
            "hard_acc", "normal_acc", "easy_acc", "total_avg_acc", "accuracy", "position_consistency"
        ):
            out[base + key] = float(vals)
    return out


def to_trainer_log_keys(metrics: Mapping[str, float]) -> dict[str, float]:
    """``eval/...`` keys -> ``eval_...`` keys for ``trainer.log``.

    transformers' report_to callbacks (and the run's metrics.jsonl writer) apply ``rewrite_logs``, which turns
    ``eval_x`` into ``eval/x`` and would turn ``eval/x`` into ``train/eval/x``.
    """
    return {("eval_" + k[len("eval/"):] if k.startswith("eval/") else k): v for k, v in metrics.items()}


