"""`judgetrain data check`: validate a dataset source and print its statistics (judgetrain.data.check)."""

# Late imports: rich, judgetrain.models (inside the functions that use them): each command loads only what it runs, so
# `judgetrain --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import argparse
import sys

import numpy as np

from judgetrain.data.check import DATASETS, PERCENTILES, load_split, splits_of, summarise, token_lengths
from judgetrain.data.check import __doc__ as _LIBRARY_DOC
from judgetrain.data.validate import DataValidationError
from judgetrain.run.state import EXIT_BAD_INPUT
from judgetrain.utils.logging import setup_logging


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="judgetrain data check", description=_LIBRARY_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--source", required=True, help='hub id, parquet/jsonl/json file, directory, or "bundled"')
    p.add_argument("--split", action="append", help="split to check (repeatable; default: every split present)")
    p.add_argument("--tokenizer", help="tokenizer path, hub id or model alias (tiny-judge) for token-length percentiles")
    p.add_argument("--on-bad-row", choices=("error", "skip"), default="error")
    p.add_argument("--rejects", help="rejects jsonl path for --on-bad-row skip")
    p.add_argument("--mode", choices=("implicit", "pairwise"), default="implicit", help="ideation mode")
    args = p.parse_args(argv)
    setup_logging()

    try:
        args.splits_of = splits_of(args.dataset, args.source, args.split)
        loaded = {s: load_split(args.dataset, args.source, s, args) for s in args.splits_of}
    except DataValidationError as exc:
        print(f"judgetrain data check: bad data\n{exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as exc:
        print(f"judgetrain data check: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    tokenizer = None
    if args.tokenizer:  # a path, a hub id or a model alias (tiny-judge), loaded as training loads it
        from judgetrain.models.aliases import resolve_model
        from judgetrain.models.loading import load_tokenizer

        tokenizer = load_tokenizer(resolve_model(args.tokenizer))

    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120)
    counts = Table(title=f"{args.dataset}: {args.source}")
    for col in ("split", "column", "value", "rows"):
        counts.add_column(col, justify="right" if col == "rows" else "left")
    for split, ds in loaded.items():
        counts.add_row(split, "(all)", "", str(len(ds)))
        for col, counter in summarise(args.dataset, ds).items():
            for value, n in sorted(counter.items()):
                counts.add_row(split, col, str(value), str(n))
    console.print(counts)
    if tokenizer is not None:
        lengths = Table(title=f"token lengths ({args.tokenizer}, chat template applied)")
        for col in ("split", "sequence", *[f"p{q}" if q < 100 else "max" for q in PERCENTILES]):
            lengths.add_column(col)
        for split, ds in loaded.items():
            if not len(ds):
                continue
            for name, arr in token_lengths(args.dataset, ds, tokenizer).items():
                lengths.add_row(split, name, *[str(int(np.percentile(arr, q))) for q in PERCENTILES])
        console.print(lengths)
    return 0

