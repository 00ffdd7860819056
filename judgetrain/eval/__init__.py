"""Evaluation: one scoring engine (`scoring`), the suites (`suites`), the runner, the per-epoch callback and the CLI.

    from judgetrain.eval import ScoringEngine, SuiteSpec, evaluate
    engine = ScoringEngine(model, tokenizer, scoring="implicit")
    results = evaluate(engine, [SuiteSpec("rmbench", source="/path/to/rm-bench", max_rows=200)])
    results["rmbench"].flat()   # {"eval/rmbench/hard_acc": ..., "eval/rmbench/chat/avg_acc": ...}
"""

from judgetrain.eval.runner import SuiteResult, evaluate, flat_metrics, write_records
from judgetrain.eval.scoring import Request, RowScore, ScoringEngine, score_sharded
from judgetrain.eval.suites import SUITES, SuiteSpec, load_suite_rows

__all__ = [
    "SUITES", "Request", "RowScore", "ScoringEngine", "SuiteResult", "SuiteSpec", "evaluate", "flat_metrics",
    "load_suite_rows", "score_sharded", "write_records",
]
