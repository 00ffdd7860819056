"""The few figures a judge is read by first, at its best evaluation and at its last: each suite's headline figures
with their labels (`Suite.report_headline`: an accuracy per level or category, and the parse rate of the evaluations
it wrote in generate mode). The model card (`judgetrain.report.card`) and `judgetrain report` both open with them.

    from judgetrain.report.headline import headline
    head = headline(records, recipe)     # records: metrics.jsonl as {step: merged record}; None without any eval
    head.best_step, head.last_step, head.rows[0]   # {"metric", "label", "best", "last", "best_ci", "last_ci", "rule"}

The best evaluation is the one where the recipe's ``metric_for_best_model`` (with ``greater_is_better``) is best, or
else the figure a suite names for it (`Suite.best_by`), else the first headline figure logged; the earliest such
step on a tie. Every figure is shown with its 95% interval (``value [ci_low, ci_high]``, `with_interval`), wherever it is shown: the
headline table, the table against the base judge (the base's interval read from the evaluation it was scored in),
the log's and the terminal's copies of them. Every figure is named with its scoring mode and reading
(``JudgeBias represent accuracy (implicit: log_ratio)``, ``judgebias/judge/represent/accuracy (judge:
expected_score)``): the headline's bare keys are the recipe's first pointwise mode, the table against the base may
read another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from judgetrain.config.directions import greater_is_better
from judgetrain.config.recipe import PROXY_MODES, SCORING_MODES, named_figure, scoring_modes
from judgetrain.utils.errors import RecipeError
from judgetrain.eval.benchmarks import SuiteFacts
from judgetrain.eval.compare import HEADLINE as SUITE_HEADLINE
from judgetrain.eval.compare import REGRESSION_ALPHA, changes, worse_rule
from judgetrain.eval.rules import flat_verdict, verdict_words
from judgetrain.report.spread import flat_judge_lines

REPORT_HEADLINE = SuiteFacts("report_headline")  # per suite: (figure, label) of its headline figures
HEADLINE_PLACE = SuiteFacts("headline_place")  # per suite: its place in the headline table
BEST_BY = SuiteFacts("best_by")  # per suite: the figure the best evaluation is chosen by, if any


def headline_figures() -> list[tuple[str, str]]:
    """(logged key, label) of every suite's headline figures (`Suite.report_headline`), the suites in their
    `Suite.headline_place` order, those of generate mode after every suite's others."""
    suites = sorted(REPORT_HEADLINE, key=lambda suite: HEADLINE_PLACE[suite])  # stable: the registry's order on a tie
    pairs = [(f"eval/{suite}/{fig}", label) for suite in suites for fig, label in REPORT_HEADLINE[suite]]
    return sorted(pairs, key=lambda p: p[0].split("/")[2] == "generate")  # stable: the order kept within


def default_selections() -> list[str]:
    """The figures a run's best evaluation is chosen by when its recipe names none, in the order tried."""
    return [f"eval/{suite}/{fig}" for suite, fig in BEST_BY.items() if fig]


@dataclass
class Headline:
    selected_by: str  # the figure the best evaluation is chosen by
    greater_is_better: bool
    best_step: int
    best_epoch: float | None
    last_step: int
    last_epoch: float | None
    # {"metric", "label", "best", "last", "best_ci", "last_ci", "rule"}: None where not logged; an interval is (low,
    # high); "rule": the last evaluation's verdict against the best rule that needs no judge (`flat_verdict`)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _epoch(record: Mapping[str, Any]) -> float | None:
    return float(record["epoch"]) if _num(record.get("epoch")) else None


def selection(recipe: Mapping[str, Any] | None, logged: set[str]) -> tuple[str, bool] | None:
    """(figure, greater is better) the best evaluation is chosen by; None when nothing headline-worthy was logged."""
    recipe = recipe or {}
    wanted = recipe.get("metric_for_best_model")
    if wanted:
        key = "eval/" + str(wanted).removeprefix("eval/").removeprefix("eval_")
        if key in logged:
            greater = recipe.get("greater_is_better")
            return key, bool(greater) if greater is not None else _greater(key)
    for key in (*default_selections(), *(k for k, _ in headline_figures())):
        if key in logged:
            return key, True
    return None


