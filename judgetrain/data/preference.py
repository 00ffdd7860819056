"""Plain preference rows: ``prompt`` / ``chosen`` / ``rejected`` message lists (or their JSON strings), the schema of
`judgetrain pairs known`'s pairwise pairs and of any team's own DPO rows, whatever their other columns.

    load_preference("pairs_known", split="train")        # train.parquet of a pairs folder, or any jsonl/parquet

A recipe names it as ``{dataset: preference, source: pairs_known, split: train}``. The prompt ends with a user
turn (a system turn may come first), chosen and rejected are one assistant turn each and differ; ``sample_id`` and ``group``
(rows a recipe's ``batch_groups`` keeps in one batch) are kept when present (as strings), and ``tie`` (true: the two
responses are equally good, a pair only a recipe's ``tie_model`` trains; absent or null: false) as a bool. Bad rows are named by file, row and field (``on_bad_row="skip"``: counted and
written to the rejects file).
"""

from __future__ import annotations

import os

import datasets

from .io import Table, build_dataset, message_feature, read_split
from .sampling import deterministic_subset
from .validate import DataValidationError, Rejects, RowProblem, check_pair_messages, parse_messages, validate_rows

PROMPT_ROLES = [["user"], ["system", "user"]]


def check_row(row: dict) -> list[tuple[str, str]]:
    """Problems of one row as (field, problem)."""
    problems = check_pair_messages(row, PROMPT_ROLES)
    tie = row.get("tie")
    if tie is not None and not isinstance(tie, bool) and type(tie).__name__ != "bool_":
        problems.append(("tie", f"{tie!r} is not true, false or null"))
    return problems


def normalise_row(row: dict, table: Table | None = None) -> dict:
    out = {}
    for col in ("prompt", "chosen", "rejected"):
        msgs, _ = parse_messages(row[col])
        out[col] = [{"role": m["role"], "content": m["content"]} for m in msgs]
    out["sample_id"] = None if row.get("sample_id") is None else str(row["sample_id"])
    out["group"] = None if row.get("group") is None else str(row["group"])
    out["tie"] = bool(row.get("tie"))
    return out


def features() -> datasets.Features:
    msgs = message_feature()
    return datasets.Features({"prompt": msgs, "chosen": msgs, "rejected": msgs, "sample_id": datasets.Value("string"),
                              "group": datasets.Value("string"), "tie": datasets.Value("bool")})


def load_preference(source: str | os.PathLike, split: str = "train", *, max_rows: int | None = None, seed: int = 0,
                    on_bad_row: str = "error", rejects_path: str | os.PathLike | None = None,
                    revision: str | None = None) -> datasets.Dataset:
    """The rows of ``source`` (a file, a folder's ``split`` files, or a hub split) in TRL's conversational format,
    every row checked first; ``max_rows``: a seeded subset."""
    rejects = Rejects("preference", split, on_bad_row, rejects_path)
    tables = read_split(source, "preference", split, rejects, revision=revision)
    goods = []
    for table in tables:
        verdict, bad = validate_rows(table.rows, check_row, source=table.source, split=split)
        rejects.add(verdict, bad)
        goods.append(verdict.good)
    rejects.finish()
    ds = build_dataset(tables, goods, normalise_row, features())
    if not len(ds):
        raise DataValidationError([RowProblem(str(source), split, None, "<file>", "no rows")], 0, 0)
    if max_rows is not None and max_rows < len(ds):
        ds = ds.select(deterministic_subset(len(ds), max_rows, seed))
    return ds
