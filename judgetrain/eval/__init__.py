"""Evaluation: one scoring engine (`scoring`, its token sequences built in `sequences`), the generator (`generate`,
its vLLM backend in `vllm`), the suites (`suites`), the runner, the evaluation built in one place (`session`), the
per-epoch callback and the CLI.

    from judgetrain.eval import ScoringEngine, SuiteSpec, evaluate, evaluate_and_write
    engine = ScoringEngine(model, tokenizer, scoring="implicit")
    specs = [SuiteSpec("rmbench", source="/path/to/rm-bench", max_rows=200)]
    results = evaluate(engine, specs)
    results["rmbench"].flat()   # {"eval/rmbench/hard_acc": ..., "eval/rmbench/chat/avg_acc": ...}
    results, summary = evaluate_and_write(engine, specs, "out/")   # + out/<suite>.jsonl and out/results.json
"""

import importlib

# Resolved on first use (PEP 562), so that `judgetrain.eval.metrics` (pure numpy) imports without torch.
_EXPORTS = {
    "SuiteResult": "runner", "evaluate": "runner", "evaluate_and_write": "runner", "flat_metrics": "runner",
    "write_records": "runner", "Request": "sequences", "RowScore": "sequences", "ScoringEngine": "scoring",
    "score_sharded": "scoring", "SUITES": "suites", "SuiteSpec": "suites", "load_suite_rows": "suites",
    "Evaluation": "session",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
