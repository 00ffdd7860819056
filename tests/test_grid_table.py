"""scripts/grid_table.py, the grid's side-by-side table: each config's goals read from its loop folder under the one
reading base and trained judge share, met or not by the stated bounds (held-out type >= 0.70 with the differences
against the base and the best rule above 0; rewrites <= 0.60 below their source and >= 0.80 above an error copy; the
benchmarks not below the base beyond 0.05; the command within 75 minutes), and an unfinished folder said so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO


def _row(k: int, figure: str, value: float, mode: str, delta=None, over=None) -> dict:
    reading = "log_ratio" if (mode == "implicit" and k) else ("loglik_sum" if mode == "implicit" else mode)
    return {"round": k, "figure": figure, "value": value, "ci_low": value - 0.05, "ci_high": value + 0.05,
            "delta": delta, "delta_ci_low": None if delta is None else delta - 0.04,
            "delta_ci_high": None if delta is None else delta + 0.04, "p_value": None, "n": 36, "mode": mode,
            "reading": reading, "best_rule": None if over is None else "longer", "over_rule": over,
            "over_rule_ci_low": None if over is None else over - 0.04,
            "over_rule_ci_high": None if over is None else over + 0.04, "learned": bool(over and over > 0.04)}


def make_config(root: Path, name: str, form: str, held: dict, minutes: float, finished: bool = True) -> Path:
    """A one-round loop folder: its state (settings, trained form, stages with their wall time), its round table under
    loglik_mean and implicit, and round 1's results.json with the shorter rule's figures."""
    loop = root / name
    (loop / "round-1" / "eval" / "m").mkdir(parents=True)
    done = {"0/eval": {"wall_s": 60.0 * minutes / 2}, **({"1/eval": {"wall_s": 60.0 * minutes / 2}} if finished else {})}
    (loop / "loop_state.json").write_text(json.dumps({
        "trained_form": form, "done": done,
        "settings": {"output_dir": f"loops/{name}", "heldout": {"types": ["unit_swap", "quantity_error"]}}}))
    rows = []
    for mode in ("implicit", "loglik_sum", "loglik_mean"):
        for figure, base, trained in (("pairwise/accuracy", 0.74, 0.8),
                                      ("pairwise/unit_swap/accuracy", 0.667, held["unit_swap"]),
                                      ("pairwise/quantity_error/accuracy", 0.55, held["quantity_error"]),
                                      ("rewrites/rewrite_below_source_rate", 0.32, 0.45),
                                      ("rewrites/rewrite_over_error", 0.87, 0.85),
                                      ("evalbiasbench/pair_acc", 0.66, 0.60), ("rmbench/total_avg_acc", 0.49, 0.50)):
            named = figure if mode == "implicit" else figure.replace("/", f"/{mode}/", 1)  # after the first mode
            rows.append(_row(0, named, base, mode))
            if finished:
                rows.append(_row(1, named, trained, mode, delta=trained - base, over=trained - 0.5))
    (loop / "rounds.json").write_text(json.dumps({"keys": {}, "rows": rows}))
    (loop / "round-1" / "eval" / "m" / "results.json").write_text(json.dumps({"rules": {
        "evalbiasbench": {"figures": {"shorter": {"metrics": {"pair_acc": 0.7375}}}},
        "rmbench": {"figures": {"shorter": {"metrics": {"total_avg_acc": 0.552}}}}}}))
    return loop


def test_the_grid_table_reads_each_goal_under_one_reading_and_says_met_or_not(tmp_path):
    a = make_config(tmp_path, "grid-a", "log_ratio", {"unit_swap": 0.69, "quantity_error": 0.56}, 80)
    c = make_config(tmp_path, "grid-c", "mean_logprob", {"unit_swap": 0.80, "quantity_error": 0.74}, 70)
    d = make_config(tmp_path, "grid-d", "mean_logprob", {"unit_swap": 0.8, "quantity_error": 0.8}, 20, finished=False)
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "grid_table.py"), str(a), str(c), str(d)],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout.splitlines()
    assert out[0] == "| goal | grid-a | grid-c | grid-d |"
    assert out[2] == "| read under | loglik_sum | loglik_mean | - |"  # a log-ratio judge: its own summed likelihood
    unit = next(line for line in out if line.startswith("| held-out type unit_swap"))
    cells = unit.split(" | ")[1:]
    assert cells[0].startswith("0.690 [0.640, 0.740]; base 0.667, difference 0.023 [-0.017, 0.063]")
    assert cells[0].endswith("not met") and cells[1].endswith("**met**") and cells[2].strip(" |") == "-"
    quantity = next(line for line in out if line.startswith("| held-out type quantity_error")).split(" | ")[1:]
    assert quantity[1].endswith("**met**")  # 0.74 >= 0.70, difference 0.19 [0.15, 0.23], over the rule 0.24
    below = next(line for line in out if line.startswith("| held-out rewrites below")).split(" | ")[1:]
    assert below[0] == "0.450 [0.400, 0.500]; base 0.320 **met**"
    ebb = next(line for line in out if line.startswith("| EvalBiasBench")).split(" | ")[1:]
    assert ebb[0].endswith("difference -0.060 [-0.100, -0.020]; shorter rule 0.738 not met")  # beyond -0.05
    rmb = next(line for line in out if line.startswith("| RM-Bench")).split(" | ")[1:]
    assert rmb[0].endswith("shorter rule 0.552 **met**")
    assert out[-1] == "| wall time of the command (<= 75 min) | 80 min not met | 70 min **met** | 10 min so far, not finished |"
