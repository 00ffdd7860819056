"""A team's own held-out pairs (``eval_pairwise_source``, a file or folder in judgetrain's pairwise schema, columns
renamed by ``eval_pairwise_columns``), scored by JudgeBench's rule with each row's ``category``.
"""

from __future__ import annotations

from typing import Any

from judgetrain.config.suites import register
from judgetrain.data.pairwise import load_pairwise
from judgetrain.eval.benchmarks.judgebench import JudgeBench
from judgetrain.eval.benchmarks.verdicts import POSITION_FIGURES


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

    def load(self, spec: Any, source: Any, **common: Any) -> Any:
        return load_pairwise(source, columns=spec.columns, split=spec.split, **common)
