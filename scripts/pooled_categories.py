"""One figure of a pairwise suite pooled over some of its categories, trained against base, with the intervals and the
paired test `judgetrain compare` gives each category alone (`judgetrain.eval.stats.paired_difference`, resampled by
source sample where the rows name one).

    python scripts/pooled_categories.py loops/smollm2-pointwise/round-0/eval loops/smollm2-pointwise/round-1/eval \
        --suite pairwise --mode implicit --categories numerical_perturbation equipment_substitution action_antonym

Used for the loop's held-out samples of the trained types (docs/results.md): the held-out pairs carry each copy's
type as ``category``, and the trained types are the ones not held out whole.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from judgetrain.eval.compare import evaluation_folder, read_records, row_files, suite_items
from judgetrain.eval.stats import paired_difference


def pooled(folder, suite: str, mode: str, categories: list[str], figure: str):
    files = row_files(evaluation_folder(folder))
    if (suite, mode) not in files:
        raise SystemExit(f"{folder}: no per-row file of {suite} in {mode} mode (it holds {sorted(files)})")
    records = [r for r in read_records(files[(suite, mode)]) if r.get("category") in categories]
    if not records:
        raise SystemExit(f"{folder}: no {suite} row of the categories {categories}")
    items, why = suite_items(suite, mode, records)
    if items is None:
        raise SystemExit(f"{folder}: {why}")
    items.values = {figure: np.asarray(items.values[figure], dtype=np.float64)}
    return items


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="the base's evaluation folder")
    p.add_argument("trained", help="the trained judge's evaluation folder")
    p.add_argument("--suite", default="pairwise")
    p.add_argument("--mode", default="implicit")
    p.add_argument("--figure", default="accuracy")
    p.add_argument("--categories", nargs="+", required=True)
    args = p.parse_args(argv)
    base = pooled(args.base, args.suite, args.mode, args.categories, args.figure)
    trained = pooled(args.trained, args.suite, args.mode, args.categories, args.figure)
    print(json.dumps(paired_difference(trained, base)[args.figure], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