def _greater(key: str) -> bool:
    try:
        return greater_is_better(key)
    except ValueError:  # a recipe older than the check of metric_for_best_model's direction
        return True


def headline(records: Mapping[int, Mapping[str, Any]], recipe: Mapping[str, Any] | None = None) -> Headline | None:
    """The headline figures at the best and the last evaluation of a run's merged metrics records."""
    figures = headline_figures()
    evals = {step: rec for step, rec in sorted(records.items()) if any(_num(rec.get(k)) for k, _ in figures)}
    if not evals:
        return None
    logged = {k for rec in evals.values() for k, v in rec.items() if k.startswith("eval/") and _num(v)}
    chosen = selection(recipe, logged)
    if chosen is None:
        return None
    key, greater = chosen
    scored = [(step, float(rec[key])) for step, rec in evals.items() if _num(rec.get(key))]
    best_step = (max if greater else min)(scored, key=lambda p: p[1])[0]  # the first step reaching the best value
    last_step = max(evals)
    best, last = evals[best_step], evals[last_step]
    bare = bare_mode(recipe)
    rows = [{"metric": k, "label": named_figure(label, key_mode(k, bare)), "mode": key_mode(k, bare),
             "best": _value(best, k), "last": _value(last, k), "best_ci": _interval(best, k),
             "last_ci": _interval(last, k), "rule": flat_verdict(last, k)} for k, label in figures if k in logged]
    return Headline(key, greater, best_step, _epoch(best), last_step, _epoch(last), rows)


def bare_mode(recipe: Mapping[str, Any] | None) -> str | None:
    """The scoring mode of a run's bare ``eval/<suite>/...`` keys: the first of `PROXY_MODES` its recipe's
    eval_scoring lists (implicit, the default, when it does not say); None when it lists none or cannot be read."""
    try:
        modes = scoring_modes((recipe or {}).get("eval_scoring", ["implicit"]))
    except RecipeError:
        return None
    return next((m for m in modes if m in PROXY_MODES), None)


def key_mode(key: str, bare: str | None) -> str | None:
    """The mode of a logged eval key: ``eval/<suite>/<mode>/...`` names it, the bare ``eval/<suite>/...`` is
    ``bare``'s (`bare_mode`)."""
    parts = key.split("/")
    return parts[2] if len(parts) > 3 and parts[2] in SCORING_MODES else bare


def _value(record: Mapping[str, Any], key: str) -> float | None:
    return float(record[key]) if _num(record.get(key)) else None


def _interval(record: Mapping[str, Any], key: str) -> tuple[float | None, float | None] | None:
    """(ci_low, ci_high) logged with ``key`` in ``record`` (`` key/ci_low``, ``key/ci_high``); None without them."""
    low, high = _value(record, f"{key}/ci_low"), _value(record, f"{key}/ci_high")
    return None if low is None and high is None else (low, high)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def with_interval(value: float | None, interval: tuple[float | None, float | None] | None) -> str:
    """A figure as shown wherever a headline figure is: ``0.5046 [0.4352, 0.5741]``; ``[-, -]`` where no interval
    was logged with it, ``-`` where the figure itself was not."""
    if value is None:
        return "-"
    low, high = interval or (None, None)
    return f"{fmt(value)} [{fmt(low)}, {fmt(high)}]"


