"""JudgeBias-DPO-RefFree adapter: materials-synthesis judge evaluations, direction-aware pairs.

Hub schema (the dataset card of ``iknow-lab/JudgeBias-DPO-RefFree``; ``COLUMNS`` below): prompt / chosen /
rejected are JSON strings of message lists; TRL would read them as plain text, so they are decoded here.
Already-decoded lists are accepted too.
"""

# Late imports: judgetrain.data (inside the functions that use them): `judgetrain data check` and `pairs build` read
# rows without a model: tokenizer and training libraries come in with the functions that need them.

from __future__ import annotations

import logging
import math
import os
from typing import Iterable

import datasets

from .io import Table, build_dataset, message_feature, read_split
from .sampling import balanced_sample
from .validate import Rejects, check_int, check_number, check_pair_messages, check_text, parse_messages, validate_rows

logger = logging.getLogger(__name__)

HUB_ID = "iknow-lab/JudgeBias-DPO-RefFree"
SPLITS = ("train", "validation")
CATEGORIES = ("error", "represent")
SCORE_RANGE = (0.5, 5.5)  # the upstream score parser keeps overall scores in this range

# perturbation_type -> category, canonical spellings
ERROR_TYPES = ("all_error_perturbation", "element_substitution", "numerical_perturbation",
               "equipment_substitution", "action_antonym")
REPRESENT_TYPES = ("llm_representational_perturbation", "llm_to_formula", "llm_to_name", "llm_to_iupac")
TYPE_CATEGORY = {**{t: "error" for t in ERROR_TYPES}, **{t: "represent" for t in REPRESENT_TYPES}}
TYPE_ALIASES = {
    "all_error_injection": "all_error_perturbation",
    "all_equivalence_rewriting": "llm_representational_perturbation",
    "to_formula": "llm_to_formula", "to_name": "llm_to_name", "to_iupac": "llm_to_iupac",
}
COMBINED_RATES = (0.01, 0.02, 0.05, 0.10, 0.15)
# the 17 perturbation sets as (type, rate)
PERTURBATION_SETS = (
    [("all_error_perturbation", r) for r in COMBINED_RATES]
    + [(t, 1.0) for t in ERROR_TYPES[1:]]
    + [("llm_representational_perturbation", r) for r in COMBINED_RATES]
    + [(t, 1.0) for t in REPRESENT_TYPES[1:]]
)

COLUMNS = ("prompt", "chosen", "rejected", "score_chosen", "score_rejected", "score_delta", "anchor_score",
           "sample_id", "perturbation_type", "perturbation_category", "perturbation_rate", "chosen_model",
           "rejected_model")
FLOAT_COLUMNS = ("score_chosen", "score_rejected", "score_delta", "anchor_score", "perturbation_rate")


def canonical_type(name: str) -> str:
    """The canonical perturbation_type spelling (accepts both spellings of the combined sets)."""
    name = TYPE_ALIASES.get(name, name)
    if name not in TYPE_CATEGORY:
        raise ValueError(f"unknown perturbation type {name!r}; known: {sorted(TYPE_CATEGORY) + sorted(TYPE_ALIASES)}")
    return name


def perturbation_set(perturbation_type: str, perturbation_rate: float) -> str:
    """Name of the perturbation set, e.g. ``element_substitution_100pct``, ``all_error_perturbation_5pct``."""
    return f"{canonical_type(perturbation_type)}_{round(float(perturbation_rate) * 100)}pct"


def features() -> datasets.Features:
    msgs = message_feature()
    return datasets.Features({
        "prompt": msgs, "chosen": msgs, "rejected": msgs,
        **{c: datasets.Value("float64") for c in ("score_chosen", "score_rejected", "score_delta", "anchor_score")},
        "sample_id": datasets.Value("int64"),
        "perturbation_type": datasets.Value("string"),
        "perturbation_category": datasets.Value("string"),
        "perturbation_rate": datasets.Value("float64"),
        "chosen_model": datasets.Value("string"),
        "rejected_model": datasets.Value("string"),
    })


