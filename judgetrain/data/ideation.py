"""Research-ideation-arena-si-rm adapter: preferred vs other research proposal for a literature context.

Modes:
- ``implicit``: prompt = [user: instruction + literature context], chosen / rejected = the human-preferred / other
  proposal (for implicit-reward DPO judges).
- ``pairwise``: prompt = [system: judge instruction, user: context + "Proposal A" + "Proposal B"], chosen = the
  verdict for the preferred proposal ("Proposal A is better."), rejected = the other verdict. Every pair is
  emitted in both orders (``order`` "AB": A is the preferred proposal, "BA": B is) with a shared ``pair_id``, so
  position cannot be learned. The judge prompt never holds labels, chosen/rejected designations or provenance.

Splits: ``train`` (``group_disjoint=True`` drops rows with ``shares_test_group``), ``validation`` (carved from
the train rows by ``split_group_id`` with ``validation_fraction``, never by random rows; those groups are then
absent from ``train``), ``test``.
"""

from __future__ import annotations

import logging
import os
import random

import datasets

from .io import Table, message_feature, read_split
from .sampling import deterministic_subset
from .validate import DataValidationError, Rejects, RowProblem, check_text, validate_rows

logger = logging.getLogger(__name__)

HUB_ID = "tintin1027/research-ideation-arena-si-rm"
SPLITS = ("train", "validation", "test")
MODES = ("implicit", "pairwise")
REQUIRED = ("sample_id", "prompt", "chosen", "rejected", "response_a", "response_b", "human_preference",
            "split_group_id", "shares_test_group")
PAIRWISE_SYSTEM = (
    "You are an expert reviewer of research proposals. Read the research task and the two proposals, then say "
    "which proposal is better overall: more specific, novel, feasible and testable. Answer with exactly one "
    "sentence: \"Proposal A is better.\" or \"Proposal B is better.\""
)
VERDICT = "Proposal {} is better."


def preference_letter(value) -> str | None:
    """'A' or 'B' from the human_preference spellings seen in exports (A, b, response_a, model_b, ...)."""
    if not isinstance(value, str):
        return None
    v = value.strip().lower()
    for prefix in ("response_", "model_", "proposal_", "proposal ", ""):
        if v in (prefix + "a", prefix + "b"):
            return v[-1].upper()
    return None


def check_row(row: dict) -> list[tuple[str, str]]:
    problems = []
    missing = [c for c in REQUIRED if c not in row or row[c] is None]
    problems += [(c, "missing value") for c in missing]
    for col in ("prompt", "chosen", "rejected", "response_a", "response_b"):
        if col not in missing and (err := check_text(row[col])):
            problems.append((col, err))
    if not {"chosen", "rejected"} & {f for f, _ in problems} and row["chosen"] == row["rejected"]:
        problems.append(("rejected", "chosen identical to rejected"))
    sid = row.get("sample_id")
    if "sample_id" not in missing and (isinstance(sid, bool) or not isinstance(sid, (str, int)) or str(sid).strip() == ""):
        problems.append(("sample_id", f"wrong type: expected a non-empty string or int, got {sid!r}"))
    gid = row.get("split_group_id")
    if "split_group_id" not in missing and (isinstance(gid, bool) or not isinstance(gid, (str, int)) or str(gid).strip() == ""):
        problems.append(("split_group_id", f"wrong type: expected a non-empty string or int, got {gid!r}"))
    if "shares_test_group" not in missing and not isinstance(row["shares_test_group"], bool):
        problems.append(("shares_test_group", f"wrong type: expected a bool, got {type(row['shares_test_group']).__name__}"))
    if "human_preference" not in missing:
        letter = preference_letter(row["human_preference"])
        if letter is None:
            problems.append(("human_preference", f"unknown label: {row['human_preference']!r}, expected A or B"))
        elif not problems:
            pref, other = (row["response_a"], row["response_b"]) if letter == "A" else (row["response_b"], row["response_a"])
            if pref != row["chosen"] or other != row["rejected"]:
                problems.append(("human_preference", f"inconsistent: response_{letter.lower()} is not the chosen proposal "
                                                     "or the other response is not the rejected one"))
    return problems


def pairwise_prompt(context: str, proposal_a: str, proposal_b: str) -> list[dict]:
    user = (f"Research task and literature context:\n{context}\n\nProposal A:\n{proposal_a}\n\n"
            f"Proposal B:\n{proposal_b}\n\nWhich proposal is better?")
    return [{"role": "system", "content": PAIRWISE_SYSTEM}, {"role": "user", "content": user}]


def _features(mode: str) -> datasets.Features:
    msgs = message_feature()
    cols = {"prompt": msgs, "chosen": msgs, "rejected": msgs, "sample_id": datasets.Value("string"),
            "split_group_id": datasets.Value("string"), "pair_id": datasets.Value("string")}
    if mode == "pairwise":
        cols |= {"order": datasets.Value("string"), "preferred": datasets.Value("string")}
    return datasets.Features(cols)