def headline_table(head: Headline) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the headline as text cells, for Markdown and HTML tables."""
    def when(step: int, epoch: float | None) -> str:
        return f"step {step}" + ("" if epoch is None else f", epoch {epoch:g}")

    header = ["figure", f"best eval ({when(head.best_step, head.best_epoch)}) [95% interval]",
              f"last eval ({when(head.last_step, head.last_epoch)}) [95% interval]"]
    rows = [[r["label"], with_interval(r["best"], r["best_ci"]), with_interval(r["last"], r["last_ci"])]
            for r in head.rows]
    if any(r.get("rule") for r in head.rows):  # the last evaluation beside the rules that need no judge
        header.append("last eval beside the rules that need no judge")
        for row, r in zip(rows, head.rows):
            row.append(verdict_words(r["rule"]) if r.get("rule") else "-")
    return header, rows


def headline_note(head: Headline) -> str:
    """One line on how the best evaluation was chosen."""
    return (f"Best evaluation: where {head.selected_by} is {'highest' if head.greater_is_better else 'lowest'} "
            f"(step {head.best_step}); last evaluation: step {head.last_step}.")


# ------------------------------------------------------------------------------------------ against the base judge
def against_base(records: Mapping[int, Mapping[str, Any]], recipe: Mapping[str, Any] | None = None,
                 run_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The last evaluation logged against a baseline (the eval before the first step, `judgetrain.eval.evidence`):
    ``{"step", "rows": [{figure, mode, base, base_ci_low, base_ci_high, trained, ci_low, ci_high, delta, delta_ci_low,
    delta_ci_high, p_value}],
    "worse": [figures worse than the base], "too_few": [figures with too few units to tell], "margin", "alpha",
    "bare": the mode of the bare keys}`` (`shown` names a figure with its mode and reading);
    rows hold each suite's headline figures (`judgetrain.eval.compare.HEADLINE`), ``worse`` every figure that
    `judgetrain.eval.compare.changes` calls worse with the recipe's ``eval_regression_margin`` and
    ``eval_regression_alpha``, as the run's guard judged them. The base's interval is the one logged with the figure
    at the first evaluation that holds it (the baseline, before the first step), where its value is the base's.
    ``run_dir``: the run folder, whose per-row files say why figures moved together (``"why"``:
    `judgetrain.report.spread.flat_judge_lines`, [] without it). None without such an evaluation."""
    steps = [s for s, r in records.items() if any("/delta/" in k for k in r)]
    if not steps:
        return None
    step = max(steps)
    rec = records[step]
    bare = bare_mode(recipe)
    margin = float((recipe or {}).get("eval_regression_margin") or 0.0)
    alpha = float((recipe or {}).get("eval_regression_alpha") or REGRESSION_ALPHA)
    rows, judged = [], {}
    for key in sorted(k for k in rec if "/delta/" in k and not k.endswith(("_ci_low", "_ci_high", "p_value",
                                                                            "/n_units"))):
        where, metric = key.split("/delta/", 1)
        trained, delta = rec.get(f"{where}/{metric}"), rec[key]
        figures = {"delta_ci_low": rec.get(f"{key}/delta_ci_low"), "delta_ci_high": rec.get(f"{key}/delta_ci_high")}
        judged[f"{where.removeprefix('eval/')}/{metric}"] = {
            **figures, "p_value": rec.get(f"{key}/p_value"), "n_units": rec.get(f"{key}/n_units"),
            "distance_delta_ci_low": rec.get(f"{key}/distance_ci_low"),
            "distance_delta_ci_high": rec.get(f"{key}/distance_ci_high"),
            "distance_p_value": rec.get(f"{key}/distance_p_value")}
        if metric not in SUITE_HEADLINE.get(where.split("/")[1], ()):
            continue
        base = trained - delta if _num(trained) and _num(delta) else None
        rows.append({"figure": f"{where.removeprefix('eval/')}/{metric}", "mode": key_mode(f"{where}/{metric}", bare),
                     "trained": trained, "base": base,
                     **_base_interval(records, f"{where}/{metric}", base),
                     "ci_low": rec.get(f"{where}/{metric}/ci_low"), "ci_high": rec.get(f"{where}/{metric}/ci_high"),
                     "delta": delta, **figures, "p_value": rec.get(f"{key}/p_value")})
    said = changes(judged, margin, alpha)
    base_step = min(s for s, r in records.items() if any(k.startswith("eval/") for k in r))
    why = flat_judge_lines(run_dir, step, base_step) if run_dir is not None else []
    return {"step": step, "rows": rows, "why": why, "worse": [name for name, s in said.items() if s == "worse"],
            "too_few": [name for name, s in said.items() if s.endswith("too few to tell")], "margin": margin,
            "alpha": alpha, "bare": bare}


