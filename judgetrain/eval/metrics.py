"""The metric functions by one name: each benchmark's figures live in its suite's module
(`judgetrain.eval.benchmarks`), the statistics in `judgetrain.eval.stats`, the logged keys in
`judgetrain.eval.logkeys`; this module gathers them for `judgetrain.metrics` (the public home) and older imports.

Pure numpy (no torch). The names of the returned keys and of the logged keys (see `flatten_eval_metrics`) are a public
interface: docs/evaluation.md lists them ("Where metrics go"), and runs, reports and dashboards are read by them.
Ties always count as wrong, exactly as the reference ``compute_accuracy`` of RM-Bench, which compares with a strict
``>``.
"""

from __future__ import annotations

from judgetrain.eval.benchmarks.base import generation_summary
from judgetrain.eval.benchmarks.evalbiasbench import (evalbiasbench_items, evalbiasbench_results,
                                                      predictions_from_scores)
from judgetrain.eval.benchmarks.ideation import ideation_accuracy, ideation_generated
from judgetrain.eval.benchmarks.judgebench import judgebench_category, judgebench_items, judgebench_results
from judgetrain.eval.benchmarks.judgebias import (DETECT_THRESHOLD, JUDGEBIAS_CATEGORIES, judgebias_checks,
                                                  judgebias_generated)
from judgetrain.eval.benchmarks.rmbench import (MATRIX_SIZE, RMBENCH_DOMAINS, rmbench_accuracy, rmbench_domain,
                                                rmbench_intervals, rmbench_items, rmbench_matrices, rmbench_results,
                                                style_spread)
from judgetrain.eval.benchmarks.verdicts import (POSITION_FIGURES, derived_verdicts, first_position_prob,
                                                 first_position_share, swap_verdict, verdict_from_scores)
from judgetrain.eval.logkeys import (INTERVAL_SUFFIXES, flatten_eval_metrics, flatten_mode_metrics, interval_keys,
                                     split_interval_keys, to_trainer_log_keys)
from judgetrain.eval.stats import (CONFIDENCE, N_RESAMPLES, Items, bootstrap_ci, items_intervals, mcnemar_p,
                                   paired_difference, sign_flip_p, sign_test_p, smallest_p, spearman)

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
    "derived_verdicts",
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

_ALSO = (MATRIX_SIZE, JUDGEBIAS_CATEGORIES, DETECT_THRESHOLD, POSITION_FIGURES, CONFIDENCE, INTERVAL_SUFFIXES,
         split_interval_keys, first_position_prob, first_position_share)  # imported here by name, not in __all__
