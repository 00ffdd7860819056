"""`judgetrain data check`: validate a dataset source and print its statistics.

    judgetrain data check --dataset judgebias --source bundled --tokenizer path/to/model
    judgetrain data check --dataset rmbench --source RM-Bench/data
    judgetrain data check --dataset ideation --source data/ideation --split test --on_bad_row skip \
        --rejects_path bad.jsonl

Prints row counts per split, category, perturbation type and domain, and (with --tokenizer) the token-length
distribution of prompt + chosen and prompt + rejected after the chat template. Exits 2 on bad data, naming the
file, split, row and field, and on a source without rows.
"""

# Late imports: judgetrain.data (inside the functions that use them): `judgetrain data check` and `pairs build` read
# rows without a model: tokenizer and training libraries come in with the functions that need them.

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from judgetrain.data.chat import chat_ids, text_ids

from .io import resolve_local, split_files

logger = logging.getLogger(__name__)

DATASETS = ("judgebias", "ideation", "rmbench")
PERCENTILES = (50, 90, 95, 99, 100)
PROGRESS_FROM = 2000  # pairs: a smaller source is tokenized in seconds


def splits_of(dataset: str, source: str, asked: list[str] | None) -> list[str]:
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


def load_split(dataset: str, source: str, split: str, args):
    from . import load_ideation, load_judgebias, load_rmbench

    rejects = None
    if args.rejects_path:
        rejects = (args.rejects_path if len(args.splits_of) == 1
                   else str(Path(args.rejects_path).with_suffix("")) + f"-{split}.jsonl")
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
    """Tokens of prompt + chosen and of prompt + rejected per pair, a progress bar on a source of 2,000 pairs or
    more."""
    chosen, rejected = [], []
    pairs = len(ds) * (3 if dataset == "rmbench" else 1)
    for c, r in tqdm(_texts(dataset, ds, tokenizer), total=pairs, desc="token lengths", unit="pair",
                     disable=pairs < PROGRESS_FROM):
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
