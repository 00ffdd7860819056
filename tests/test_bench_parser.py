"""`judgetrain bench`'s parser part at small sizes: the families, the report's structure and the summary, not timings."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from judgetrain import bench
from judgetrain.cli import bench as bench_cli
from judgetrain.bench.parser import bench_parser, clean_evaluation, hostile_families, panel
from judgetrain.data.scoreparse import parse_overall_score_result, parse_scores

N = 3000


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_every_family_fills_its_size_and_reads_without_raising():
    families = hostile_families(N)
    assert len(families) >= 25
    for name, text in families.items():
        assert N - 1003 <= len(text) <= N, name  # at most one repeated unit (1,003 characters) short of N
        assert parse_overall_score_result(text).reason in {"ok", "unparseable", "out_of_range"}
        assert isinstance(parse_scores(text), dict)


def test_the_clean_evaluation_is_real_prose_ending_in_its_score_block():
    text = clean_evaluation(N)
    assert len(text) == N and text.rstrip().endswith("```")
    result = parse_overall_score_result(text)
    assert (result.reason, result.source) == ("ok", "json_fence") and len(result.scores) == 6


def test_a_built_panel_holds_new_samples_and_new_prompts():
    one, two = panel(), panel(2)
    assert len(two) == 2 * len(one)
    assert len({r["sample_id"] for r in two}) == 2 * len({r["sample_id"] for r in one})
    assert two[len(one)]["prompt"] != one[0]["prompt"] and two[len(one)]["evaluation"] == one[0]["evaluation"]


def test_the_parser_part_reports_the_slowest_family_and_both_ratios():
    part = bench_parser(argparse.Namespace(parser_chars=N, repeats=1, parser_panel_copies=2))
    assert set(part["family_cpu_s"]) == set(hostile_families(N))
    assert part["slowest_family"] in part["family_cpu_s"]
    assert part["slowest_cpu_s"] == max(part["family_cpu_s"].values())
    for key in ("clean_cpu_s", "slowest_cpu_s", "hostile_vs_clean_ratio", "slowest_growth_2x"):
        assert _positive(part[key]), key
    for name, evaluations in (("pairs_build", 2 * 408), ("pairs_build_bundled_panel", 408)):
        pb = part[name]
        assert pb["evaluations"] == evaluations and pb["hostile_evaluations"] == 4
        assert _positive(pb["hostile_vs_clean_ratio"]) and all(_positive(v) for v in pb["cpu_s"].values())
        assert pb["scored_rows"]["hostile"] <= pb["scored_rows"]["clean"]


def test_parser_part_refuses_a_size_too_small():
    with pytest.raises(bench.BenchError, match="--parser-chars"):
        bench_parser(argparse.Namespace(parser_chars=10, repeats=1, parser_panel_copies=1))


def test_bench_only_parser_writes_its_summary_figures_and_targets(tmp_path):
    out = tmp_path / "bench.json"
    assert bench_cli.main(["--quick", "--only", "parser", "--parser-chars", str(N), "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"parser", "summary"} and "train" not in report and "eval" not in report
    assert report["config"]["parser_chars"] == N and report["config"]["parser_panel_copies"] == 1
    assert report["parser"]["pairs_build_bundled_panel"] is None  # one copy: the bundled panel is the panel
    summary = report["summary"]
    for key in ("parser_hostile_vs_clean_ratio", "parser_pairs_build_hostile_ratio"):
        assert key in bench.SUMMARY_KEYS and key in bench.TARGETS
        assert _positive(summary[key]), key
    assert summary["parser_hostile_vs_clean_ratio"] == report["parser"]["hostile_vs_clean_ratio"]
