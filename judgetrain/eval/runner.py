"""Run suites through a `ScoringEngine`, sharded over processes, and write what they found.

`evaluate_and_write` is the one evaluation path: the per-epoch callback and `judgetrain eval` both call it, so both
write the same files: ``<suite>.jsonl`` (one record per row) and ``results.json`` (see `eval_summary`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from judgetrain.eval.scoring import ScoringEngine, score_sharded
from judgetrain.eval.suites import SuiteSpec, build_record, build_request, load_suite_rows, suite_metrics
from judgetrain.eval.metrics import flatten_eval_metrics, nan_to_none

logger = logging.getLogger(__name__)


@dataclass
class SuiteResult:
    """One suite's outcome: ``metrics`` (nested, from judgetrain.eval.metrics plus counts), per-row ``records`` in row
    order, and ``stats`` (engine work for this suite: sequences, real/padded tokens, forwards, seconds)."""

    name: str
    metrics: dict[str, Any]
    records: list[dict]
    stats: dict[str, float] = field(default_factory=dict)

    def flat(self, prefix: str = "eval/") -> dict[str, float]:
        """Logged keys of this suite (docs/evaluation.md, "Where metrics go"), e.g. ``eval/rmbench/hard_acc``."""
        return flatten_eval_metrics(self.name, self.metrics, prefix=prefix)


def evaluate(
    engine: ScoringEngine,
    specs: list[SuiteSpec],
    *,
    state: Any | None = None,
) -> dict[str, SuiteResult]:
    """Score every suite (all processes must call this together when ``state`` has several processes).

    Rows are loaded once per spec and kept on it (``spec.rows``) so later calls score the same rows. Returns
    {suite name: SuiteResult}; every process gets the full results.
    """
    results: dict[str, SuiteResult] = {}
    for spec in specs:
        if spec.rows is None:
            spec.rows = load_suite_rows(spec)  # the cap is applied here once; later calls keep these rows
            spec.max_rows = None
        rows = list(spec.rows) if not isinstance(spec.rows, list) else spec.rows
        requests = [build_request(spec.name, row, engine.scoring) for row in rows]
        for i, req in enumerate(requests):
            req.cache_key = f"{spec.key}:{i}"  # the engine keeps each row's token ids across evals
        before = engine.stats.as_dict()
        engine.rows_per_rank = None
        t0 = time.perf_counter()
        scores = score_sharded(engine, requests, state)
        seconds = time.perf_counter() - t0
        records = [build_record(spec.name, i, row, s, engine.scoring) for i, (row, s) in enumerate(zip(rows, scores))]
        metrics = suite_metrics(spec.name, records, engine.scoring)
        metrics["runtime"] = seconds
        after = engine.stats.as_dict()
        stats = {k: after[k] - before[k] for k in after}  # this process's share of the work
        stats["seconds"] = seconds
        if engine.rows_per_rank is not None:
            stats["rows_per_rank"] = list(engine.rows_per_rank)
        results[spec.name] = SuiteResult(spec.name, metrics, records, stats)
        logger.info("eval %s: %d rows (%d skipped, %d truncated) in %.1fs", spec.name, len(rows),
                    metrics["n_skipped"], metrics["n_truncated"], seconds)
    return results


def flat_metrics(results: dict[str, SuiteResult], prefix: str = "eval/") -> dict[str, float]:
    out: dict[str, float] = {}
    for res in results.values():
        out.update(res.flat(prefix))
    return out


def write_records(results: dict[str, SuiteResult], directory: str | Path) -> list[Path]:
    """Write <directory>/<suite>.jsonl (one record per row). Call on the main process only."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, res in results.items():
        path = directory / f"{name}.jsonl"
        with path.open("w") as f:
            for rec in res.records:
                f.write(json.dumps(nan_to_none(rec)) + "\n")
        paths.append(path)
    return paths


RESULTS_FILE = "results.json"


def eval_summary(results: dict[str, SuiteResult], engine: ScoringEngine, *, num_processes: int = 1,
                 **about: Any) -> dict[str, Any]:
    """The results.json document: ``about`` (what was scored: model / adapter, or step / epoch), the logged flat
    ``metrics``, the nested ``results`` and per-suite ``stats`` of each suite, and the engine's totals."""
    return {
        **about,
        "scoring": engine.scoring,
        "metrics": flat_metrics(results),
        "results": {name: r.metrics for name, r in results.items()},
        "stats": {name: r.stats for name, r in results.items()},
        "engine": engine.stats.as_dict(),
        "num_processes": num_processes,
        **_model_sharding(engine.model),
    }


def _model_sharding(model) -> dict[str, Any]:
    """Under FSDP2 / ZeRO-3, what this rank held once scoring was done (never the whole model)."""
    from judgetrain.trainer.parallelism import sharding_of

    held = sharding_of(model)
    return {"model_sharding": dict(held, module=type(model).__name__)} if held["sharded_tensors"] else {}


def evaluate_and_write(
    engine: ScoringEngine,
    specs: list[SuiteSpec],
    directory: str | Path,
    *,
    state: Any | None = None,
    **about: Any,
) -> tuple[dict[str, SuiteResult], dict[str, Any]]:
    """`evaluate` on every process, then, on the main process, ``<directory>/<suite>.jsonl`` and
    ``<directory>/results.json``. Returns (results, summary); every process gets both."""
    results = evaluate(engine, specs, state=state)
    summary = eval_summary(results, engine, num_processes=getattr(state, "num_processes", 1), **about)
    if state is None or state.is_main_process:
        write_records(results, directory)
        (Path(directory) / RESULTS_FILE).write_text(json.dumps(nan_to_none(summary), indent=1))
    return results, summary
