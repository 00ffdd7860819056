"""What the rules that need no judge score on a loop's held-out files: each held-out pair category's accuracy (the
pairwise suite's own rule, resampled by source sample) and the rewrites suite's figures, for the shorter / longer /
first-shown rules and the novel-token rule fitted on the loop's round-1 training pairs (chosen = source, rejected =
error copy), each with its 95% interval.

    python scripts/loop_rules.py loops/smollm2-pointwise

The loop's items, split and pairs stages are enough (no model, no training): a judge's figure on these rows means
something only where it beats every rule here (docs/results.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from judgetrain.data.pairwise import load_pairwise
from judgetrain.eval.benchmarks import get_suite
from judgetrain.eval.benchmarks.base import text_of
from judgetrain.eval.rules import NovelTokens, rule_mode, rule_records, rules_for
from judgetrain.eval.stats import Items, items_intervals


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("loop_dir", help="a loop's output_dir after its items, split and pairs stages")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    out = Path(args.loop_dir)
    novel = fit_on_training_pairs(out / "round-1" / "pairs" / "train.parquet")
    figures = {"pairwise": suite_figures("pairwise", out / "heldout" / "pairwise.jsonl", novel, "accuracy"),
               "rewrites": suite_figures("rewrites", out / "heldout" / "rewrites.jsonl", novel, None)}
    for suite, by_rule in figures.items():
        print(f"\n{suite}")
        for rule, cells in by_rule.items():
            print(f"  {rule:12s} " + "  ".join(f"{name} {c['value']:.3f} [{c['ci_low']:.3f}, {c['ci_high']:.3f}] "
                                                 f"(n {c['n']})" for name, c in cells.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def fit_on_training_pairs(path: Path) -> NovelTokens:
    """The novel-token rule fitted on the training pairs alone: the chosen texts are sources, the rejected error
    copies."""
    frame = pd.read_parquet(path, columns=["chosen", "rejected"])
    read = (lambda cell: text_of(json.loads(cell)) if isinstance(cell, str) and cell.startswith("[") else text_of(cell))
    return NovelTokens.fit(map(read, frame["chosen"]), map(read, frame["rejected"]))


def suite_figures(name: str, path: Path, novel: NovelTokens, figure: str | None) -> dict[str, dict]:
    """{rule: {figure or category: {value, ci_low, ci_high, n}}}: ``figure`` per row category, or (None) the suite's
    own figures over all its rows."""
    suite = get_suite(name)
    rows = [dict(r) for r in load_pairwise(str(path))]
    out: dict[str, dict] = {}
    for rule in rules_for(suite, novel):
        items, why = suite.items(rule_records(suite, rows, rule, novel), rule_mode(rule))
        if items is None:
            raise SystemExit(f"{path}: {why}")
        if figure is None:
            out[rule] = {k: v for k, v in items_intervals(items).items() if k in suite.headline}
            continue
        categories = np.asarray([r.get("category") for r in rows], dtype=object)
        split = {str(c): np.where(categories == c, items.values[figure], np.nan) for c in sorted(set(categories))}
        split["all"] = np.asarray(items.values[figure], dtype=np.float64)
        out[rule] = items_intervals(Items(items.keys, split, clusters=items.clusters))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
