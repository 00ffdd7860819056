"""The evidence part: what the intervals and the paired deltas add to an evaluation, at ``--evidence-rows`` rows
(default 10,000), as a share of the evaluation's own time.

The evaluation's time is measured on real RM-Bench rows with the engine (``--eval-rows`` of them, implicit mode),
taken per row and scaled to ``--evidence-rows`` (the engine's time grows with the rows; `bench_eval_scale` measures
how). The evidence is timed on that many records of RM-Bench's shape (6 scores per prompt, 4 domains) and of
JudgeBench's (two verdicts per pair, 4 categories), drawn at random: the bootstrap's cost depends on the number of
items and figures, not on their values. Per suite: the intervals of one evaluation, then the paired deltas against a
second one (`judgetrain.eval.evidence`, as each eval with a baseline runs them).
"""

# Late imports: numpy, judgetrain.eval (inside the functions that use them): each benchmark part loads only what it
# measures.

from __future__ import annotations

import argparse
import time
from typing import Any

from judgetrain.bench.common import median, ratio
from judgetrain.bench.eval import engine_epoch, grow_rows, rmbench_rows

DOMAINS = ("chat", "math", "code", "safety-refuse")
SOURCES = ("mmlu-pro-law", "livebench-reasoning", "livebench-math", "livecodebench")


def bench_evidence(cfg: argparse.Namespace, model, tokenizer) -> dict[str, Any]:
    """{"rows", "eval_seconds_per_row" (measured), "eval_seconds" (scaled to rows), per suite {"intervals_seconds",
    "deltas_seconds", "seconds", "share_of_eval"}, "share_of_eval" (both suites' evidence / one eval's time)}."""
    from judgetrain.eval import ScoringEngine

    n = cfg.evidence_rows
    rows = grow_rows(rmbench_rows(cfg.rmbench_source, None), cfg.eval_rows or 8)
    engine = ScoringEngine(model, tokenizer, scoring="implicit", batch_tokens=cfg.eval_batch_tokens,
                           max_length=cfg.eval_max_length)
    engine_epoch(engine, rows)  # the first epoch fills the reference cache: the later ones are what training repeats
    per_row = median([engine_epoch(engine, rows)[0] for _ in range(max(1, cfg.repeats or 1))]) / len(rows)
    out: dict[str, Any] = {"rows": n, "eval_rows_measured": len(rows), "eval_seconds_per_row": per_row,
                           "eval_seconds": per_row * n}
    total = 0.0
    for suite, mode, records in (("rmbench", "judge", _rmbench_records), ("judgebench", "verdict", _judgebench_records)):
        figures = _time_evidence(suite, mode, records(n, 0), records(n, 1), cfg.repeats or 1)
        figures["share_of_eval"] = ratio(figures["seconds"], per_row * n)
        total += figures["seconds"]
        out[suite] = figures
    out["share_of_eval"] = ratio(total, per_row * n)
    return out


def _time_evidence(suite: str, mode: str, current: list[dict], base: list[dict], repeats: int) -> dict[str, float]:
    from judgetrain.eval.evidence import paired_deltas, suite_evidence

    intervals, deltas = [], []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        items, _ = suite_evidence(suite, mode, current)
        t1 = time.perf_counter()
        base_items, _ = suite_evidence(suite, mode, base)  # in training the baseline's items are kept from step 0
        t2 = time.perf_counter()
        paired_deltas({(suite, mode): items}, {(suite, mode): base_items}, mode)
        intervals.append(t1 - t0)
        deltas.append(time.perf_counter() - t2)
    return {"intervals_seconds": median(intervals), "deltas_seconds": median(deltas),
            "seconds": median(intervals) + median(deltas)}


def _rmbench_records(n: int, seed: int) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(n, 6)).round(4).tolist()
    return [{"id": f"{DOMAINS[i % 4]}/{i}", "domain": DOMAINS[i % 4], "score_chosen": s[:3], "score_rejected": s[3:]}
            for i, s in enumerate(scores)]


def _judgebench_records(n: int, seed: int) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(seed)
    verdicts = np.asarray(["A>B", "B>A", "A=B"])[rng.integers(0, 3, size=(n, 2))].tolist()
    labels = np.asarray(["A>B", "B>A"])[rng.integers(0, 2, size=n)].tolist()
    return [{"id": str(i), "label": label, "source": SOURCES[i % 4], "verdicts": v}
            for i, (label, v) in enumerate(zip(labels, verdicts))]
