"""The evidence metrics of judgetrain/eval/metrics.py: JudgeBench's and EvalBiasBench's figures by their authors'
rules, the bootstrap intervals, paired deltas, exact McNemar and RM-Bench's style spread, on worked examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from judgetrain.metrics import (Items, bootstrap_ci, evalbiasbench_results, interval_keys, items_intervals,
                                judgebench_results, mcnemar_p, paired_difference, predictions_from_scores, sign_test_p, smallest_p,
                                rmbench_intervals, rmbench_items, rmbench_results, sign_flip_p, style_spread,
                                swap_verdict, verdict_from_scores)


# ------------------------------------------------------------------------------------------------ JudgeBench
def test_judgebench_results_on_worked_rows():
    """Each verdict read back to the row's order (the second was shown swapped), +1 / -1 / 0 against the label:

    row  label  verdicts (as shown)   read back        sum  correct  inconsistent   source (category)
    1    A>B    A>B, B>A              A>B, A>B         +2   yes      no             mmlu-pro-law (knowledge)
    2    A>B    A>B, A>B              A>B, B>A          0   no       yes            mmlu-pro-math (knowledge)
    3    B>A    B>A, A=B              B>A, A=B         +1   yes      yes            livebench-math (math)
    4    B>A    None, A>B             None, B>A        +1   yes      yes            livebench-reasoning
    5    A>B    B>A (one shown)       B>A              -1   no       -              livecodebench (coding)
    6    A>B    scores 2.0, 2.0       A=B               0   no       -              livecodebench (coding)
    7    B>A    scores 0.1, 0.9       B>A              +1   yes      -              livebench-math (math)

    accuracy 4/7; knowledge 1/2, math 2/2, reasoning 1/1, coding 0/2; inconsistent 3 of the 4 rows shown twice."""
    rows = [
        {"label": "A>B", "source": "mmlu-pro-law", "verdicts": ["A>B", "B>A"]},
        {"label": "A>B", "source": "mmlu-pro-math", "verdicts": ["A>B", "A>B"]},
        {"label": "B>A", "source": "livebench-math", "verdicts": ["B>A", "A=B"]},
        {"label": "B>A", "source": "livebench-reasoning", "verdicts": [None, "A>B"]},
        {"label": "A>B", "source": "livecodebench", "verdicts": ["B>A"]},
        {"label": "A>B", "source": "livecodebench", "scores": [2.0, 2.0]},
        {"label": "B>A", "source": "livebench-math", "scores": [0.1, 0.9]},
    ]
    out = judgebench_results(rows)
    assert out["accuracy"] == pytest.approx(4 / 7)
    assert out["knowledge"] == {"accuracy": 0.5, "n": 2} and out["math"] == {"accuracy": 1.0, "n": 2}
    assert out["reasoning"] == {"accuracy": 1.0, "n": 1} and out["coding"] == {"accuracy": 0.0, "n": 2}
    assert out["inconsistent_rate"] == 0.75 and (out["n"], out["n_both_orders"]) == (7, 4)
    one_order = judgebench_results(rows[4:])
    assert math.isnan(one_order["inconsistent_rate"]) and one_order["accuracy"] == pytest.approx(1 / 3)
    own = judgebench_results([{"label": "A>B", "category": "tone", "verdicts": ["A>B", "B>A"]},
                              {"label": "B>A", "category": "tone", "verdicts": ["A>B", "A>B"]}])  # a team's own pairs
    assert own["tone"] == {"accuracy": 0.5, "n": 2} and own["inconsistent_rate"] == 0.5
    with pytest.raises(ValueError, match="'verdicts' must hold one or two"):
        judgebench_results([{"label": "A>B", "source": "livecodebench", "verdicts": []}])


def test_verdicts_read_back_and_from_scores():
    assert [swap_verdict(v) for v in ("A>B", "B>A", "A=B", None)] == ["B>A", "A>B", "A=B", None]
    assert [verdict_from_scores(a, b) for a, b in ((3, 1), (1, 3), (2, 2), (None, 1), (float("nan"), 1))] == \
        ["A>B", "B>A", "A=B", None, None]
    with pytest.raises(ValueError):
        swap_verdict("A>>B")


# -------------------------------------------------------------------------------------------- EvalBiasBench
def test_evalbiasbench_results_on_worked_rows():
    """A pick as stored is right when it equals the label; swapped, when pick + label == 3. Agreement: the two picks
    name the same response (pick + pick == 3) or are both ties (3, 3).

    row  bias  label  picks     right        single  pair  agree
    1    X     1      1, 2      yes, yes     2/2     1     yes
    2    X     1      1, 1      yes, no      1/2     0     no    (always the first shown: position bias)
    3    X     1      3, 3      no, no       0/2     0     yes   (tie twice)
    4    Y     2      2, 1      yes, yes     2/2     1     yes
    5    Y     2      None, 1   no, yes      1/2     0     no
    6    Y     1      1, 2      yes, yes     2/2     1     yes

    X: single 3/6, pair 1/3, agreement 2/3; Y: single 5/6, pair 2/3, agreement 2/3;
    all: single 8/12, pair 3/6, agreement 4/6."""
    rows = [{"bias": "X", "label": 1, "predictions": [1, 2]}, {"bias": "X", "label": 1, "predictions": [1, 1]},
            {"bias": "X", "label": 1, "predictions": [3, 3]}, {"bias": "Y", "label": 2, "predictions": [2, 1]},
            {"bias": "Y", "label": 2, "predictions": [None, 1]}, {"bias": "Y", "label": 1, "predictions": [1, 2]}]
    out = evalbiasbench_results(rows)
    assert out["X"] == pytest.approx({"single_acc": 0.5, "pair_acc": 1 / 3, "agreement": 2 / 3, "n": 3})
    assert out["Y"] == pytest.approx({"single_acc": 5 / 6, "pair_acc": 2 / 3, "agreement": 2 / 3, "n": 3})
    assert (out["single_acc"], out["pair_acc"], out["agreement"]) == pytest.approx((8 / 12, 0.5, 4 / 6))
    assert out["biases"] == ["X", "Y"] and out["n"] == 6
    with pytest.raises(ValueError, match="two picks"):
        evalbiasbench_results([{"bias": "X", "label": 1, "predictions": [1]}])


def test_a_score_based_judge_picks_the_same_response_in_both_presentations():
    assert predictions_from_scores(0.9, 0.2) == [1, 2] and predictions_from_scores(0.2, 0.9) == [2, 1]
    assert predictions_from_scores(1, 1) == [3, 3] and predictions_from_scores(None, 1) == [None, None]
    out = evalbiasbench_results([{"bias": "X", "label": 1, "predictions": predictions_from_scores(0.9, 0.2)}])
    assert (out["single_acc"], out["pair_acc"], out["agreement"]) == (1.0, 1.0, 1.0)


# ----------------------------------------------------------------------------------------------- bootstrap
def test_bootstrap_of_an_accuracy_matches_the_normal_approximation_at_large_n():
    """n = 20,000 items, 6,000 right: p = 0.3, the normal interval p +/- 1.96 sqrt(p (1 - p) / n) = 0.3 +/- 0.00635.
    The percentile bootstrap (1,000 resamples) lands within 0.001 of each end (its Monte Carlo error is ~0.0003)."""
    values = np.zeros(20_000)
    values[:6000] = 1
    out = bootstrap_ci(values, seed=0)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 20_000)
    assert out["value"] == pytest.approx(0.3) and out["n"] == 20_000
    assert out["ci_low"] == pytest.approx(0.3 - half, abs=0.001)
    assert out["ci_high"] == pytest.approx(0.3 + half, abs=0.001)
    assert bootstrap_ci(values, seed=0) == out  # seeded
    assert bootstrap_ci(values, seed=1) != out


def test_the_same_items_in_any_order_give_the_same_intervals():
    rng = np.random.default_rng(0)
    values = rng.normal(size=500)
    perm = rng.permutation(500)
    assert bootstrap_ci(values[perm]) == bootstrap_ci(values)
    rows = _rmbench_rows(rng)
    shuffled = [rows[i] for i in rng.permutation(len(rows))]
    assert rmbench_intervals(shuffled) == rmbench_intervals(rows)
    trained = [dict(r, score_chosen=[s + 0.2 * rng.normal() for s in r["score_chosen"]]) for r in rows]
    base_shuffled = [rows[i] for i in rng.permutation(len(rows))]
    assert paired_difference(rmbench_items(trained), rmbench_items(base_shuffled)) == \
        paired_difference(rmbench_items(trained), rmbench_items(rows))


def test_a_cluster_is_drawn_whole():
    """400 clusters of two identical copies: resampled as clusters, the interval is that of 400 items; taken as 800
    independent items it would be sqrt(2) narrower (4,000 resamples: each width's Monte Carlo error is ~2%)."""
    rng = np.random.default_rng(1)
    per_cluster = rng.normal(size=400)
    values, clusters = np.repeat(per_cluster, 2), np.repeat(np.arange(400), 2)
    whole = bootstrap_ci(values, clusters=clusters, n_resamples=4000)
    apart = bootstrap_ci(values, n_resamples=4000)
    alone = bootstrap_ci(per_cluster, n_resamples=4000)
    width = lambda iv: iv["ci_high"] - iv["ci_low"]  # noqa: E731
    assert whole["value"] == pytest.approx(per_cluster.mean())
    assert width(whole) == pytest.approx(width(alone), rel=0.1)
    assert width(whole) / width(apart) == pytest.approx(math.sqrt(2), rel=0.1)


def test_strata_keep_their_size_and_groups_average_their_means():
    """Stratum s1 all 1 (10 items), s2 all 0 (30 items): the mean of the group means is 0.5 in every resample (each
    stratum keeps its size), so the interval is [0.5, 0.5]; pooled, the mean is 10/40 and the interval is wide."""
    values = np.r_[np.ones(10), np.zeros(30)]
    strata = ["s1"] * 10 + ["s2"] * 30
    iv = bootstrap_ci(values, groups=strata, strata=strata)
    assert (iv["value"], iv["ci_low"], iv["ci_high"]) == pytest.approx((0.5, 0.5, 0.5))
    pooled = bootstrap_ci(values)
    assert pooled["value"] == 0.25 and pooled["ci_high"] - pooled["ci_low"] > 0.2
    with pytest.raises(ValueError, match="different strata"):
        bootstrap_ci([1, 0], strata=["a", "b"], clusters=["c", "c"])


def test_nan_items_are_left_out_and_an_empty_set_is_nan():
    iv = bootstrap_ci([1.0, float("nan"), 0.0, 1.0])
    assert iv["value"] == pytest.approx(2 / 3) and iv["n"] == 3
    empty = bootstrap_ci([])
    assert math.isnan(empty["value"]) and math.isnan(empty["ci_low"]) and empty["n"] == 0


# ----------------------------------------------------------------------------------------- McNemar, paired
def test_mcnemar_on_a_worked_example():
    """9 items; 7 right only for the trained judge (b), 1 right only for the base (c), 1 right for both. Exact two-sided
    McNemar: 2 P(X <= 1), X ~ Binomial(8, 1/2) = 2 (C(8,0) + C(8,1)) / 2^8 = 2 x 9 / 256 = 0.0703125."""
    trained = [1, 1, 1, 1, 1, 1, 1, 0, 1]
    base = [0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert mcnemar_p(trained, base) == 0.0703125
    assert mcnemar_p(base, trained) == 0.0703125
    # b = c = 3: 2 P(X <= 3; 6, 1/2) = 2 x 42 / 64 > 1, capped at 1; nothing changed: 1
    assert mcnemar_p([1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]) == 1.0 and mcnemar_p([1, 0], [1, 0]) == 1.0
    # 20 gained, 0 lost: 2 / 2^20
    assert mcnemar_p([1] * 20, [0] * 20) == pytest.approx(2 / 2**20)


def test_the_sign_flip_test_estimates_mcnemar_on_right_wrong_items():
    """7 gained, 1 lost, 1 unchanged (the worked McNemar example): flipping the 8 discordant items' signs, |sum| >= 6
    in 2 x 9 of 256 patterns, exactly McNemar's 0.0703; 20,000 flips estimate it within 0.006 (3 standard errors).
    Differences of 0 on every item: p = 1."""
    trained = np.array([1, 1, 1, 1, 1, 1, 1, 0, 1], dtype=float)
    base = np.array([0, 0, 0, 0, 0, 0, 0, 1, 1], dtype=float)
    assert sign_flip_p(trained, base, n_flips=20_000)[0] == pytest.approx(0.0703125, abs=0.006)
    assert sign_flip_p(trained, trained)[0] == 1.0
    order = np.random.default_rng(0).permutation(9)
    assert sign_flip_p(trained[order], base[order])[0] == sign_flip_p(trained, base)[0]
    # clusters flip whole: two clusters of four gained items each can only reach |sum| 8 in 2 of 4 patterns
    clusters = [0, 0, 0, 0, 1, 1, 1, 1]
    p = sign_flip_p(np.ones(8), np.zeros(8), clusters=clusters, n_flips=20_000)[0]
    assert p == pytest.approx(0.5, abs=0.02)


def test_paired_difference_uses_the_same_resamples_for_both():
    """trained = base + 0.1 on every item: each resample draws the same items for both, so the difference is 0.1 in
    all of them and its interval is [0.1, 0.1], though each judge's own interval is wide."""
    rng = np.random.default_rng(2)
    base_values = rng.normal(size=300)
    keys = [f"k{i}" for i in range(300)]
    base = Items(keys, {"score": base_values})
    trained = Items(keys[::-1], {"score": (base_values + 0.1)[::-1]})  # any order: paired by key
    out = paired_difference(trained, base)["score"]
    assert (out["delta"], out["delta_ci_low"], out["delta_ci_high"]) == pytest.approx((0.1, 0.1, 0.1))
    assert out["trained_ci_high"] - out["trained_ci_low"] > 0.15
    assert out["p_method"] == "sign_flip" and out["p_value"] == 1 / 1001  # no flip reaches an all-positive sum
    assert out["trained"] - out["base"] == pytest.approx(out["delta"])


def test_paired_accuracy_delta_with_its_mcnemar_p_and_unpaired_items_counted():
    right_base = np.array([0, 0, 0, 0, 0, 0, 0, 1, 1, 1], dtype=float)
    right_trained = np.array([1, 1, 1, 1, 1, 1, 1, 0, 1, 1], dtype=float)
    base = Items(list(range(10)) + [99], {"accuracy": np.r_[right_base, 1.0]}, binary=("accuracy",))
    trained = Items(list(range(10)), {"accuracy": right_trained}, binary=("accuracy",))
    out = paired_difference(trained, base)["accuracy"]
    assert (out["trained"], out["base"], out["delta"]) == pytest.approx((0.9, 0.3, 0.6))
    assert out["p_value"] == mcnemar_p(right_trained, right_base) == 0.0703125 and out["p_method"] == "sign_test"
    assert out["delta_ci_low"] > 0 and (out["n"], out["n_only_base"], out["n_only_trained"]) == (10, 1, 0)
    assert out["n_units"] == 10  # no clusters: each item its own unit
    same = paired_difference(base, base)["accuracy"]
    assert (same["delta"], same["delta_ci_low"], same["delta_ci_high"], same["p_value"]) == (0, 0, 0, 1.0)


def _ten_pairs_in_both_orders():
    """Ten pairs, each judged in both orders (20 rows, the pair the cluster): the trained judge right on pairs 0-3 in
    both orders, wrong on the rest; the base judge always wrong."""
    clusters = [f"pair{i // 2}" for i in range(20)]
    trained = np.array([1.0 if i < 8 else 0.0 for i in range(20)])
    return trained, np.zeros(20), clusters


def test_the_paired_test_counts_pairs_not_orders():
    """The ten-pair case, by hand: 4 pairs gained (both orders each), 6 unchanged, none lost. One count per pair:
    2 P(X <= 0), X ~ Binomial(4, 1/2) = 2 / 2^4 = 0.125. Counting each order apart (McNemar over 20 rows: 8 gained)
    gives 2 / 2^8 = 0.0078125, 16 times the significance the data holds."""
    trained, base, clusters = _ten_pairs_in_both_orders()
    assert sign_test_p(trained, base, clusters=clusters)[0] == 0.125
    assert mcnemar_p(trained, base) == 0.0078125  # what the rows alone would claim
    keys = [(c, i % 2) for i, c in enumerate(clusters)]
    out = paired_difference(Items(keys, {"accuracy": trained}, clusters=np.asarray(clusters, dtype=object),
                                  binary=("accuracy",)),
                            Items(keys, {"accuracy": base}, clusters=np.asarray(clusters, dtype=object),
                                  binary=("accuracy",)))["accuracy"]
    assert (out["p_value"], out["p_method"], out["n"], out["n_units"]) == (0.125, "sign_test", 20, 10)
    assert out["delta"] == pytest.approx(0.4)
    # a pair right in one order only, lost in the other, is a pair that did not change: +1 - 1 = 0
    mixed = sign_test_p([1, 0, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0], clusters=["a", "a", "b", "b", "c", "c"])[0]
    assert mixed == 0.5  # 2 pairs gained (b, c), a unchanged: 2 / 2^2
    # without clusters the sign test is McNemar: the worked example above
    assert sign_test_p([1, 1, 1, 1, 1, 1, 1, 0, 1], [0, 0, 0, 0, 0, 0, 0, 1, 1])[0] == 0.0703125
    assert smallest_p(2) == 0.5 and smallest_p(5) == 0.0625 and smallest_p(0) == 1.0


def test_the_paired_test_holds_its_level_on_clustered_data_where_row_counting_does_not():
    """Calibration under the null, 4,000 seeds: 30 pairs in both orders, each pair's two orders sharing the pair's
    difficulty (the same right / wrong in both orders 90% of the time), the trained and the base judge drawn alike
    (a true difference of 0). The pair-level sign test rejects at p < 0.05 in at most 5% of the seeds (an exact test is
    conservative on a discrete scale); counting rows apart (McNemar over the 60 rows) rejects far more often. A
    permutation test that flips whole pairs (sign_flip_p with the clusters) agrees with the sign test's level."""
    rng = np.random.default_rng(12345)
    clusters = np.repeat(np.arange(30), 2)
    hits_units = hits_rows = hits_perm = 0
    n_seeds = 4000
    for seed in range(n_seeds):
        draws = []
        for _ in range(2):
            pair_right = rng.random(30) < 0.5
            flip = rng.random(60) < 0.1  # an order's own noise
            draws.append(np.where(flip, ~pair_right[clusters], pair_right[clusters]).astype(float))
        trained, base = draws
        hits_units += sign_test_p(trained, base, clusters=clusters)[0] < 0.05
        hits_rows += mcnemar_p(trained, base) < 0.05
        if seed < 400:  # the permutation test, slower: a tenth of the seeds
            hits_perm += sign_flip_p(trained, base, clusters=clusters, n_flips=400, seed=seed)[0] < 0.05
    assert hits_units / n_seeds <= 0.05, hits_units / n_seeds
    assert hits_rows / n_seeds > 0.075, hits_rows / n_seeds  # counting rows: the level is not held (0.0895)
    assert hits_perm / 400 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 400), hits_perm / 400


# ------------------------------------------------------------------------------------------------- RM-Bench
def _rmbench_rows(rng, per_domain=(("chat", 30), ("code", 40), ("safety-refuse", 20), ("safety-response", 15),
                                   ("math", 25), ("extra", 5))):
    return [{"id": f"{d}/{i}", "domain": d, "score_chosen": list(rng.normal(0.3, 1, 3)),
             "score_rejected": list(rng.normal(0, 1, 3))} for d, n in per_domain for i in range(n)]


def test_rmbench_intervals_agree_with_rmbench_results():
    """The per-prompt figures averaged within a domain, then over chat, math, code and safety (safety-refuse and
    safety-response pooled; a domain outside the four kept out) are rmbench_results' figures, to rounding."""
    rows = _rmbench_rows(np.random.default_rng(3))
    want, got = rmbench_results(rows), rmbench_intervals(rows)
    for key in ("hard_acc", "normal_acc", "easy_acc", "total_avg_acc"):
        assert got[key]["value"] == pytest.approx(want[key], abs=1e-12)
        assert got[key]["ci_low"] < got[key]["value"] < got[key]["ci_high"]
    for domain in ("chat", "math", "code", "safety", "extra"):
        for key in ("hard_acc", "normal_acc", "easy_acc", "avg_acc"):
            assert got[f"{domain}/{key}"]["value"] == pytest.approx(want[domain][key], abs=1e-12)
    assert got["safety/avg_acc"]["n"] == 35 and got["total_avg_acc"]["n"] == 130
    assert set(interval_keys({"hard_acc": got["hard_acc"]}, "eval/rmbench/")) == {
        "eval/rmbench/hard_acc", "eval/rmbench/hard_acc/ci_low", "eval/rmbench/hard_acc/ci_high"}


def test_rmbench_resamples_prompts_within_domains():
    """Every chat prompt right on every comparison, every code prompt wrong: each resample keeps 20 chat and 20 code
    prompts, so total_avg_acc is 0.5 in all of them."""
    rows = [{"id": f"chat/{i}", "domain": "chat", "score_chosen": [1, 1, 1], "score_rejected": [0, 0, 0]}
            for i in range(20)]
    rows += [{"id": f"code/{i}", "domain": "code", "score_chosen": [0, 0, 0], "score_rejected": [1, 1, 1]}
             for i in range(20)]
    iv = rmbench_intervals(rows)["total_avg_acc"]
    assert (iv["value"], iv["ci_low"], iv["ci_high"]) == pytest.approx((0.5, 0.5, 0.5), abs=1e-12)


def test_style_spread_on_a_worked_example():
    """chosen scores [1, 2, 4] move by 3 across styles, rejected [0, 0, 1] by 1: spread (3 + 1) / 2 = 2; a judge that
    style cannot move scores 0; a missing score is NaN (left out of the mean)."""
    spread = style_spread([[1, 2, 4], [5, 5, 5], [1, float("nan"), 2]], [[0, 0, 1], [2, 2, 2], [0, 0, 0]])
    assert spread[:2].tolist() == [2.0, 0.0] and math.isnan(spread[2])
    rows = [{"id": "chat/1", "domain": "chat", "score_chosen": [1, 2, 4], "score_rejected": [0, 0, 1]},
            {"id": "chat/2", "domain": "chat", "score_chosen": [5, 5, 5], "score_rejected": [2, 2, 2]},
            {"id": "chat/3", "domain": "chat", "score_chosen": [1, None, 2], "score_rejected": [0, 0, 0]}]
    assert rmbench_intervals(rows)["style_spread"]["value"] == 1.0


def test_items_intervals_give_every_metric_from_one_set_of_resamples():
    rng = np.random.default_rng(4)
    a = rng.normal(size=200)
    items = Items(list(range(200)), {"a": a, "twice_a": 2 * a})
    out = items_intervals(items)
    assert out["twice_a"]["ci_low"] == pytest.approx(2 * out["a"]["ci_low"])
    assert out["twice_a"]["ci_high"] == pytest.approx(2 * out["a"]["ci_high"])


def test_a_figure_of_one_unit_has_no_interval_and_the_table_says_why():
    """Two pairs of one source sample, one right and one wrong: 0.5 over 2 items in 1 unit. Every resample draws that
    sample and gives back 0.5, a zero-width [0.5, 0.5] it does not have: its bounds are NaN (`n_units` 1), not logged,
    and the logged table prints the value alone with the line saying why. Two samples get their interval."""
    from judgetrain.eval.evidence import ONE_UNIT, headline_table

    one = items_intervals(Items(["a", "b"], {"accuracy": np.asarray([1.0, 0.0])}, clusters=np.asarray(["s1", "s1"])))
    assert one["accuracy"]["value"] == 0.5 and (one["accuracy"]["n"], one["accuracy"]["n_units"]) == (2, 1)
    assert math.isnan(one["accuracy"]["ci_low"]) and math.isnan(one["accuracy"]["ci_high"])
    assert interval_keys(one, "eval/pairwise/") == {"eval/pairwise/accuracy": 0.5}
    two = items_intervals(Items(["a", "b"], {"accuracy": np.asarray([1.0, 0.0])}, clusters=np.asarray(["s1", "s2"])))
    assert (two["accuracy"]["ci_low"], two["accuracy"]["ci_high"], two["accuracy"]["n_units"]) == (0.0, 1.0, 2)
    assert math.isnan(bootstrap_ci([1.0, 0.0], clusters=["s1", "s1"])["ci_low"])
    summary = {"scoring": "judge", "scoring_modes": ["judge"], "metrics": interval_keys(one, "eval/pairwise/"),
               "intervals": {"pairwise": {"judge": one}}}
    text = headline_table(summary)
    row = next(line for line in text.splitlines() if line.startswith("pairwise/accuracy"))
    assert row.split() == ["pairwise/accuracy", "(judge:", "expected_score)", "0.500"]
    assert text.splitlines()[-1] == ONE_UNIT
