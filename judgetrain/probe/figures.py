"""A probe's figures: per kind of pair, per method and per perturbation type (and ``all``), the share of pairs whose
better text is ranked first, with its 95% percentile bootstrap interval over source samples (the pairs of one sample
are drawn together: `judgetrain.eval.metrics.items_intervals` with the sample as the cluster), and the table the
command logs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from judgetrain.eval.stats import N_RESAMPLES, Items, items_intervals
from judgetrain.probe.pairs import KINDS, ProbeSet

ALL = "all"
# what each kind's share means, for the table's title
MEANING = {"error": "source ranked above its error copy",
           "represent": "source ranked above its rewrite (the base sees change; an invariant judge: 0.5 or ties)",
           "cross": "rewrite ranked above an error copy of the same source"}
SHORT = {"loglik_mean": "loglik_mean", "loglik_sum": "loglik_sum", "judge": "judge",
         "verdict": "verdict", "verdict_both": "verdict both", "probe_held_out_type": "probe type out",
         "probe_held_out_samples": "probe samples out", "probe_error_transfer": "error probe"}


def kind_figures(probe: ProbeSet, kind: str, values: dict[str, np.ndarray], *, n_resamples: int = N_RESAMPLES,
                 seed: int = 0) -> dict[str, dict[str, dict[str, Any]]]:
    """{method: {type or "all": {value, ci_low, ci_high, n, n_samples}}} of ``kind``'s pairs; ``values``: {method:
    per pair of the whole probe set, 1 / 0 / NaN}."""
    index = [i for i, p in enumerate(probe.pairs) if p.kind == kind]
    if not index:
        return {}
    types = [probe.pairs[i].perturbation_type for i in index]
    samples = np.asarray([str(probe.pairs[i].sample_id) for i in index], dtype=object)
    columns: dict[str, np.ndarray] = {}
    for method, per_pair in values.items():
        v = np.asarray(per_pair, dtype=np.float64)[index]
        columns[f"{method}\t{ALL}"] = v
        for t in dict.fromkeys(types):
            columns[f"{method}\t{t}"] = np.where(np.asarray(types) == t, v, np.nan)
    intervals = items_intervals(Items(list(index), columns, clusters=samples), n_resamples=n_resamples, seed=seed)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, figure in intervals.items():
        method, ptype = key.split("\t")
        held = np.isfinite(columns[key])
        out.setdefault(method, {})[ptype] = {**figure, "n_samples": len(set(samples[held]))}
    return out


ONE_UNIT_NOTE = ("a figure without an interval holds one source sample: every resample draws that one sample and "
                 "gives back the same figure, so it has no interval")


def _cell(figure: dict | None) -> str:
    if not figure or figure["n"] == 0 or not math.isfinite(figure["value"]):
        return "-"
    low, high = figure["ci_low"], figure["ci_high"]
    return f"{figure['value']:.2f} [{low:.2f},{high:.2f}]" if math.isfinite(low) else f"{figure['value']:.2f}"


def table(figures: dict[str, dict[str, dict[str, dict[str, Any]]]]) -> str:
    """One block per kind: a row per type (and all), a column per method, each cell value [95% interval]."""
    blocks = []
    for kind in KINDS:
        methods = figures.get(kind)
        if not methods:
            continue
        names = list(methods)
        types = [t for t in dict.fromkeys(t for m in names for t in methods[m]) if t != ALL] + [ALL]
        width = max(len(t) for t in types) + 2
        n_of = {t: max(methods[m].get(t, {}).get("n", 0) for m in names) for t in types}
        lines = [f"{kind}: share of pairs, {MEANING[kind]}",
                 f"{'type':<{width}}{'pairs':>6}  " + "".join(f"{SHORT.get(m, m):>19}" for m in names)]
        for t in types:
            lines.append(f"{t:<{width}}{n_of[t]:>6}  " + "".join(f"{_cell(methods[m].get(t)):>19}" for m in names))
        if any(f.get("n_units") == 1 for m in names for f in methods[m].values()):
            lines.append(ONE_UNIT_NOTE)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
