"""`judgetrain data check`: validate a dataset source and print its statistics (judgetrain.data.check)."""

# Late imports: rich, judgetrain.models, judgetrain.checks (inside the functions that use them): each command loads only what it runs, so
# `judgetrain --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

from pathlib import Path

import numpy as np

from judgetrain.cli.args import ConventionParser, console
from judgetrain.data.check import DATASETS, PERCENTILES, load_split, splits_of, summarise, token_lengths
from judgetrain.data.check import __doc__ as _LIBRARY_DOC
from judgetrain.data.validate import DataValidationError
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging


def build_parser() -> ConventionParser:
    p = ConventionParser(prog="judgetrain data check", description=_LIBRARY_DOC)
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--source", required=True, help='hub id, parquet/jsonl/json file, directory, or "bundled"')
    p.add_argument("--split", action="append", help="split to check (repeatable; default: every split present)")
    p.add_argument("--tokenizer", help="tokenizer path, hub id or model alias (tiny-judge) for token-length percentiles")
    p.add_argument("--on_bad_row", choices=("error", "skip"), default="error",
                   help="bad rows: stop naming them (default), or skip them to the rejects file, counted")
    p.add_argument("--rejects_path", "--rejects", help="rejects jsonl path for --on_bad_row skip")
    p.add_argument("--mode", choices=("implicit", "pairwise"), default="implicit", help="ideation mode")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    setup_logging()

    try:
        args.splits_of = splits_of(args.dataset, args.source, args.split)
        loaded = {s: load_split(args.dataset, args.source, s, args) for s in args.splits_of}
        empty = [s for s, ds in loaded.items() if not len(ds)]
        if len(empty) == len(loaded):
            raise ValueError(f"{args.source}: no rows in {', '.join(empty)}; is this the {args.dataset} source?")
        tokenizer = None
        if args.tokenizer:  # a path, a hub id or a model alias (tiny-judge), loaded as training loads it
            tokenizer = _tokenizer(args.tokenizer)
    except DataValidationError as exc:
        raise BadInputError(f"bad data\n{exc}") from exc
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise BadInputError(str(exc)) from exc

    from rich.table import Table

    out = console()
    counts = Table(title=f"{args.dataset}: {args.source}")
    for col in ("split", "column", "value", "rows"):
        counts.add_column(col, justify="right" if col == "rows" else "left")
    for split, ds in loaded.items():
        counts.add_row(split, "(all)", "", str(len(ds)))
        for col, counter in summarise(args.dataset, ds).items():
            for value, n in sorted(counter.items()):
                counts.add_row(split, col, str(value), str(n))
    out.print(counts)
    if tokenizer is not None:
        lengths = Table(title=f"token lengths ({args.tokenizer}, chat template applied)")
        for col in ("split", "sequence", *[f"p{q}" if q < 100 else "max" for q in PERCENTILES]):
            lengths.add_column(col)
        for split, ds in loaded.items():
            if not len(ds):
                continue
            for name, arr in token_lengths(args.dataset, ds, tokenizer).items():
                lengths.add_row(split, name, *[str(int(np.percentile(arr, q))) for q in PERCENTILES])
        out.print(lengths)
    return 0



def _tokenizer(name: str):
    """The tokenizer of a folder, hub id or alias, as training loads it; OSError (one line, the fix) where there is
    none to load."""
    from judgetrain.checks.preflight import model_problem
    from judgetrain.models.aliases import resolve_model
    from judgetrain.models.loading import load_tokenizer

    problem = None if Path(name).is_dir() else model_problem(name, "--tokenizer")
    if problem:
        raise OSError(problem)
    try:
        return load_tokenizer(resolve_model(name))
    except (OSError, ValueError) as exc:
        raise OSError(f"--tokenizer {name}: no tokenizer there ({str(exc).splitlines()[0]}); give a model folder, a "
                      "hub id or an alias (tiny-judge)") from None
