"""The items a judge evaluates: read, checked and keyed before any model loads.

An item is one row with ``sample_id`` (an integer, or a non-empty string), ``prompt`` (the messages the judge reads:
a list of ``{"role", "content"}`` objects, or its JSON string) and any other columns, which are carried through to
the output rows (``perturbation_set``, ``perturbation_category``, ``perturbation_rate`` are the ones `judgetrain
pairs build` reads). An item is identified by ``sample_id`` and, when the row has one, ``perturbation_set``: the same
sample judged under several perturbations is several items.

Sources: a JSONL / JSON / parquet file (gzip too), a folder of them (``--items_split``'s files), or a hub dataset
(``owner/name``, ``--items_split``). Rows of JudgeBias-DPO-RefFree (``chosen`` / ``rejected`` / ``perturbation_type``
columns) are read as items too: one item per ``sample_id`` x perturbation set (type and rate), with the row's
``prompt`` (`judgebias_items`).

Bad rows (no ``sample_id``, a prompt that is not messages, an item key seen before) are named with their file, row
and field (`judgetrain.data.validate.DataValidationError`), or with ``on_bad_row="skip"`` written to a rejects file
and counted; nothing is dropped silently.
"""

# Late imports: judgetrain.data, pyarrow (inside the functions that use them): items are read and checked before any
# model loads: the model libraries come in when a judge is loaded.

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from judgetrain.data.io import JsonLines, Table, read_split, resolve_local
from judgetrain.data.validate import Rejects, RowProblem, json_safe, parse_messages, validate_rows
from judgetrain.judge.resume import file_stamp

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
PANEL_COLUMNS = ("sample_id", "perturbation_set", "perturbation_category", "perturbation_rate")
JUDGEBIAS_MARKERS = ("chosen", "rejected", "perturbation_type")  # a JudgeBias-DPO-RefFree row (pairs, not items)
_RESERVED = ("judge_model", "evaluation", "score", "reason", "n_tokens", "stopped")  # written by the judge


@dataclass
class Item:
    """One item: its key (sample_id, perturbation_set or None), its messages, the columns carried through."""

    key: tuple[Any, Any]
    messages: list[dict]
    columns: dict[str, Any]  # every column of the row but ``prompt``, as read (JSON-safe)
    source: str = ""
    row: int = -1


@dataclass
class ItemSet:
    items: list[Item]
    source: str
    n_rows: int = 0
    n_rejected: int = 0
    rejects_path: str | None = None
    judgebias: bool = False  # read from JudgeBias-DPO-RefFree pair rows
    problems: list[str] = field(default_factory=list)
    stamp: dict | None = None  # a local file's path, size, modification time and inode, taken before reading it
    on_bad_row: str = "error"
    _digest: str | None = field(default=None, repr=False)

    def digest(self) -> str:
        """SHA-256 over every item's key and messages, in order: what a resume compares (the file's bytes may
        differ, a hub dataset has none; the items must not). Computed once."""
        if self._digest is None:
            h = hashlib.sha256()
            for item in self.items:
                h.update(json.dumps([list(item.key), item.messages], ensure_ascii=False).encode("utf-8"))
                h.update(b"\n")
            self._digest = h.hexdigest()
        return self._digest


def check_sample_id(value: Any) -> str | None:
    if value is None:
        return "missing value"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        if isinstance(value, float) and value.is_integer():
            return None
        return f"wrong type: expected an integer or a string, got {type(value).__name__}"
    if isinstance(value, str) and not value.strip():
        return "empty string"
    return None


def check_prompt(value: Any) -> tuple[list[dict] | None, str | None]:
    """(messages, None), or (None, why the prompt is not a list of {role, content} messages)."""
    messages, err = parse_messages(value)
    if err:
        return None, err
    if not messages:
        return None, "empty message list"
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return None, f"wrong type: message {i} is {type(m).__name__}, expected an object with role and content"
        if m.get("role") not in ROLES:
            return None, f"message {i} has role {m.get('role')!r}, expected one of {ROLES}"
        if not isinstance(m.get("content"), str) or not m["content"].strip():
            return None, f"message {i} ({m['role']}) has no text content"
        clean.append({"role": m["role"], "content": m["content"]})
    if clean[-1]["role"] == "assistant":
        return None, "the last message is the assistant's: the judge writes that turn"
    return clean, None


def check_item(row: dict) -> list[tuple[str, str]]:
    problems = []
    if "sample_id" not in row:
        problems.append(("sample_id", "missing column"))
    elif err := check_sample_id(row["sample_id"]):
        problems.append(("sample_id", err))
    if "prompt" not in row:
        problems.append(("prompt", "missing column"))
    else:
        _, err = check_prompt(row["prompt"])
        if err:
            problems.append(("prompt", err))
    taken = [c for c in _RESERVED if c in row]
    if taken:
        problems.append((taken[0], f"column {taken[0]!r} is what the judge writes; rename it in the items"))
    return problems


_PLAIN = (str, int, bool, type(None))


def _plain(value: Any) -> Any:
    return value if type(value) in _PLAIN else json_safe(value)


def _sample_id(value: Any) -> Any:
    return int(value) if isinstance(value, float) else value


