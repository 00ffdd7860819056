"""Held-out representational rewrites: the loop's split writes each held-out rewrite against its source and against
an error copy of the same source (`write_heldout_rewrites`), and the ``rewrites`` suite reads them: the share of
rewrites scored below their source, the rewrite's score gap to its source and the share of rewrites ranked above the
error copy, worked by hand, and through the real `judgetrain eval` on the tiny judge (its figures recomputed from its
per-row file, each with its interval)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import REPO, read_jsonl
from test_loop import DRUGS, loop_config


def split_rewrites(tmp_path: Path) -> tuple[Path, list[dict]]:
    """The loop's items and split stages on the 12 notes (a quarter of the samples held out): its held-out rewrites
    file and rows."""
    from judgetrain.loop.config import load_config
    from judgetrain.loop.run import Loop, open_state

    config = load_config(loop_config(tmp_path, eval={"suites": ["pairwise", "rewrites"], "scoring": ["judge"]}))
    out = Path(config.output_dir)
    loop = Loop(config, out, open_state(config, out))
    for stage in ("items", "split"):
        loop.stage(1, stage)
    return out / "heldout" / "rewrites.jsonl", read_jsonl(out / "heldout" / "rewrites.jsonl")


def test_the_split_writes_each_held_out_rewrite_against_its_source_and_an_error_copy(tmp_path):
    path, rows = split_rewrites(tmp_path)
    held = json.loads((path.parent.parent / "round-1" / "split" / "split.json").read_text())["heldout_samples"]
    assert len(held) == 3
    by_kind = {kind: {r["sample_id"]: r for r in rows if r["category"] == kind}
               for kind in ("source_vs_rewrite", "rewrite_vs_error")}
    # one rewrite (the number format) and one error copy (the drug swapped) per held-out note, nothing else
    assert len(rows) == 6 and set(by_kind["source_vs_rewrite"]) == set(by_kind["rewrite_vs_error"]) == set(held)
    for sid in held:
        i = int(sid)
        source, swap = by_kind["source_vs_rewrite"][sid], by_kind["rewrite_vs_error"][sid]
        assert source["response_a"] == f"Give {DRUGS[i % 3]} {1000 + 100 * i} mg daily."
        assert source["response_b"] == f"Give {DRUGS[i % 3]} {1000 + 100 * i:,} mg daily."  # the same, 1,100
        assert swap["response_a"] == source["response_b"]  # the rewrite against ...
        assert DRUGS[i % 3] not in swap["response_b"] and f"{1000 + 100 * i} mg" in swap["response_b"]  # ... the error
        assert source["label"] == swap["label"] == "A>B" and source["prompt"] == f"Patient: P{i}\n\nNote:"
        assert swap["id"] == f"{sid}|spacing_100pct|drug_swap_100pct"


def record(kind: str, sample: str, scores: list[float]) -> dict:
    from judgetrain.eval.benchmarks.verdicts import derived_verdicts

    return {"id": f"{sample}|{kind}", "sample_id": sample, "category": kind, "label": "A>B",
            "verdicts": derived_verdicts(*scores), "scores": scores}


def test_the_figures_worked_by_hand_and_their_directions():
    from judgetrain.config.directions import direction
    from judgetrain.eval.benchmarks import get_suite

    suite = get_suite("rewrites")
    records = [record("source_vs_rewrite", "1", [2.0, 1.0]),  # the rewrite scored below its source: gap -1
               record("source_vs_rewrite", "2", [1.0, 3.0]),  # above it: gap +2
               record("source_vs_rewrite", "3", [1.0, 1.0]),  # equal: not below, gap 0
               record("rewrite_vs_error", "1", [2.0, 1.0]),  # the rewrite above the error copy
               record("rewrite_vs_error", "2", [1.0, 1.0])]  # a tie ranks neither above
    figures = suite.figures(records, "judge")
    assert figures["rewrite_below_source_rate"] == pytest.approx(1 / 3)
    assert figures["rewrite_gap"] == pytest.approx(1 / 3)
    assert figures["rewrite_over_error"] == pytest.approx(0.5)
    assert (figures["n_source_vs_rewrite"], figures["n_rewrite_vs_error"], figures["n"]) == (3, 2, 5)
    items, why = suite.items(records, "judge")
    assert why is None and sorted(set(items.clusters)) == ["sample 1", "sample 2", "sample 3"]
    assert direction("eval/rewrites/rewrite_below_source_rate") == "lower"
    assert direction("eval/rewrites/rewrite_gap") == "closer to 0"
    assert direction("eval/rewrites/rewrite_over_error") == "higher"


def test_verdict_mode_reads_both_orders_so_a_position_lean_scores_no_best_value():
    """Verdict mode: a judge that always answers [[A>B]] (log-probabilities [0, -5] in both orders) picks the response
    shown first, so each rewrite wins one order of two against its source and against the error copy: 0.5 on both
    figures, never the 0 (rewrite_below_source_rate's best value) that JudgeBench's sum of the orders gave it. A judge
    that ranks by content (source over rewrite in both orders, rewrite over error in both) gets 1.0 and 1.0; one
    whose swapped verdict was not read counts that order against it."""
    from judgetrain.eval.benchmarks import get_suite
    from judgetrain.eval.requests import RowScore

    suite = get_suite("rewrites")
    rows = [{"id": f"{i}|{kind}", "sample_id": str(i), "prompt": "q", "response_a": "a", "response_b": "b",
             "label": "A>B", "category": kind} for i in range(1, 5) for kind in ("source_vs_rewrite", "rewrite_vs_error")]

    def figures(scores, mode="verdict"):
        records = [{"row_index": i, **suite.row_fields(r, RowScore(scores), mode)} for i, r in enumerate(rows)]
        return suite.figures(records, mode)

    lean = figures([0.0, -5.0, 0.0, -5.0])  # [[A>B]] likelier as shown and swapped
    assert (lean["rewrite_below_source_rate"], lean["rewrite_over_error"]) == (0.5, 0.5)
    content = figures([0.0, -5.0, -5.0, 0.0])  # A (the row's first) wins as shown and, swapped, as B
    assert (content["rewrite_below_source_rate"], content["rewrite_over_error"]) == (1.0, 1.0)
    unread = figures([0.0, -5.0, float("nan"), 0.0])  # the swapped order's verdict not read
    assert (unread["rewrite_below_source_rate"], unread["rewrite_over_error"]) == (1.0, 0.5)
    assert figures([2.0, 1.0], "judge")["rewrite_below_source_rate"] == 1.0  # two scores: the row right / wrong


def test_the_suite_through_judgetrain_eval_matches_its_per_row_file(tmp_path, tiny_judge):
    from judgetrain.cli import main

    path, rows = split_rewrites(tmp_path)
    out = tmp_path / "eval"
    assert main(["eval", "--model", "tiny-judge", "--eval_suites", "rewrites", "--eval_rewrites_source", str(path),
                 "--eval_scoring", "judge", "--output_dir", str(out)]) == 0
    (results_path,) = out.glob("*/results.json")
    results = json.loads(results_path.read_text())
    per_row = read_jsonl(results_path.parent / "rewrites.jsonl")
    assert len(per_row) == len(rows) == 6
    below = [r["scores"][0] > r["scores"][1] for r in per_row if r["category"] == "source_vs_rewrite"]
    over = [r["scores"][0] > r["scores"][1] for r in per_row if r["category"] == "rewrite_vs_error"]
    gap = [r["scores"][1] - r["scores"][0] for r in per_row if r["category"] == "source_vs_rewrite"]
    metrics = results["metrics"]
    assert metrics["eval/rewrites/rewrite_below_source_rate"] == pytest.approx(sum(below) / 3)
    assert metrics["eval/rewrites/rewrite_over_error"] == pytest.approx(sum(over) / 3)
    assert metrics["eval/rewrites/rewrite_gap"] == pytest.approx(sum(gap) / 3)
    interval = results["intervals"]["rewrites"]["judge"]["rewrite_over_error"]
    assert interval["n"] == 3 and interval["ci_low"] <= interval["value"] <= interval["ci_high"]
    assert all(math.isfinite(r["scores"][0]) for r in per_row)