def shown(versus: Mapping[str, Any], names: list[str]) -> list[str]:
    """Figures of `against_base` (``worse``, ``too_few``) as a person reads them: each with its mode and reading."""
    return [named_figure(name, key_mode(f"eval/{name}", versus.get("bare"))) for name in names]


def _base_interval(records: Mapping[int, Mapping[str, Any]], key: str, base: float | None) -> dict[str, Any]:
    """``base_ci_low`` / ``base_ci_high``: the interval logged with ``key`` at the first evaluation holding it, when
    that evaluation's value is ``base`` (the baseline's); None otherwise."""
    first = next((rec for _, rec in sorted(records.items()) if _num(rec.get(key))), None)
    if first is None or base is None or not math.isclose(float(first[key]), base, abs_tol=1e-9):
        return {"base_ci_low": None, "base_ci_high": None}
    low, high = _interval(first, key) or (None, None)
    return {"base_ci_low": low, "base_ci_high": high}


AGAINST_BASE_HEADER = ("figure (mode: reading)", "base [95% interval]", "trained [95% interval]", "difference [95% interval]", "p")


def against_base_verdict(versus: Mapping[str, Any] | None) -> str:
    """One sentence, read first: that figures got worse than the base judge (``versus["worse"]`` names them), "no
    category got worse", or why there is no comparison."""
    if versus is None:
        return ("No evaluation against the base judge was logged (`eval_on_start: true` scores the baseline in judge, "
                "verdict and generate modes; implicit mode has none: its base is 0 for every response).")
    if versus["worse"]:
        return f"Worse than the base judge at step {versus['step']} ({worse_rule(versus['margin'], versus['alpha'])})"
    few = shown(versus, versus.get("too_few") or [])
    return (f"No category got worse than the base judge at step {versus['step']}"
            + (f"; too few units to tell: {', '.join(few)}." if few else "."))


def against_base_cells(versus: Mapping[str, Any] | None) -> list[list[str]]:
    """Base vs trained as text cells under `AGAINST_BASE_HEADER`: the figure named with its mode and reading, the base
    and the trained figure each with its interval, the difference with its interval, and p-value (the exact sign test over units for accuracies, "-"
    where none applies)."""
    if versus is None:
        return []
    return [[named_figure(r["figure"], r.get("mode")),
             with_interval(r["base"], (r.get("base_ci_low"), r.get("base_ci_high"))),
             with_interval(r["trained"], (r["ci_low"], r["ci_high"])),
             with_interval(r["delta"], (r["delta_ci_low"], r["delta_ci_high"])), fmt(r["p_value"])]
            for r in versus["rows"]]


def against_base_lines(versus: Mapping[str, Any] | None) -> list[str]:
    """Markdown: what got worse (or "no category got worse") first, then base vs trained with the interval, the
    difference, its interval and p-value."""
    verdict = against_base_verdict(versus)
    if versus is None:
        return [verdict]
    worse = ", ".join(f"`{w}`" for w in shown(versus, versus["worse"]))
    lines = [f"**{verdict}**: {worse}" if worse else verdict, "",
             "| " + " | ".join(AGAINST_BASE_HEADER) + " |", "|" + "|".join("---" for _ in AGAINST_BASE_HEADER) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in against_base_cells(versus)]
    return lines + [line for why in versus.get("why") or [] for line in ("", f"Why: {why}")]


def against_base_text(versus: Mapping[str, Any] | None) -> str:
    """The same as `against_base_lines` as fixed-width text, for a log or a terminal: the verdict (and what got
    worse) first, then base vs trained with the interval, the difference, its interval and p-value."""
    verdict = against_base_verdict(versus)
    if versus is None:
        return verdict
    lines = [f"{verdict}: {', '.join(shown(versus, versus['worse']))}" if versus["worse"] else verdict]
    rows = [list(AGAINST_BASE_HEADER), *against_base_cells(versus)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(AGAINST_BASE_HEADER))]
    lines += ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
              for row in rows]
    return "\n".join(lines + [f"Why: {why}" for why in versus.get("why") or []])