def _implicit(row: dict, table: Table | None = None) -> dict:
    return {"prompt": [{"role": "user", "content": row["prompt"]}],
            "chosen": [{"role": "assistant", "content": row["chosen"]}],
            "rejected": [{"role": "assistant", "content": row["rejected"]}],
            "sample_id": str(row["sample_id"]), "split_group_id": str(row["split_group_id"]),
            "pair_id": str(row["sample_id"])}


def _pairwise(row: dict) -> list[dict]:
    out = []
    for order, (a, b), pref in (("AB", (row["chosen"], row["rejected"]), "A"), ("BA", (row["rejected"], row["chosen"]), "B")):
        other = "B" if pref == "A" else "A"
        out.append({"prompt": pairwise_prompt(row["prompt"], a, b),
                    "chosen": [{"role": "assistant", "content": VERDICT.format(pref)}],
                    "rejected": [{"role": "assistant", "content": VERDICT.format(other)}],
                    "sample_id": str(row["sample_id"]), "split_group_id": str(row["split_group_id"]),
                    "pair_id": str(row["sample_id"]), "order": order, "preferred": pref})
    return out


def carve_validation(group_ids: list[str], eligible: list[bool], fraction: float, seed: int = 0) -> set[str]:
    """Groups (split_group_id) held out for validation: whole groups, drawn with the seed, until ``fraction``
    of the eligible rows is reached. Groups with any ineligible row (shares_test_group) are never drawn."""
    if not 0 <= fraction < 1:
        raise ValueError(f"validation_fraction must be in [0, 1), got {fraction}")
    sizes: dict[str, int] = {}
    blocked = set()
    for g, ok in zip(group_ids, eligible):
        sizes[g] = sizes.get(g, 0) + 1
        if not ok:
            blocked.add(g)
    candidates = sorted(g for g in sizes if g not in blocked)
    random.Random(seed).shuffle(candidates)
    target = fraction * sum(ok for ok in eligible)
    held, n = set(), 0
    for g in candidates:
        if n >= target:
            break
        held.add(g)
        n += sizes[g]
    return held


def load_ideation(
    source: str | os.PathLike = HUB_ID,
    split: str = "train",
    *,
    mode: str = "implicit",
    group_disjoint: bool = True,
    validation_fraction: float = 0.1,
    seed: int = 0,
    max_rows: int | None = None,
    on_bad_row: str = "error",
    rejects_path: str | os.PathLike | None = None,
    revision: str | None = None,
) -> datasets.Dataset:
    """Ideation preference rows (see the module docstring). ``max_rows`` caps the number of source pairs
    (drawn with the seed); pairwise mode then emits two rows per pair. ``revision``: the hub commit, tag or branch of a hub ``source`` (pin it: a requeued run then reads the same rows)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    raw_split = "test" if split == "test" else "train"
    rejects = Rejects("ideation", split, on_bad_row, rejects_path)
    tables = read_split(source, "ideation", raw_split, rejects, revision=revision)
    rows = []
    for table in tables:
        if isinstance(table.rows, datasets.Dataset):
            absent = [c for c in REQUIRED if c not in table.rows.column_names]
            if absent:
                raise DataValidationError([RowProblem(table.source, raw_split, None, c, "missing column") for c in absent],
                                          len(table.rows), len(table.rows))
        verdict, bad = validate_rows(table.rows, check_row, source=table.source, split=raw_split)
        rejects.add(verdict, bad)
        rows += [table.rows[i] for i in verdict.good]
    rejects.finish()

    if raw_split == "train":
        shares = [r["shares_test_group"] for r in rows]
        groups = [str(r["split_group_id"]) for r in rows]
        held = carve_validation(groups, [not s for s in shares], validation_fraction, seed) if validation_fraction else set()
        if split == "validation":
            if not held:
                raise ValueError("split='validation' needs validation_fraction > 0")
            rows = [r for r, g in zip(rows, groups) if g in held]
        else:
            n0 = len(rows)
            keep = [(g not in held) and not (group_disjoint and s) for g, s in zip(groups, shares)]
            n_shared = sum(1 for g, s in zip(groups, shares) if s and g not in held) if group_disjoint else 0
            rows = [r for r, k in zip(rows, keep) if k]
            logger.info("ideation/train: %d of %d rows kept (%d held out as validation by split_group_id, "
                        "%d dropped for shares_test_group)", len(rows), n0, n0 - len(rows) - n_shared, n_shared)
    if max_rows is not None and max_rows < len(rows):
        rows = [rows[i] for i in deterministic_subset(len(rows), max_rows, seed)]
    if mode == "implicit":
        out = [_implicit(r) for r in rows]
    else:
        out = [x for r in rows for x in _pairwise(r)]
    return datasets.Dataset.from_list(out, features=_features(mode))
