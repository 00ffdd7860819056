"""Which way each figure is better, defined once: the report's best evaluation and best values, `judgetrain compare`,
the regression guard, the model card and ``metric_for_best_model`` (``greater_is_better``) all read it here.

    direction("eval/rmbench/style_spread")            # "lower"
    direction("eval/judgebench/delta/coding/accuracy") # "higher": a difference goes the way of its figure
    direction("eval/rmbench/hard_acc/ci_low")          # None: an interval's bound is not a figure to rank

A figure is named by its last part (``eval/judgebias/represent/anchor_mae`` -> ``anchor_mae``). Interval bounds,
p-values and counts (``n``, ``n_*``, tokens, runtime, a parse failure's count) are never ranked: their direction is
None.
"""

from __future__ import annotations

# figures whose smaller value is better, by their last part (anything holding "loss" or "mae" too)
LOWER_IS_BETTER = ("style_spread", "inconsistent_rate", "rewrite_below_source_rate")
# figures best at a value: the RM-Bench style gap (easy - hard) and a rewrite's score gap to its source at 0, the
# share of first-shown picks at 0.5
CLOSER_TO = {"style_gap": 0.0, "rewrite_gap": 0.0, "first_position_rate": 0.5, "first_position_prob": 0.5}
# the parts a logged key ends with that are no figure: bounds, p-values, the units a test counted
NOT_FIGURES = ("ci_low", "ci_high", "delta_ci_low", "delta_ci_high", "distance_ci_low", "distance_ci_high", "p_value",
               "distance_p_value", "n_units")
COUNTS = ("n", "runtime", "tokens_generated", "mean_tokens", "epoch", "step")
COUNT_PREFIXES = ("n_", "num_", "long_")
COUNT_PARTS = ("parse_fail",)  # eval/<suite>/generate/parse_fail/<reason>: how many failed so


def direction(key: str) -> str | None:
    """"higher", "lower", "closer to 0", "closer to 0.5" (`CLOSER_TO`), or None for what is not ranked (interval
    bounds, p-values, counts)."""
    parts = str(key).split("/")
    last = parts[-1]
    if last in NOT_FIGURES or last in COUNTS or last.startswith(COUNT_PREFIXES) or last.endswith(("_per_second",
                                                                                                  "runtime")):
        return None
    if any(p in COUNT_PARTS for p in parts[:-1]):
        return None
    if last in CLOSER_TO:
        return f"closer to {CLOSER_TO[last]:g}"
    if last in LOWER_IS_BETTER or "loss" in last or "mae" in last:
        return "lower"
    return "higher"


def best_at(key: str) -> float | None:
    """The value a figure best at a value is best at (`CLOSER_TO`: 0.5 for the position figures), else None."""
    way = direction(key)
    return float(way.removeprefix("closer to ")) if way is not None and way.startswith("closer to ") else None


def greater_is_better(key: str) -> bool:
    """Whether a larger value of ``key`` is better, for a selection that can only take the highest or the lowest
    (``metric_for_best_model``); a figure best at a value or one not ranked is refused (ValueError)."""
    way = direction(key)
    if way not in ("higher", "lower"):
        raise ValueError(f"{key}: {'not a figure to rank' if way is None else f'best {way}'}: a best evaluation "
                         "cannot be chosen by its highest or lowest value")
    return way == "higher"


def rank_score(key: str, value: float) -> float:
    """The value made larger-is-better, to rank evaluations by ``key`` (None direction: ValueError)."""
    way = direction(key)
    if way is None:
        raise ValueError(f"{key}: not a figure to rank")
    if way.startswith("closer to "):
        return -abs(value - best_at(key))
    return -value if way == "lower" else value
