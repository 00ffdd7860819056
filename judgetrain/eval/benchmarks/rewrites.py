"""Held-out representational rewrites (``eval_rewrites_source``; the loop writes ``<output_dir>/heldout/rewrites.jsonl``
with `judgetrain.perturb.known.write_heldout_rewrites`): rows of the pairwise schema in two categories, each scored
as the other pairwise suites score a pair (each response alone in implicit and judge mode, the higher score wins; both
orders in verdict and generate modes, each order's verdict counted: a judge that always picks the first-shown response
scores 0.5 on both figures, `Rewrites.wins`):

- ``source_vs_rewrite``: ``response_a`` the source, ``response_b`` its rewrite (same meaning, other form), label A>B.
  ``rewrite_below_source_rate`` is the share the source wins: the rewrites the judge scores below their source (lower
  is better: a rewrite is no worse); ``rewrite_gap`` the mean score of the rewrite minus its source's (implicit and
  judge modes; best at 0).
- ``rewrite_vs_error``: ``response_a`` a rewrite, ``response_b`` an error copy of the same source, label A>B.
  ``rewrite_over_error`` is the share the rewrite wins: whether the judge tells an error from a change of form.

The unit is the source sample (``sample_id``): its rows are resampled together.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from judgetrain.config.suites import register
from judgetrain.eval.benchmarks.base import Suite
from judgetrain.eval.benchmarks.pairwise import TeamPairs
from judgetrain.eval.benchmarks.verdicts import swap_verdict
from judgetrain.eval.stats import Items, finite_mean

SOURCE_VS_REWRITE, REWRITE_VS_ERROR = "source_vs_rewrite", "rewrite_vs_error"
FIGURES = {"rewrite_over_error": REWRITE_VS_ERROR, "rewrite_below_source_rate": SOURCE_VS_REWRITE}


def rewrite_gap(record: dict) -> float:
    """A source_vs_rewrite record's score of the rewrite minus its source's (two scores, implicit or judge mode);
    NaN for any other record."""
    scores = record.get("scores")
    if record.get("category") != SOURCE_VS_REWRITE or not isinstance(scores, (list, tuple)) or len(scores) != 2 \
            or any(s is None for s in scores):
        return math.nan
    return float(scores[1]) - float(scores[0])


@register
class Rewrites(TeamPairs):
    """Held-out rewrites against their source and against an error copy of the same source (see the module doc)."""

    name = "rewrites"
    title = "held-out rewrites"
    hub = "held-out-rewrites"
    headline = ("rewrite_over_error", "rewrite_below_source_rate", "rewrite_gap")
    headline_place = 6
    report_headline = (("rewrite_over_error", "Rewrite ranked above an error copy of its source"),
                       ("rewrite_below_source_rate", "Rewrites scored below their source"))
    example_figure = "rewrite_over_error"

    def items(self, records: list[dict], mode: str) -> tuple[Items | None, str | None]:
        """Per row: ``rewrite_over_error`` (on rewrite_vs_error rows, NaN on the others), ``rewrite_below_source_rate``
        (on source_vs_rewrite rows), each the share of the row's verdicts its response wins (`wins`: 1 / 0 from two
        scores; each order counted in verdict and generate modes), and ``rewrite_gap``; clustered by sample."""
        kept = [r for r in records if not r.get("skipped")]
        if not kept:
            return None, "no row was scored"
        items, why = super().items(records, mode)  # a pair's right / wrong by JudgeBench's rule, units by sample
        if items is None:
            return None, why
        categories = np.asarray([r.get("category") for r in kept], dtype=object)
        values = {name: np.where(categories == category, self.wins(kept, items, mode, name), np.nan)
                  for name, category in FIGURES.items()}
        values["rewrite_gap"] = np.asarray([rewrite_gap(r) for r in kept], dtype=np.float64)
        binary = tuple(name for name in FIGURES if np.isin(values[name][np.isfinite(values[name])], (0.0, 1.0)).all())
        return Items(items.keys, values, clusters=items.clusters, binary=binary), None

    @staticmethod
    def wins(records: list[dict], items: Items, mode: str, figure: str) -> np.ndarray:
        """Per row, the share of its verdicts in which the response ``label`` names wins (the source over its rewrite,
        the rewrite over an error copy). In verdict and generate modes each order's verdict counts (read back to the
        row's order), so a judge that always picks the response shown first wins half its verdicts: 0.5, never the
        0 JudgeBench's sum of the two orders gives it, which for ``rewrite_below_source_rate`` (lower is better) read
        as a judge that never puts a rewrite below its source. A verdict not read counts against the judge (below its
        source; not over the error copy); a tie names neither. In implicit and judge modes the two verdicts are one,
        derived from two scores: the row right / wrong."""
        if mode not in ("verdict", "generate"):
            return items.values["accuracy"]
        unread = 1.0 if figure == "rewrite_below_source_rate" else 0.0
        out = []
        for r in records:
            verdicts = list(r.get("verdicts") or [None])
            as_row = verdicts[:1] + [swap_verdict(v) for v in verdicts[1:]]  # the second was shown swapped
            out.append(float(np.mean([unread if v is None else float(v == r["label"]) for v in as_row])))
        return np.asarray(out, dtype=np.float64)

    def figures(self, records: list[dict], scoring: str) -> dict[str, Any]:
        items, _ = self.items(records, scoring)
        if items is None:
            return {"n": 0}
        out: dict[str, Any] = {name: finite_mean(items.values[name]) for name in (*FIGURES, "rewrite_gap")}
        out.update({f"n_{category}": int(np.isfinite(items.values[name]).sum()) for name, category in FIGURES.items()})
        out["n"] = len(items.keys)
        return out

    def log_figures(self, results: Any, base: str) -> dict[str, float]:
        """Its own figures, one level of numbers (not JudgeBench's accuracy and categories)."""
        return Suite.log_figures(self, results, base)
