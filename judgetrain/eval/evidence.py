"""The evidence of one evaluation: an interval on every figure, the paired difference against a baseline judge, the
categories that got worse, and the compact table the main process logs.

    items = suite_evidence(suite, "verdict", records)               # (Items, {metric: {value, ci_low, ci_high, n}})
    keys, deltas, worse, not_compared = paired_deltas(current, baseline, bare="implicit",
                                                      readings=(summary["readings"], baseline_summary["readings"]))

The per-item figures are those `judgetrain compare` reads from the per-row files (`judgetrain.eval.compare.suite_items`),
so an interval, a delta logged during training and a delta `judgetrain compare` computes later from the saved files
are the same numbers (same items, same seeded resamples).

The baseline: in training, the evaluation before the first step (``eval_on_start``) for the likelihood readings
(loglik_sum, loglik_mean), judge, verdict and generate modes; the implicit reward of the untouched policy is 0 for
every response (the policy is its own reference), so implicit mode has no baseline to compare with. ``judgetrain eval
--baseline MODEL`` scores the baseline model on the same rows in every mode; a mode the two judges read otherwise
(`judgetrain.config.recipe.different_readings`: a base has no reference, so its implicit figures are its
log-likelihood) is not differenced, said in ``not_compared``.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from judgetrain.config.recipe import different_readings, named_figure
from judgetrain.eval.compare import (REGRESSION_ALPHA, HEADLINE, changes, delta_keys, paired_figures, read_records,
                                    row_files, suite_items)
from judgetrain.eval.metrics import Items, items_intervals

logger = logging.getLogger(__name__)

NO_BASELINE_MODES = ("implicit",)  # in training: the policy before the first step is its own reference (all 0)


def suite_evidence(suite: str, mode: str, records: list[dict]) -> tuple[Items | None, dict[str, dict[str, float]]]:
    """(the per-item figures of one suite's records in one mode, their intervals); (None, {}) when the records hold
    no items (nothing scored)."""
    try:
        items, _ = suite_items(suite, mode, records)
    except (KeyError, TypeError, ValueError) as err:  # records of a shape the items cannot be read from: said, not fatal
        logger.warning("eval %s (%s): no intervals: %s", suite, mode, err)
        return None, {}
    if items is None or not len(items.keys):
        return None, {}
    return items, items_intervals(items)


def paired_deltas(current: dict[tuple[str, str], Items], baseline: dict[tuple[str, str], Items],
                  bare: str | None, margin: float = 0.0, alpha: float = REGRESSION_ALPHA,
                  readings: tuple[dict[str, str], dict[str, str]] | None = None,
                  ) -> tuple[dict[str, float], dict[str, dict[str, Any]], list[str], list[str]]:
    """Each (suite, mode) present in both and read alike: the paired difference of every figure (current - baseline,
    same resamples of each suite's units for both, the paired test's p over those units). ``readings``: ({mode:
    reading} of the current evaluation, of the baseline; None: one judge's, alike). Returns (logged keys
    ``eval/<suite>[/<mode>]/delta/<metric>`` and its ``delta_ci_low``, ``delta_ci_high``, ``p_value``, ``n_units``;
    {suite: {mode: {metric: paired figures}}}; the categories that got worse: ``<suite>[/<mode>]/<metric>`` that
    `judgetrain.eval.compare.changes` calls worse, every figure of every suite and mode judged together; why a suite
    and mode was not differenced: two readings)."""
    keys: dict[str, float] = {}
    deltas: dict[str, dict[str, Any]] = {}
    judged: dict[str, dict[str, Any]] = {}
    not_compared: list[str] = []
    for (suite, mode), items in current.items():
        base = baseline.get((suite, mode))
        if base is None:
            continue
        why = different_readings(mode, *(r.get(mode) for r in readings), sides=("this judge", "the baseline")) \
            if readings is not None else None
        if why is not None:
            not_compared.append(f"{suite} ({mode}): {why}")
            continue
        paired = paired_figures(items, base)
        if not paired:
            continue
        deltas.setdefault(suite, {})[mode] = paired
        keys.update(delta_keys(suite, mode, bare, paired))
        where = suite if mode == bare else f"{suite}/{mode}"
        judged.update({f"{where}/{metric}": v for metric, v in paired.items()})
    worse = [name for name, said in changes(judged, margin, alpha).items() if said == "worse"]
    for why in not_compared:
        logger.warning("against the baseline, not compared: %s", why)
    return keys, deltas, worse, not_compared


def read_baseline(folder: str | Path, modes: list[str] | None = None) -> dict[tuple[str, str], Items]:
    """The per-item figures of a saved evaluation (its per-row files), for the modes given (default all); {} when the
    folder holds none."""
    folder = Path(folder)
    if not (folder / "results.json").is_file():
        return {}
    out = {}
    for (suite, mode), path in row_files(folder).items():
        if modes is None or mode in modes:
            items, _ = suite_evidence(suite, mode, read_records(path))
            if items is not None:
                out[(suite, mode)] = items
    return out


def headline_table(summary: dict[str, Any]) -> str:
    """One compact table of the headline figures of an evaluation's summary (results.json): per suite and mode (each
    figure named with its mode and reading), each figure with its interval and, against a baseline, the difference,
    its interval and p-value; what was not compared (two readings) and the categories that got worse after it."""
    flat = summary.get("metrics", {})
    bare = summary.get("scoring")
    readings = summary.get("readings") or {}
    lines = [f"{'figure (mode: reading)':<60} {'value':>7} {'95% interval':>17} {'delta':>8} {'delta interval':>19} "
             f"{'p':>7}"]
    one_unit = False
    for suite, figures in HEADLINE.items():
        for mode in summary.get("scoring_modes", [bare]):
            base = f"eval/{suite}/" if mode == bare else f"eval/{suite}/{mode}/"
            for metric in figures:
                value = flat.get(base + metric)
                if value is None:
                    continue
                low, high = flat.get(f"{base}{metric}/ci_low"), flat.get(f"{base}{metric}/ci_high")
                one_unit |= low is None and _units(summary, base, metric) == 1
                named = named_figure(base[5:] + metric, mode, readings.get(mode))
                row = f"{named:<60} {_num(value):>7} {_pair(low, high):>17}"
                d = flat.get(f"{base}delta/{metric}")
                if d is not None:
                    row += (f" {_num(d, signed=True):>8} "
                            f"{_pair(flat.get(f'{base}delta/{metric}/delta_ci_low'), flat.get(f'{base}delta/{metric}/delta_ci_high')):>19}"
                            f" {_num(flat.get(f'{base}delta/{metric}/p_value')):>7}")
                lines.append(row)
    if one_unit:
        lines.append(ONE_UNIT)
    lines += [f"not compared: {why}" for why in summary.get("not_compared") or []]
    if "regressions" in summary:
        worse = summary["regressions"]
        lines.append(f"worse than the baseline: {', '.join(worse)}" if worse else "no category got worse")
    return "\n".join(lines)


ONE_UNIT = ("a figure without an interval lies in one unit (one pair, one source sample): resampling it gives back "
            "the same figure")


def _units(summary: dict[str, Any], base: str, metric: str) -> int | None:
    """The units of independence a figure's interval was drawn from (results.json ``intervals``; ``base``:
    ``eval/<suite>/[<mode>/]``), None where not recorded."""
    parts = base.split("/")[1:-1]
    mode = parts[1] if len(parts) > 1 else summary.get("scoring")
    return ((((summary.get("intervals") or {}).get(parts[0]) or {}).get(mode) or {}).get(metric) or {}).get("n_units")


def _num(value: Any, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _pair(low: Any, high: Any) -> str:
    return f"[{_num(low)}, {_num(high)}]" if low is not None else ""
