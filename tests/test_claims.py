"""What a comparison may claim of the held-out pairs and the position figures: the loop's held-out pairs resampled and
counted by source sample (several error copies of one text are not independent), the position figures judged by
their distance from 0.5 (a growing lean is worse, and the guard sees it), and a figure no unit measured absent from
the log, the tables and Holm's count."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from judgetrain.eval.compare import changes, paired_figures
from judgetrain.eval.stats import Items, paired_difference


def _figure(delta_low, delta_high, p, units, **more):
    return {"delta_ci_low": delta_low, "delta_ci_high": delta_high, "p_value": p, "n_units": units, **more}


def _lean(values: list[float]) -> Items:
    return Items([f"p{i}" for i in range(len(values))], {"first_position_prob": np.asarray(values)})


def test_a_lean_rising_from_a_half_to_0_95_is_worse_and_one_shrinking_towards_it_better():
    """40 pairs, the base without lean (0.5 each), the trained judge picking the first-shown response at 0.95: the
    sign-flip p is 1/1001 and the distance from 0.5 grows by 0.45 (interval [0.45, 0.45]): worse. Before, a figure
    best at 0.5 got no verdict whatever its p, so the guard could not see a lean growing."""
    paired = paired_figures(_lean([0.95] * 40), _lean([0.5] * 40))["first_position_prob"]
    assert paired["p_value"] < 0.002
    assert [paired[k] for k in ("distance_delta", "distance_delta_ci_low", "distance_delta_ci_high")] == \
        pytest.approx([0.45, 0.45, 0.45])
    name = "pairwise/verdict/first_position_prob"
    assert changes({name: paired}) == {name: "worse"}
    shrinking = paired_figures(_lean([0.55] * 40), _lean([0.9] * 40))["first_position_prob"]
    assert changes({name: shrinking})[name] == "better"
    # a lean that crosses 0.5 to the same distance on the other side: no change of distance, no verdict
    crossing = paired_figures(_lean([0.3] * 40), _lean([0.7] * 40))["first_position_prob"]
    assert changes({name: crossing})[name] == ""
    assert paired["distance_p_value"] < 0.002 and crossing["distance_p_value"] == 1.0
    # the same figures as logged keys, read back by the report's guard
    from judgetrain.eval.compare import delta_keys
    from judgetrain.report.headline import against_base

    logged = delta_keys("pairwise", "verdict", None, {"first_position_prob": paired})
    record = {**logged, "eval/pairwise/verdict/first_position_prob": 0.95}
    assert against_base({0: {"eval/pairwise/verdict/first_position_prob": 0.5}, 4: record})["worse"] == [name]


def test_an_accuracy_drop_at_p_0_03_stays_worse_beside_position_figures_without_a_verdict():
    """Alone, an accuracy drop at p 0.03 is worse (0.03 < 0.05). Two position figures that cannot be given a verdict
    (no interval of their distance from 0.5) are left out of Holm's count, so it stays worse; before, they counted
    (0.03 >= 0.05 / 3) though they could never be worse or better. Position figures that can be judged (their
    distance's own test and interval) count."""
    drop = _figure(-0.3, -0.1, 0.03, 50)
    assert changes({"s/accuracy": drop}) == {"s/accuracy": "worse"}
    leans = {"s/first_position_rate": _figure(-0.1, 0.2, 0.4, 50), "s/first_position_prob": _figure(-0.1, 0.2, 0.6, 50)}
    assert changes({"s/accuracy": drop, **leans}) == {"s/accuracy": "worse", "s/first_position_rate": "",
                                                      "s/first_position_prob": ""}
    judged = {k: {**v, "distance_delta_ci_low": -0.1, "distance_delta_ci_high": 0.1, "distance_p_value": 0.5}
              for k, v in leans.items()}
    assert changes({"s/accuracy": drop, **judged})["s/accuracy"] == ""  # 3 tests: 0.03 >= 0.05 / 3


def test_a_figure_no_unit_measured_is_absent_from_the_log_the_tables_and_holm():
    """Judge mode reads one verdict per pair from two scores: no position lean in probabilities, no pair judged in both
    orders. Before, first_position_prob and inconsistent_rate were logged as NaN, paired as NaN with p 1.0 over 0
    units, and the report listed them under "too few units to tell"."""
    from judgetrain.eval.benchmarks.judgebench import judgebench_items, judgebench_results
    from judgetrain.eval.logkeys import flatten_eval_metrics, interval_keys
    from judgetrain.eval.stats import items_intervals
    from judgetrain.report.headline import against_base

    rows = [{"id": f"p{i}", "label": "A>B", "category": "drug_swap", "scores": [2.0, 1.0 + (i % 2)]}
            for i in range(20)]
    logged = flatten_eval_metrics("pairwise", judgebench_results(rows))
    assert "eval/pairwise/accuracy" in logged and all(math.isfinite(v) for v in logged.values())
    assert not {"eval/pairwise/first_position_prob", "eval/pairwise/inconsistent_rate"} & set(logged)
    items = judgebench_items(rows)
    assert "first_position_prob/ci_low" not in "".join(interval_keys(items_intervals(items)))
    paired = paired_difference(items, items)
    assert "first_position_prob" not in paired and "inconsistent_rate" not in paired and "accuracy" in paired
    # a log written before, NaN over 0 units: left out of the verdicts and of "too few units to tell"
    assert changes({"pairwise/first_position_prob": _figure(math.nan, math.nan, 1.0, 0)}) == {}
    old = {"eval/pairwise/delta/first_position_prob": math.nan, "eval/pairwise/delta/first_position_prob/p_value": 1.0,
           "eval/pairwise/delta/first_position_prob/n_units": 0, "eval/pairwise/first_position_prob": math.nan}
    assert against_base({0: {"eval/pairwise/accuracy": 0.5}, 2: old})["too_few"] == []


def test_the_heldout_pairs_are_resampled_and_counted_by_source_sample(tmp_path):
    """67 held-out pairs from 40 samples (7 gave 4 pairs, 6 gave 2): the pairwise suite's unit is the sample, so the
    paired test counts 40 units, not 67. The held-out pairs carry their sample_id from the loop's writer through the
    suite's loader into its records."""
    from judgetrain.data.pairwise import load_pairwise
    from judgetrain.eval.benchmarks import get_suite
    from judgetrain.eval.requests import RowScore
    from judgetrain.perturb.known import write_heldout_pairs
    from judgetrain.perturb.source import Sample

    sizes = [4] * 7 + [2] * 6 + [1] * 27
    template = [{"role": "user", "content": "Judge the note.\n\n{{text}}"}]
    samples = [Sample(i, f"Give aspirin {100 + i} mg.", template, {}, "notes.jsonl", i) for i in range(40)]
    heldout = [{"sample_id": i, "perturbation_set": f"dose_{j}", "perturbation_category": "error",
                "perturbation_type": "dose", "prompt": samples[i].prompt(f"Give aspirin {100 + i + 1 + j} mg.")}
               for i, n in enumerate(sizes) for j in range(n)]
    assert write_heldout_pairs(heldout, samples, tmp_path / "pairwise.jsonl") == 67
    assert json.loads((tmp_path / "pairwise.jsonl").read_text().splitlines()[0])["sample_id"] == "0"
    rows = load_pairwise(str(tmp_path / "pairwise.jsonl"))
    suite = get_suite("pairwise")
    right, wrong = [-1.0, -3.0, -3.0, -1.0], [-3.0, -1.0, -1.0, -3.0]  # [[A>B]], [[B>A]] as shown, then swapped

    def records(scores):
        return [{**suite.row_fields(row, RowScore(scores(i)), "verdict"), "row_index": i} for i, row in enumerate(rows)]

    base, _ = suite.items(records(lambda i: wrong), "verdict")
    trained, _ = suite.items(records(lambda i: right), "verdict")
    assert len(trained.keys) == 67 and len(set(trained.clusters)) == 40
    paired = paired_difference(trained, base)["accuracy"]
    assert paired["n"] == 67 and paired["n_units"] == 40 and paired["p_value"] == 2 / 2**40


def test_a_verdict_never_rests_on_a_floats_last_bits():
    """The crossing case as one CPU's float path left it (AMD EPYC, AVX-512): distance_delta 3.3e-16 with interval
    [5.6e-17, 1.7e-16] and the raw difference's p of 0.001. Before, `changes` called that "worse" (the interval
    "excludes 0", the p it read was the raw difference's). Its distance's own test gives p = 1 and the interval lies
    inside the figure's resolution: no verdict. The same interval 1e-3 wide is a change."""
    name = "pairwise/verdict/first_position_prob"
    rounding = {"trained": 0.3, "base": 0.7, "delta_ci_low": -0.4, "delta_ci_high": -0.4, "p_value": 0.001,
                "n_units": 40, "distance_delta_ci_low": 5.6e-17, "distance_delta_ci_high": 1.7e-16}
    assert changes({name: rounding})[name] == ""  # no distance test: no verdict
    assert changes({name: {**rounding, "distance_p_value": 0.001}})[name] == ""  # inside the resolution
    real = {**rounding, "distance_p_value": 0.001, "distance_delta_ci_low": 1e-3, "distance_delta_ci_high": 2e-3}
    assert changes({name: real})[name] == "worse"
    # a raw difference inside its resolution is no change either (figures in nats: the scale is the figure's)
    drift = {"trained": -524.0, "base": -524.0, "delta_ci_low": 1e-13, "delta_ci_high": 3e-13, "p_value": 0.001,
             "n_units": 40}
    assert changes({"rmbench/total_avg_acc": drift})["rmbench/total_avg_acc"] == ""
