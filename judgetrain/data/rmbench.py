"""RM-Bench adapter (evaluation only): one prompt, three chosen and three rejected responses in style order
[concise, detailed plain, detailed markdown].

Sources: the hub dataset ``THU-KEG/RM-Bench`` (its ``total_dataset.json``: string ids "domain/id" and a ``domain``
field), a local ``total_dataset.json``, or local per-domain files ``{chat,code,math,safety-refuse,safety-response}_filtered.json``
(no domain field: the domain comes from the file name and ids are made unique as "domain/id"). A folder may hold
any subset of the per-domain files.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable

import datasets

from judgetrain.utils.errors import MissingFileError

from .io import Table, build_dataset, data_files, load_hub, read_or_reject, resolve_local
from .sampling import balanced_sample
from .validate import DataValidationError, Rejects, RowProblem, check_text, validate_rows

logger = logging.getLogger(__name__)

HUB_ID = "THU-KEG/RM-Bench"
HUB_FILE = "total_dataset.json"
DOMAINS = ("chat", "code", "math", "safety-refuse", "safety-response")
STYLES = ("concise", "detailed_plain", "detailed_markdown")
SPLIT = "test"  # label used in messages; RM-Bench has one split


def domain_file(domain: str) -> str:
    return f"{domain}_filtered.json"


def features() -> datasets.Features:
    return datasets.Features({
        "id": datasets.Value("string"),
        "domain": datasets.Value("string"),
        "prompt": datasets.Value("string"),
        "chosen": datasets.List(datasets.Value("string")),
        "rejected": datasets.List(datasets.Value("string")),
    })


def _row_domain(row: dict, table: Table) -> str | None:
    return table.domain_hint or row.get("domain")


def make_check(table: Table):
    def check_row(row: dict) -> list[tuple[str, str]]:
        problems = []
        rid = row.get("id")
        if rid is None:
            problems.append(("id", "missing value"))
        elif isinstance(rid, bool) or not isinstance(rid, (int, str)) or (isinstance(rid, str) and not rid.strip()):
            problems.append(("id", f"wrong type: expected an int or non-empty string id, got {rid!r}"))
        domain = _row_domain(row, table)
        if domain is None:
            problems.append(("domain", "missing value"))
        elif domain not in DOMAINS:
            problems.append(("domain", f"unknown domain: {domain!r}, expected one of {DOMAINS}"))
        if err := check_text(row.get("prompt")):
            problems.append(("prompt", err))
        for col in ("chosen", "rejected"):
            value = row.get(col)
            if value is None:
                problems.append((col, "missing value"))
            elif not isinstance(value, (list, tuple)):
                problems.append((col, f"wrong type: expected a list of 3 strings, got {type(value).__name__}"))
            elif len(value) != 3:
                problems.append((col, f"wrong length: expected 3 responses (concise, detailed plain, detailed markdown), got {len(value)}"))
            else:
                for i, text in enumerate(value):
                    if err := check_text(text):
                        problems.append((col, f"{err} (style {i}, {STYLES[i]})"))
                        break
        if not problems:
            same = [i for i in range(3) if row["chosen"][i] == row["rejected"][i]]
            if same:
                problems.append(("rejected", f"chosen identical to rejected (style {same[0]}, {STYLES[same[0]]})"))
        return problems

    return check_row


def normalise_row(row: dict, table: Table) -> dict:
    domain = _row_domain(row, table)
    rid = str(row["id"])
    if not rid.startswith(f"{domain}/"):
        rid = f"{domain}/{rid}"
    return {"id": rid, "domain": domain, "prompt": row["prompt"],
            "chosen": list(row["chosen"]), "rejected": list(row["rejected"])}


def _tables(source: str | os.PathLike, rejects=None, revision: str | None = None) -> list[Table]:
    path = resolve_local(source, "rmbench")
    if path is None:
        return [load_hub(str(source), "train", data_files=HUB_FILE, revision=revision)]
    files = [path] if path.is_file() else data_files(path)
    total = [p for p in files if p.name == HUB_FILE]
    per_domain = [p for p in files if p.name in {domain_file(d) for d in DOMAINS}]
    if path.is_dir() and total and per_domain:
        logger.info("%s holds %s and per-domain files; using %s", path, HUB_FILE, HUB_FILE)
        per_domain = []
    if path.is_dir() and not (total or per_domain):
        raise MissingFileError(f"no RM-Bench files in {path}: expected {HUB_FILE} or "
                                f"{', '.join(domain_file(d) for d in DOMAINS)}")
    tables = []
    for p in (total or per_domain or files):
        table = read_or_reject(Path(p), rejects, SPLIT)
        if table is None:
            continue
        stem = Path(p).name.removesuffix("_filtered.json")
        table.domain_hint = stem if stem in DOMAINS else None
        tables.append(table)
    return tables


def load_rmbench(
    source: str | os.PathLike = HUB_ID,
    *,
    domains: Iterable[str] | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    on_bad_row: str = "error",
    rejects_path: str | os.PathLike | None = None,
    revision: str | None = None,
) -> datasets.Dataset:
    """RM-Bench rows: id ("domain/id"), domain, prompt, chosen[3], rejected[3] in style order.

    ``domains`` keeps only those domains; ``max_rows`` samples evenly across domains (deterministic for a seed).
    ``revision``: the hub commit, tag or branch of a hub ``source`` (pin it: a requeued run then reads the same rows).
    """
    if domains is not None:
        domains = list(domains)
        unknown = set(domains) - set(DOMAINS)
        if unknown:
            raise ValueError(f"unknown RM-Bench domains {sorted(unknown)}; choose from {DOMAINS}")
    rejects = Rejects("rmbench", SPLIT, on_bad_row, rejects_path)
    tables = _tables(source, rejects, revision)
    if domains is not None:
        tables = [t for t in tables if t.domain_hint is None or t.domain_hint in domains]
    goods, seen = [], {}
    for table in tables:
        verdict, bad = validate_rows(table.rows, make_check(table), source=table.source, split=SPLIT)
        # ids must be unique across the whole source once made "domain/id"
        for i in list(verdict.good):
            rid = normalise_row(table.rows[i], table)["id"]
            if rid in seen:
                verdict.good.remove(i)
                verdict.problems.append(RowProblem(table.source, SPLIT, i, "id", f"duplicate id: {rid!r} (first at {seen[rid]})"))
                bad[i] = table.rows[i]
            else:
                seen[rid] = f"{Path(table.source).name} row {i}"
        rejects.add(verdict, bad)
        goods.append(verdict.good)
    rejects.finish()
    ds = build_dataset(tables, goods, normalise_row, features())
    if domains is not None:
        ds = ds.filter(lambda d: d in domains, input_columns="domain")
    if not len(ds):
        raise DataValidationError([RowProblem(str(source), SPLIT, None, "domain", f"no rows for domains {domains}")], 0, 0)
    if max_rows is not None and max_rows < len(ds):
        ds = ds.select(balanced_sample(ds["domain"], max_rows, seed))
    return ds