def check_row(row: dict) -> list[tuple[str, str]]:
    """Problems of one raw JudgeBias row as (field, problem)."""
    problems: list[tuple[str, str]] = []
    missing = [c for c in COLUMNS if c not in row or row[c] is None]
    problems.extend((c, "missing value") for c in missing)
    problems += check_pair_messages(row, [["system", "user"]], skip=missing)
    for col in FLOAT_COLUMNS:
        if col in missing:
            continue
        rng = {"perturbation_rate": (0.0, 1.0), "score_delta": (0.0, SCORE_RANGE[1] - SCORE_RANGE[0])}.get(col, SCORE_RANGE)
        err = check_number(row[col], *rng)
        if col == "perturbation_rate" and not err and float(row[col]) <= 0:
            err = f"out of range: {row[col]} must be > 0"
        if err:
            problems.append((col, err))
    bad = {f for f, _ in problems}
    if not bad & {"score_chosen", "score_rejected", "score_delta"}:
        expect = abs(float(row["score_chosen"]) - float(row["score_rejected"]))
        if not math.isclose(float(row["score_delta"]), expect, abs_tol=1e-6):
            problems.append(("score_delta", f"score_delta inconsistent: {row['score_delta']} != "
                                            f"|score_chosen - score_rejected| = {expect}"))
    if "sample_id" not in missing and (err := check_int(row["sample_id"])):
        problems.append(("sample_id", err))
    for col in ("perturbation_type", "perturbation_category", "chosen_model", "rejected_model"):
        if col not in missing and (err := check_text(row[col])):
            problems.append((col, err))
    bad = {f for f, _ in problems}
    if "perturbation_category" not in bad and row["perturbation_category"] not in CATEGORIES:
        problems.append(("perturbation_category", f"unknown category: {row['perturbation_category']!r}, expected one of {CATEGORIES}"))
    if "perturbation_type" not in bad:
        ptype = TYPE_ALIASES.get(row["perturbation_type"], row["perturbation_type"])
        if ptype not in TYPE_CATEGORY:
            problems.append(("perturbation_type", f"unknown perturbation type: {row['perturbation_type']!r}"))
        elif "perturbation_category" not in {f for f, _ in problems} and TYPE_CATEGORY[ptype] != row["perturbation_category"]:
            problems.append(("perturbation_type", f"type/category mismatch: {ptype!r} is a "
                                                  f"{TYPE_CATEGORY[ptype]} type, row says {row['perturbation_category']!r}"))
    return problems


def normalise_row(row: dict, table: Table | None = None) -> dict:
    out = {c: row[c] for c in COLUMNS}
    for col in ("prompt", "chosen", "rejected"):
        msgs, _ = parse_messages(row[col])
        out[col] = [{"role": m["role"], "content": m["content"]} for m in msgs]
    for col in FLOAT_COLUMNS:
        out[col] = float(row[col])
    out["sample_id"] = int(row["sample_id"])
    out["perturbation_type"] = canonical_type(row["perturbation_type"])
    return out


def load_judgebias(
    source: str | os.PathLike = HUB_ID,
    split: str = "train",
    *,
    categories: Iterable[str] | None = None,
    types: Iterable[str] | None = None,
    min_score_delta: float | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    on_bad_row: str = "error",
    rejects_path: str | os.PathLike | None = None,
    revision: str | None = None,
) -> datasets.Dataset:
    """JudgeBias rows in TRL conversational format: the hub columns, prompt/chosen/rejected as message lists.

    Every row is validated before anything else; ``categories`` / ``types`` / ``min_score_delta`` filter the
    valid rows, then ``max_rows`` samples evenly across perturbation types (deterministic for a ``seed``).
    ``revision``: the hub commit, tag or branch of a hub ``source`` (pin it: a requeued run then reads the same rows).
    """
    if categories is not None:
        categories = list(categories)
        unknown = set(categories) - set(CATEGORIES)
        if unknown:
            raise ValueError(f"unknown categories {sorted(unknown)}; choose from {CATEGORIES}")
    if types is not None:
        types = [canonical_type(t) for t in types]
    rejects = Rejects("judgebias", split, on_bad_row, rejects_path)
    tables = read_split(source, "judgebias", split, rejects, revision=revision)
    goods = []
    for table in tables:
        missing = _missing_columns(table)
        if missing:
            from .validate import DataValidationError, RowProblem

            raise DataValidationError([RowProblem(table.source, split, None, c, "missing column") for c in missing],
                                      n_bad_rows=len(table.rows), n_rows=len(table.rows))
        verdict, bad = validate_rows(table.rows, check_row, source=table.source, split=split)
        rejects.add(verdict, bad)
        goods.append(verdict.good)
    rejects.finish()
    ds = build_dataset(tables, goods, normalise_row, features())
    n0 = len(ds)
    if categories is not None:
        ds = ds.filter(lambda c: c in categories, input_columns="perturbation_category")
    if types is not None:
        ds = ds.filter(lambda t: t in types, input_columns="perturbation_type")
    if min_score_delta is not None:
        ds = ds.filter(lambda d: d >= min_score_delta, input_columns="score_delta")
    if len(ds) != n0:
        logger.info("judgebias/%s: filters kept %d of %d valid rows", split, len(ds), n0)
    if max_rows is not None and max_rows < len(ds):
        ds = ds.select(balanced_sample(ds["perturbation_type"], max_rows, seed))
        logger.info("judgebias/%s: max_rows=%d sampled evenly across perturbation types", split, max_rows)
    return ds


def _missing_columns(table: Table) -> list[str]:
    if isinstance(table.rows, datasets.Dataset):
        return [c for c in COLUMNS if c not in table.rows.column_names]
    if not table.rows:
        return []
    present = set().union(*(r.keys() for r in table.rows if isinstance(r, dict)))
    return [c for c in COLUMNS if c not in present]