def is_judgebias(columns: set[str]) -> bool:
    return all(c in columns for c in JUDGEBIAS_MARKERS) and "prompt" in columns


def judgebias_items(row: dict) -> dict:
    """A JudgeBias-DPO-RefFree row as an item: its sample, perturbation set (type and rate) and prompt."""
    from judgetrain.data.judgebias import TYPE_CATEGORY, canonical_type, perturbation_set

    ptype = canonical_type(str(row["perturbation_type"]))
    rate = float(row["perturbation_rate"]) if row.get("perturbation_rate") is not None else 1.0
    return {"sample_id": row["sample_id"], "perturbation_set": perturbation_set(ptype, rate),
            "perturbation_category": row.get("perturbation_category") or TYPE_CATEGORY[ptype],
            "perturbation_rate": rate, "perturbation_type": ptype, "prompt": row["prompt"]}


def _check_judgebias(row: dict) -> list[tuple[str, str]]:
    from judgetrain.data.judgebias import canonical_type

    problems = check_item({k: row[k] for k in ("sample_id", "prompt") if k in row})
    try:
        canonical_type(str(row.get("perturbation_type")))
    except ValueError as e:
        problems.append(("perturbation_type", str(e)))
    rate = row.get("perturbation_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1):
        problems.append(("perturbation_rate", f"expected a number in (0, 1], got {rate!r}"))
    return problems


def _read_tables(source: str, split: str, rejects: Rejects, revision: str | None) -> list[Table]:
    """The rows of ``source``: a local JSONL file parsed a line at a time into a list and a parquet file through
    pyarrow (the items are all held anyway: no datasets cache to write or index a row at a time); anything else, or
    a file these readers cannot read (for `read_split`'s message naming what is wrong), through `read_split`."""
    path = resolve_local(source, "items") if revision is None else None
    if path is not None and path.is_file() and path.suffix in (".jsonl", ".parquet"):
        try:
            if path.suffix == ".jsonl":
                return [Table(str(path), list(JsonLines.parse(path)))]
            import pyarrow.parquet as pq

            return [Table(str(path), pq.read_table(path).to_pylist())]
        except Exception:  # noqa: BLE001 - read_split names the problem (a torn parquet file, a bad byte)
            pass
    return read_split(source, "items", split, rejects, **({"revision": revision} if revision else {}))


def read_items(source: str, *, split: str = "train", on_bad_row: str = "error", rejects_path: str | None = None,
               revision: str | None = None) -> ItemSet:
    """The items of ``source`` (see the module doc), checked; raises `DataValidationError` naming file, row and field
    (``on_bad_row="error"``) or writes the bad rows to ``rejects_path`` and counts them (``"skip"``)."""
    rejects = Rejects("items", split, on_bad_row, rejects_path)
    stamp = file_stamp(source)
    tables = _read_tables(source, split, rejects, revision)
    items: list[Item] = []
    seen: dict[tuple, tuple[str, int, list]] = {}  # key -> (source, row, messages) of its first row
    judgebias = False
    for table in tables:
        rows = table.rows
        columns = set(rows.column_names) if hasattr(rows, "column_names") else \
            set().union(*(r.keys() for r in rows[:50] if isinstance(r, dict))) if len(rows) else set()
        jb = is_judgebias(columns)
        judgebias |= jb
        verdict, bad = validate_rows(rows, _check_judgebias if jb else check_item, source=table.source, split=split)
        rejects.add(verdict, bad)
        for i in verdict.good:
            row = judgebias_items(rows[i]) if jb else dict(rows[i])
            messages, _ = check_prompt(row["prompt"])
            key = (_sample_id(row["sample_id"]), row.get("perturbation_set"))
            if key in seen:
                first_source, first_row, first_messages = seen[key]
                if jb and messages == first_messages:
                    continue  # several pairs of one sample and set: one item
                what = f"sample_id {key[0]!r}" + (f", perturbation_set {key[1]!r}" if key[1] is not None else "")
                detail = "with another prompt" if jb else ""
                rejects.add_problem(RowProblem(table.source, split, i, "sample_id",
                                               f"duplicated item: {what} already at {first_source} row {first_row}"
                                               + (f" {detail}" if detail else "")), _plain(rows[i]), n_rows=0)
                continue
            seen[key] = (table.source, i, messages)
            columns_out = {k: _plain(v) for k, v in row.items() if k != "prompt"}
            columns_out["sample_id"] = key[0]
            items.append(Item(key, messages, columns_out, table.source, i))
    path = rejects.finish()
    out = ItemSet(items, str(source), rejects.n_rows, rejects.n_bad, str(path) if path else None, judgebias,
                  stamp=stamp, on_bad_row=on_bad_row)
    if not items:
        raise ValueError(f"{source}: no items to judge" + (f" ({rejects.n_bad} rejected, see {path})" if path else ""))
    logger.info("items: %d from %s%s%s", len(items), source,
                " (JudgeBias-DPO-RefFree rows: one item per sample and perturbation set)" if judgebias else "",
                f"; {rejects.n_bad} rejected, written to {path}" if rejects.n_bad else "")
    return out
