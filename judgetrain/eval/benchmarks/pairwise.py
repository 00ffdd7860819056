"""A team's own held-out pairs (``eval_pairwise_source``, a file or folder in judgetrain's pairwise schema, columns
renamed by ``eval_pairwise_columns``), scored by JudgeBench's rule with each row's ``category``. Pairs that carry the
source sample they were made from (``sample_id``: the loop's held-out pairs, several error copies of one text) are
resampled and counted by sample, not by pair.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from judgetrain.config.suites import register
from judgetrain.data.pairwise import load_pairwise
from judgetrain.eval.benchmarks.judgebench import JudgeBench
from judgetrain.eval.benchmarks.verdicts import POSITION_FIGURES
from judgetrain.eval.stats import Items


@register
class TeamPairs(JudgeBench):
    """A team's held-out pairs: JudgeBench's figures, categories as given."""

    name = "pairwise"
    title = "held-out pairs"
    hub = "held-out-pairs"
    headline = ("accuracy", "inconsistent_rate", *POSITION_FIGURES)
    headline_place = 5
    report_headline = (("accuracy", "Held-out pairs accuracy (each response scored alone)"),
                       ("verdict/accuracy", "Held-out pairs accuracy (verdicts, both orders)"))
    unit = "a pair, or a source sample's pairs where the rows name their sample_id"

    def load(self, spec: Any, source: Any, **common: Any) -> Any:
        return load_pairwise(source, columns=spec.columns, split=spec.split, **common)

    def pair_fields(self, row: dict, verdicts: list[str | None]) -> dict[str, Any]:
        return {**super().pair_fields(row, verdicts), "sample_id": row.get("sample_id")}

    def items(self, records: list[dict], mode: str) -> tuple[Items | None, str | None]:
        """JudgeBench's per-pair figures, clustered by the pairs' source sample where they name it (a pair without
        one is its own unit)."""
        items, why = super().items(records, mode)
        kept = [r for r in records if not r.get("skipped")]
        if items is not None and any(r.get("sample_id") is not None for r in kept):
            items.clusters = np.asarray([f"sample {r['sample_id']}" if r.get("sample_id") is not None
                                         else f"pair {key!r}" for r, key in zip(kept, items.keys)], dtype=object)
        return items, why
