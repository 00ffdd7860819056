"""The logged keys of evaluation results (docs/evaluation.md, "Where metrics go"): a suite's figures flattened to
``eval/<suite>/...`` (each suite names its own, `Suite.log_figures`), a mode's own keys, interval bounds apart from
figures, and ``trainer.log``'s ``eval_`` spelling. The key names are a public interface: runs, reports and dashboards
are read by them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from judgetrain.config.suites import registered
from judgetrain.eval.benchmarks import Suite  # judgetrain's own suites registered
from judgetrain.eval.benchmarks.base import finite_number


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
        elif finite_number(value):
            out[path[:-1]] = float(value)

    walk(target, results)
    return out




def flatten_eval_metrics(suite: str, results: Mapping[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """The logged keys (docs/evaluation.md, "Where metrics go") of one suite's results.

    ``flatten_eval_metrics("rmbench", rmbench_results(rows))`` ->
    ``{"eval/rmbench/hard_acc": ..., "eval/rmbench/total_avg_acc": ..., "eval/rmbench/chat/avg_acc": ...}``;
    judgebias -> ``eval/judgebias/<category>/{accuracy,margin}``, ``eval/judgebias/type/<type>/accuracy``
    (+ ``represent/anchor_mae``, ``error/detect_rate`` when present); ideation -> ``eval/ideation/accuracy``
    (+ ``position_consistency``). Extra numeric entries of ``results`` whose name starts with ``n_`` or that
    the engine adds (``long_*``, ``runtime``...) are kept under the same suite prefix, so counts of skipped or
    truncated inputs reach the logs. A figure that is NaN (no item measured it: a position lean in a mode that reads
    none) is not logged. Use ``prefix="eval_"`` (or `to_trainer_log_keys`) for ``trainer.log``.
    """
    base = f"{prefix}{suite}/"
    cls = registered(suite) or Suite  # a suite not registered: one level of numbers
    out = {k: v for k, v in cls().log_figures(results, base).items() if finite_number(v)}  # NaN: nothing measured
    own = set(cls.bare_figures)
    for key, vals in results.items():  # engine counters (rows, long inputs, runtime), the position lean figures
        if finite_number(vals) and base + key not in out and key not in own:
            out[base + key] = float(vals)
    return out


INTERVAL_SUFFIXES = ("/ci_low", "/ci_high", "/delta_ci_low", "/delta_ci_high", "/distance_ci_low", "/distance_ci_high",
                     "/n_units")


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


def interval_keys(intervals: Mapping[str, Mapping[str, float]], prefix: str = "") -> dict[str, float]:
    """The logged keys of intervals: ``<prefix><metric>``, ``.../ci_low``, ``.../ci_high``; a metric no item
    measured (its value NaN) has none, and one of a single unit (a source sample) has no bounds."""
    out: dict[str, float] = {}
    for metric, iv in intervals.items():
        if not finite_number(iv["value"]):
            continue
        out[prefix + metric] = iv["value"]
        if finite_number(iv["ci_low"]) and finite_number(iv["ci_high"]):  # one unit: no interval
            out[f"{prefix}{metric}/ci_low"], out[f"{prefix}{metric}/ci_high"] = iv["ci_low"], iv["ci_high"]
    return out


def rule_keys(suite: str, rules: Mapping[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """The logged keys of the rules that need no judge on a suite's rows (`judgetrain.eval.rules.RuleFigures` by
    rule): ``<prefix><suite>/rule/<rule>/<metric>`` named as the judge's (``eval/evalbiasbench/rule/shorter/pair_acc``)
    with its ``/ci_low`` and ``/ci_high``."""
    out: dict[str, float] = {}
    for rule, fig in rules.items():
        out.update(flatten_mode_metrics(suite, f"rule/{rule}", fig.metrics, prefix))
        out.update(interval_keys(fig.intervals, f"{prefix}{suite}/rule/{rule}/"))
    return out


def over_rule_keys(learned: Mapping[str, Mapping[str, Any]], base: str) -> dict[str, float]:
    """The logged keys of a judge's figures against the best rule (`judgetrain.eval.rules.learned`; ``base``:
    ``eval/<suite>/[<mode>/]``): ``<base>over_rule/<metric>`` (judge minus the best rule) with its
    ``/delta_ci_low`` and ``/delta_ci_high``."""
    out: dict[str, float] = {}
    for metric, v in learned.items():
        out[f"{base}over_rule/{metric}"] = v["delta"]
        out[f"{base}over_rule/{metric}/delta_ci_low"] = v["delta_ci_low"]
        out[f"{base}over_rule/{metric}/delta_ci_high"] = v["delta_ci_high"]
    return out
