"""What a paired comparison may claim (`judgetrain.eval.compare.changes`), the rule of the run's guard, `judgetrain eval
--baseline`, `judgetrain compare`, the report and the card; and which way each figure is better
(`judgetrain.config.directions`), on figures set by hand."""

from __future__ import annotations

import numpy as np
import pytest

from judgetrain.config.directions import direction, greater_is_better, rank_score
from judgetrain.eval.compare import changes
from judgetrain.eval.stats import holm
from judgetrain.metrics import Items, paired_difference


def _figure(delta_low, delta_high, p, units):
    return {"delta_ci_low": delta_low, "delta_ci_high": delta_high, "p_value": p, "n_units": units}


def test_two_items_both_lost_are_too_few_to_tell_not_worse():
    """2 pairs, both lost: the percentile interval is [-1, -1], yet the exact sign test's smallest p on 2 units is
    2 / 2^2 = 0.5: no test on them can reach 0.05."""
    keys = ["p1", "p2"]
    fig = paired_difference(Items(keys, {"coding/accuracy": np.zeros(2)}, binary=("coding/accuracy",)),
                            Items(keys, {"coding/accuracy": np.ones(2)}, binary=("coding/accuracy",)))
    v = fig["coding/accuracy"]
    assert (v["delta_ci_low"], v["delta_ci_high"], v["p_value"], v["n_units"]) == (-1, -1, 0.5, 2)
    assert changes({"judgebench/coding/accuracy": v}) == {"judgebench/coding/accuracy": "n = 2: too few to tell"}
    # 5 units: smallest p 2 / 2^5 = 0.0625, still not under 0.05; 6 units: 0.03125, a test can reach it
    assert changes({"a/accuracy": _figure(-1, -1, 0.0625, 5)})["a/accuracy"] == "n = 5: too few to tell"
    assert changes({"a/accuracy": _figure(-1, -1, 0.03125, 6)})["a/accuracy"] == "worse"


def test_worse_needs_the_p_value_after_holm_and_the_interval_beyond_the_margin():
    """Three figures with p 0.01, 0.02, 0.04 (every interval below 0): Holm compares 0.01 with 0.05 / 3 = 0.0167
    (significant), 0.02 with 0.05 / 2 = 0.025 (significant), 0.04 with 0.05 / 1 (significant). With p 0.01, 0.03,
    0.04: 0.03 >= 0.025 stops there: only the first is worse, though each p alone is under 0.05."""
    figs = {"s/x/accuracy": _figure(-0.3, -0.1, 0.01, 50), "s/y/accuracy": _figure(-0.3, -0.1, 0.02, 50),
            "s/z/accuracy": _figure(-0.3, -0.1, 0.04, 50)}
    assert list(changes(figs).values()) == ["worse", "worse", "worse"]
    figs["s/y/accuracy"]["p_value"] = 0.03
    assert changes(figs) == {"s/x/accuracy": "worse", "s/y/accuracy": "", "s/z/accuracy": ""}
    # the margin: an interval [-0.3, -0.1] does not show a loss of at least 0.2; [-0.3, -0.25] does
    assert changes({"s/x/accuracy": _figure(-0.3, -0.1, 0.001, 50)}, margin=0.2) == {"s/x/accuracy": ""}
    assert changes({"s/x/accuracy": _figure(-0.3, -0.25, 0.001, 50)}, margin=0.2) == {"s/x/accuracy": "worse"}
    # an interval excluding 0 with p over the threshold (a bootstrap narrower than the test): not worse
    assert changes({"s/x/accuracy": _figure(-0.3, -0.1, 0.2, 50)}) == {"s/x/accuracy": ""}
    # a threshold of 0.001 asks more
    assert changes({"s/x/accuracy": _figure(-0.3, -0.1, 0.01, 50)}, alpha=0.001) == {"s/x/accuracy": ""}


def test_holm_steps_down_from_the_smallest_p_value():
    """Holm's correction alone (`judgetrain.eval.stats.holm`): 0.01 < 0.05 / 3, 0.02 < 0.05 / 2, 0.04 < 0.05 pass;
    with 0.03 in the middle the step stops at it, and a p-value at the threshold itself does not pass."""
    assert holm({"z": 0.04, "x": 0.01, "y": 0.02}, 0.05) == ["x", "y", "z"]
    assert holm({"z": 0.04, "x": 0.01, "y": 0.03}, 0.05) == ["x"]
    assert holm({"x": 0.05}, 0.05) == [] and holm({}, 0.05) == []


def test_style_spread_up_is_worse_and_down_is_better():
    """style_spread is lower-is-better: +1.47 with its interval above 0 is worse, -1.47 better; accuracy the other
    way round. Interval bounds and counts have no direction and are never judged."""
    up, down = _figure(1.2, 1.7, 0.001, 100), _figure(-1.7, -1.2, 0.001, 100)
    assert changes({"rmbench/style_spread": up}) == {"rmbench/style_spread": "worse"}
    assert changes({"rmbench/style_spread": down}) == {"rmbench/style_spread": "better"}
    assert changes({"rmbench/hard_acc": up}) == {"rmbench/hard_acc": "better"}
    assert changes({"rmbench/hard_acc/ci_low": up, "rmbench/n_rows": up}) == {}


def test_one_direction_table():
    assert [direction(k) for k in ("eval/rmbench/style_spread", "eval/judgebias/represent/anchor_mae",
                                   "eval/judgebench/inconsistent_rate", "eval/rmbench/delta/style_spread",
                                   "eval/judgebench/coding/accuracy", "eval/rmbench/style_gap",
                                   "eval/ideation/generate/first_position_rate")] == [
        "lower", "lower", "lower", "lower", "higher", "closer to 0", "closer to 0.5"]
    for not_ranked in ("eval/rmbench/hard_acc/ci_low", "eval/rmbench/hard_acc/ci_high",
                       "eval/rmbench/delta/hard_acc/delta_ci_low", "eval/rmbench/delta/hard_acc/p_value",
                       "eval/rmbench/delta/hard_acc/n_units", "eval/rmbench/n_rows", "eval/judgebench/n",
                       "eval/judgebias/generate/parse_fail/unparseable", "eval/rmbench/runtime"):
        assert direction(not_ranked) is None, not_ranked
    assert greater_is_better("eval_rmbench/total_avg_acc") and not greater_is_better("eval_rmbench/style_spread")
    with pytest.raises(ValueError, match="closer to 0"):
        greater_is_better("eval/rmbench/style_gap")
    assert rank_score("eval/rmbench/style_spread", 0.5) > rank_score("eval/rmbench/style_spread", 1.97)
