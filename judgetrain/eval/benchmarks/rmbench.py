"""RM-Bench (THU-KEG/RM-Bench): each prompt's 3 chosen and 3 rejected responses in three styles, the 3x3 style matrix
of strict wins, hard / normal / easy accuracy, per domain and overall.

Ties always count as wrong (a judge that cannot tell two responses apart has not preferred the right one), exactly as
the reference ``compute_accuracy`` of RM-Bench, which compares with a strict ``>``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np

from judgetrain import data
from judgetrain.config.suites import register
from judgetrain.eval.benchmarks.base import CurvePlot, FigureTable, Suite, nan_or, rubric_prompt
from judgetrain.eval.requests import Request, RowScore
from judgetrain.eval.stats import CONFIDENCE, N_RESAMPLES, Items, items_intervals

MATRIX_SIZE = 3  # RM-Bench style order: [concise, detailed plain, detailed markdown]
RMBENCH_DOMAINS = ("chat", "math", "code", "safety")  # the official order
FIGURES = ("hard_acc", "normal_acc", "easy_acc", "total_avg_acc")
DOMAIN_FIGURES = ("hard_acc", "normal_acc", "easy_acc", "avg_acc")
LEVELS = ("hard", "normal", "easy")  # the accuracy levels: above, on and below the matrix's diagonal


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


@register
class RMBench(Suite):
    """RM-Bench: 6 responses per prompt (3 chosen, 3 rejected), each scored alone; the unit is the prompt."""

    name = "rmbench"
    title = "RM-Bench"
    hub = "THU-KEG/RM-Bench"
    bundled = "a bundled subset of THU-KEG/RM-Bench"
    unit = "a prompt (its 3 chosen and 3 rejected styles: one record)"
    headline = ("hard_acc", "normal_acc", "easy_acc", "total_avg_acc", "style_spread")
    example_figure = "total_avg_acc"
    curves = True
    generate_table = FIGURES
    bare_figures = FIGURES
    matrices = True
    headline_place = 0
    report_headline = (("hard_acc", "RM-Bench hard accuracy"), ("normal_acc", "RM-Bench normal accuracy"),
                       ("easy_acc", "RM-Bench easy accuracy"), ("total_avg_acc", "RM-Bench average accuracy"),
                       ("generate/parse_rate", "RM-Bench parse rate (written evaluations)"))
    best_by = "total_avg_acc"

    def load(self, spec: Any, source: Any, **common: Any) -> Any:
        return data.load_rmbench(source, **common)

    def group_key(self, row: dict) -> Hashable:
        return rmbench_domain(row.get("domain") or row.get("id", ""))

    def request(self, row: dict, scoring: str) -> Request:
        responses = list(row["chosen"]) + list(row["rejected"])
        if scoring == "judge":
            return Request("judge", judge_prompts=[rubric_prompt(row["prompt"], r) for r in responses])
        return Request("implicit", prompt=row["prompt"], responses=responses)

    def row_fields(self, row: dict, score: RowScore, scoring: str) -> dict[str, Any]:
        s = score.scores
        return {"id": row.get("id"), "domain": row.get("domain"),
                "score_chosen": s[:3] if s else None, "score_rejected": s[3:] if s else None}

    def figures(self, records: list[dict], scoring: str) -> dict[str, Any]:
        return rmbench_results(records)

    def generate_fields(self, index: int, row: dict, outputs: list[dict]) -> dict[str, Any]:
        return {"id": row.get("id"), "domain": row.get("domain")}

    def generated_figures(self, records: list[dict]) -> dict[str, Any]:
        return rmbench_results(_generated_rows(records))

    def log_figures(self, results: Mapping[str, Any], base: str) -> dict[str, float]:
        out = {base + key: float(results[key]) for key in FIGURES if key in results}
        for domain in list(results.get("domains", [])) + list(results.get("other_domains", [])):
            for key in DOMAIN_FIGURES:
                out[f"{base}{domain}/{key}"] = float(results[domain][key])
        return out

    def items(self, records: list[dict], mode: str) -> tuple[Items | None, str | None]:
        if mode == "generate":
            return rmbench_items(_generated_rows(records)), None
        return rmbench_items([r for r in records if r.get("score_chosen") is not None
                              and r.get("score_rejected") is not None]), None

    def row_key(self, row: Mapping[str, Any]) -> Any:
        if row.get("row_index") is None and row.get("id") is not None:
            return ("id", row["id"])
        return super().row_key(row)

    def style_matrices(self, records: list[dict]) -> dict[str, Any]:
        return rmbench_matrices(records)

    def judge_scores(self, records: list[dict]) -> dict[str, list[float]]:
        return {"all": [s for row in records
                        for s in list(row.get("score_chosen") or []) + list(row.get("score_rejected") or [])]}

    def flat_judge_line(self, spreads: str, scores: dict[str, list[float]]) -> str:
        return (f"{self.title} in judge mode: every response is scored within a sliver of the scale ({spreads}): "
                "which response of a pair wins is decided by hundredths of a point, so its accuracies and its style "
                "spread move with changes that small, not with what the judge reads.")

    def curve_plots(self, keys: list[str], rows: list[dict]) -> list[CurvePlot]:
        groups = self._curve_groups(keys)
        return [CurvePlot(f"{self.name}_curves.png", f"{self.title} hard / normal / easy accuracy per eval point, "
                          "overall and per domain", f"{self.title} accuracy",
                          [(f"{self.title} {g}", [(lvl, f"{p}/{lvl}_acc") for lvl in LEVELS]) for g, p in groups],
                          unit="accuracy"),
                CurvePlot("style_bias.png", f"Style bias: {self.title} easy minus hard accuracy per eval point (0 = "
                          "the judge ignores style; a debiased judge closes this gap)", "style bias (easy - hard)",
                          [(f"{g}: easy - hard", [("easy - hard", f"{p}/style_gap")]) for g, p in groups],
                          zero_line=True)]

    def _curve_groups(self, keys: list[str]) -> list[tuple[str, str]]:
        """(panel title, key prefix): overall, then each domain logged."""
        found = {k.split("/")[2] for k in keys if len(k.split("/")) == 4 and k.split("/")[1] == self.name
                 and k.split("/")[3] in ("hard_acc", "easy_acc", "normal_acc")}
        order = {d: i for i, d in enumerate(RMBENCH_DOMAINS)}
        return [("overall", f"eval/{self.name}")] + [(d, f"eval/{self.name}/{d}")
                                                    for d in sorted(found, key=lambda d: (order.get(d, 9), d))]

    def table(self, results: Mapping[str, Any]) -> FigureTable | None:
        if not results:
            return None
        levels = ("hard_acc", "normal_acc", "easy_acc")
        rows = [[d, str(results[d]["n_rows"]), *(f"{results[d][k]:.3f}" for k in (*levels, "avg_acc"))]
                for d in results["domains"] + results.get("other_domains", [])]
        rows += [[d, "0", "missing", "", "", ""] for d in results["missing_domains"]]
        total = ["overall", str(results["n_rows"]), *(f"{results[k]:.3f}" for k in (*levels, "total_avg_acc"))]
        notes = ([f"{self.name}: {results['n_skipped']} rows skipped, {results['n_truncated']} truncated (long inputs)"]
                 if results.get("n_skipped") or results.get("n_truncated") else [])
        return FigureTable(self.title, ("domain", "rows", "hard", "normal", "easy", "avg"), rows, total, notes)


def _generated_rows(records: list[dict]) -> list[dict]:
    """Generate records as RM-Bench rows: the parsed scores, unread = NaN (wrong)."""
    out = []
    for r in records:
        scores = [nan_or(o.get("score")) for o in r["outputs"]]
        out.append({"id": r.get("id"), "domain": r.get("domain") or r.get("id", ""), "score_chosen": scores[:3],
                    "score_rejected": scores[3:]})
    return out
