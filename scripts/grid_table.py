"""The grid's side-by-side table (docs/results.md): each goal of the grid's configs (recipes/loops/grid_*.yaml),
read from each config's loop folder, per config its figure, interval, met or not, and the command's wall time.

    python scripts/grid_table.py loops/grid-a-log-ratio loops/grid-b-ties loops/grid-c-mean-ties loops/grid-d-replay

Every figure of a config is read under one reading, the base's and the trained judge's alike
(`judgetrain.report.rounds.shared_mode`: the reading the training form trains where the base has it, a log-ratio
judge's own summed likelihood otherwise), from its round table (``rounds.json``) and its last round's evaluation
(the rules' own figures). The goals, as each config states them before its run:

- held-out type of each domain: the source above its error copy on >= 0.70 of pairs, the difference against the base
  and against the best rule that needs no judge each with an interval above 0;
- held-out rewrites below their source on <= 0.60, above an error copy of their source on >= 0.80;
- EvalBiasBench ``pair_acc`` and RM-Bench ``total_avg_acc`` not below the base beyond the margin (non-inferiority:
  the difference's interval above -margin), each beside its shorter-wins rule;
- the whole command within 75 minutes (the stages' wall time in ``loop_state.json``, round 0 included).

A folder the loop has not finished is a column that says so. Writes the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from judgetrain.config.recipe import TRAINED_MODE, mode_label
from judgetrain.report.rounds import bare_figure, round_rows, shared_mode

SHARE, REWRITE_BELOW, REWRITE_OVER, MARGIN, MINUTES = 0.70, 0.60, 0.80, 0.05, 75.0


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _interval(row: dict[str, Any], low: str, high: str) -> str:
    return "" if row.get(low) is None else f" [{_fmt(row[low])}, {_fmt(row[high])}]"


def _above(v: float | None, bound: float) -> bool:
    """Whether an interval's bound ``v`` is recorded and above ``bound`` (a missing bound clears nothing)."""
    return v is not None and v > bound


def _against_base(r: dict[str, Any], base: dict[str, Any]) -> str:
    """A figure with its interval, the base's figure, and the difference with its interval."""
    return (f"{_fmt(r['value'])}{_interval(r, 'ci_low', 'ci_high')}; base {_fmt(base.get('value'))}, difference "
            f"{_fmt(r.get('delta'))}{_interval(r, 'delta_ci_low', 'delta_ci_high')}")


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" **met**" if ok else " not met")


def rule_value(loop: Path, k: int, suite: str, rule: str, metric: str) -> float | None:
    """Rule ``rule``'s figure ``metric`` on round ``k``'s rows of ``suite`` (the evaluation's ``rules``)."""
    results = next((loop / f"round-{k}" / "eval").glob("*/results.json"), None)
    if results is None:
        return None
    figures = ((json.loads(results.read_text()).get("rules") or {}).get(suite) or {}).get("figures") or {}
    return ((figures.get(rule) or {}).get("metrics") or {}).get(metric)


def column(loop: Path) -> dict[str, Any]:
    """One config's cells: {goal key: text}, with its name, reading and wall time."""
    state = json.loads((loop / "loop_state.json").read_text())
    settings, rows = state.get("settings") or {}, round_rows(loop)
    rounds = sorted({r["round"] for r in rows})
    name = Path(settings.get("output_dir") or loop).name
    wall = sum(v.get("wall_s") or 0.0 for v in (state.get("done") or {}).values()) / 60
    if len(rounds) < 2:
        return {"name": name, "reading": "-", "cells": {}, "wall": f"{wall:.0f} min so far, not finished"}
    last = rounds[-1]
    mode = shared_mode(rows, last, TRAINED_MODE.get(state.get("trained_form") or "log_ratio"))
    by = {bare_figure(r): r for r in rows if r["round"] == last and r.get("mode") == mode}
    base = {bare_figure(r): r for r in rows if r["round"] == 0 and r.get("mode") == mode}
    cells: dict[str, str] = {}
    for held in (settings.get("heldout") or {}).get("types") or []:
        r = by.get(f"pairwise/{held}/accuracy")
        if r is None:
            cells[f"held:{held}"] = "-"
            continue
        ok = r["value"] >= SHARE and _above(r.get("delta_ci_low"), 0.0) and _above(r.get("over_rule_ci_low"), 0.0)
        cells[f"held:{held}"] = (f"{_against_base(r, base.get(f'pairwise/{held}/accuracy', {}))}; over the best rule "
                                 f"({r.get('best_rule') or '-'}) {_fmt(r.get('over_rule'))}"
                                 f"{_interval(r, 'over_rule_ci_low', 'over_rule_ci_high')}{_mark(ok)}")
    for key, figure, ok in (("rewrite_below", "rewrites/rewrite_below_source_rate", lambda v: v <= REWRITE_BELOW),
                            ("rewrite_over", "rewrites/rewrite_over_error", lambda v: v >= REWRITE_OVER)):
        r = by.get(figure)
        cells[key] = "-" if r is None else (f"{_fmt(r['value'])}{_interval(r, 'ci_low', 'ci_high')}; base "
                                            f"{_fmt(base.get(figure, {}).get('value'))}{_mark(ok(r['value']))}")
    for key, suite, metric in (("ebb", "evalbiasbench", "pair_acc"), ("rmb", "rmbench", "total_avg_acc")):
        r = by.get(f"{suite}/{metric}")
        if r is None:
            cells[key] = "-"
            continue
        ok = None if r.get("delta_ci_low") is None else _above(r["delta_ci_low"], -MARGIN)
        cells[key] = (f"{_against_base(r, base.get(f'{suite}/{metric}', {}))}; shorter rule "
                      f"{_fmt(rule_value(loop, last, suite, 'shorter', metric))}{_mark(ok)}")
    finished = state.get("done", {}).get(f"{last}/eval") is not None
    return {"name": name, "reading": mode_label(mode) if mode else "-", "cells": cells,
            "wall": f"{wall:.0f} min{_mark(wall <= MINUTES) if finished else ', not finished'}"}


def table(loops: list[Path]) -> str:
    columns = [column(p) for p in loops]
    keys = list(dict.fromkeys(k for c in columns for k in c["cells"]))
    labels = {"rewrite_below": "held-out rewrites below their source (<= 0.60)",
              "rewrite_over": "held-out rewrite above an error copy of its source (>= 0.80)",
              "ebb": "EvalBiasBench pair_acc (not below the base beyond 0.05)",
              "rmb": "RM-Bench total_avg_acc (not below the base beyond 0.05)"}
    lines = ["| goal | " + " | ".join(c["name"] for c in columns) + " |", "|---|" + "---|" * len(columns),
             "| read under | " + " | ".join(c["reading"] for c in columns) + " |"]
    for key in keys:
        label = labels.get(key) or (f"held-out type {key.split(':', 1)[1]}: source above its error copy (>= 0.70, "
                                    "above the base and the best rule)")
        lines.append(f"| {label} | " + " | ".join(c["cells"].get(key, "-") for c in columns) + " |")
    lines.append("| wall time of the command (<= 75 min) | " + " | ".join(c["wall"] for c in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("loops", nargs="+", type=Path, help="the configs' loop folders (output_dir)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.loops if not (p / "loop_state.json").is_file()]
    if missing:
        print(f"not a loop folder (no loop_state.json): {', '.join(missing)}", file=sys.stderr)
        return 2
    print(table(args.loops))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
