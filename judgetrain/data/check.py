"""`judgetrain data check`: validate a dataset source and print its statistics.

    judgetrain data check --dataset judgebias --source bundled --tokenizer path/to/model
    judgetrain data check --dataset rmbench --source RM-Bench/data
    judgetrain data check --dataset ideation --source data/ideation --split test --on-bad-row skip --rejects bad.jsonl

Prints row counts per split, category, perturbation type and domain, and (with --tokenizer) the token-length
distribution of prompt + chosen and prompt + rejected after the chat template. Exits 1 on bad data, naming the
file, split, row and field.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from judgetrain.data.chat import chat_ids, text_ids

from .io import resolve_local, split_files
from .validate import DataValidationError

logger = logging.getLogger(__name__)

DATASETS = ("judgebias", "ideation", "rmbench")
PERCENTILES = (50, 90, 95, 99, 100)


def _splits(dataset: str, source: str, asked: list[str] | None) -> list[str]:
    if dataset == "rmbench":
        return ["test"]
    if asked:
        return asked
    path = resolve_local(source, dataset)
    candidates = ["train", "validation"] if dataset == "judgebias" else ["train", "validation", "test"]
    if path is not None and path.is_file():
        return ["train"]
    if path is None:
        return candidates
    present = []
    for s in candidates:
        probe = "train" if (dataset == "ideation" and s == "validation") else s
        try:
            split_files(path, probe)
            present.append(s)
        except FileNotFoundError:
            pass
    return present or candidates[:1]


def _load(dataset: str, source: str, split: str, args):
    from . import load_ideation, load_judgebias, load_rmbench

    rejects = None
    if args.rejects:
        rejects = args.rejects if len(args._splits) == 1 else str(Path(args.rejects).with_suffix("")) + f"-{split}.jsonl"
    common = {"on_bad_row": args.on_bad_row, "rejects_path": rejects}
    if dataset == "judgebias":
        return load_judgebias(source, split, **common)
    if dataset == "ideation":
        return load_ideation(source, split, mode=args.mode, **common)
    return load_rmbench(source, **common)


def _texts(dataset: str, ds, tokenizer):
    """(prompt+chosen, prompt+rejected) conversations per row (RM-Bench: the three styles each)."""
    if dataset == "rmbench":
        for row in ds:
            user = [{"role": "user", "content": row["prompt"]}]
            for c, r in zip(row["chosen"], row["rejected"]):
                yield user + [{"role": "assistant", "content": c}], user + [{"role": "assistant", "content": r}]
    else:
        for row in ds:
            yield row["prompt"] + row["chosen"], row["prompt"] + row["rejected"]


def _n_tokens(tokenizer, messages) -> int:
    """Tokens of a conversation as training sees them (content as text; judgetrain.data.chat)."""
    if getattr(tokenizer, "chat_template", None):
        return len(chat_ids(tokenizer, messages))
    return len(text_ids(tokenizer, "\n".join(m["content"] for m in messages)))


def token_lengths(dataset: str, ds, tokenizer) -> dict[str, np.ndarray]:
    chosen, rejected = [], []
    for c, r in _texts(dataset, ds, tokenizer):
        chosen.append(_n_tokens(tokenizer, c))
        rejected.append(_n_tokens(tokenizer, r))
    return {"prompt+chosen": np.array(chosen), "prompt+rejected": np.array(rejected)}


def summarise(dataset: str, ds) -> dict[str, Counter]:
    cols = {"judgebias": ("perturbation_category", "perturbation_type"), "rmbench": ("domain",),
            "ideation": ("order",) if "order" in ds.column_names else ()}[dataset]
    out = {c: Counter(ds[c]) for c in cols}
    if dataset == "judgebias":
        from .judgebias import perturbation_set

        out["perturbation_set"] = Counter(perturbation_set(t, r) for t, r in zip(ds["perturbation_type"], ds["perturbation_rate"]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="judgetrain data check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--source", required=True, help='hub id, parquet/jsonl/json file, directory, or "bundled"')
    p.add_argument("--split", action="append", help="split to check (repeatable; default: every split present)")
    p.add_argument("--tokenizer", help="tokenizer path or name (AutoTokenizer) for token-length percentiles")
    p.add_argument("--on-bad-row", choices=("error", "skip"), default="error")
    p.add_argument("--rejects", help="rejects jsonl path for --on-bad-row skip")
    p.add_argument("--mode", choices=("implicit", "pairwise"), default="implicit", help="ideation mode")
    args = p.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        args._splits = _splits(args.dataset, args.source, args.split)
        loaded = {s: _load(args.dataset, args.source, s, args) for s in args._splits}
    except DataValidationError as exc:
        print(f"judgetrain data check: bad data\n{exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as exc:
        print(f"judgetrain data check: {exc}", file=sys.stderr)
        return 2

    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)

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


if __name__ == "__main__":
    sys.exit(main())
