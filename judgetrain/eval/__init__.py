"""Evaluation: one scoring engine (`scoring`), the suites (`suites`), the runner, the per-epoch callback and the CLI.

    from judgetrain.eval import ScoringEngine, SuiteSpec, evaluate, evaluate_and_write
    engine = ScoringEngine(model, tokenizer, scoring="implicit")
    specs = [SuiteSpec("rmbench", source="/path/to/rm-bench", max_rows=200)]
    results = evaluate(engine, specs)
    results["rmbench"].flat()   # {"eval/rmbench/hard_acc": ..., "eval/rmbench/chat/avg_acc": ...}
    results, summary = evaluate_and_write(engine, specs, "out/")   # + out/<suite>.jsonl and out/results.json
"""

from judgetrain.eval.runner import SuiteResult, evaluate, evaluate_and_write, flat_metrics, write_records
from judgetrain.eval.scoring import Request, RowScore, ScoringEngine, score_sharded
from judgetrain.eval.suites import SUITES, SuiteSpec, load_suite_rows

__all__ = [
    "SUITES", "Request", "RowScore", "ScoringEngine", "SuiteResult", "SuiteSpec", "evaluate", "evaluate_and_write",
    "flat_metrics", "load_suite_rows", "score_sharded", "write_records",
]
