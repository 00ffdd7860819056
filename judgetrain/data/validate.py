"""Row validation shared by every adapter: problems, the error that names them, the rejects file.

An adapter hands each raw row to a check function that returns a list of ``(field, problem)``; this module
turns those into either one :class:`DataValidationError` (``on_bad_row="error"``, the default) or a rejects
jsonl plus a logged count per reason (``on_bad_row="skip"``). Nothing is dropped without being written down.
"""

# Late imports: judgetrain.utils (inside the functions that use them): `judgetrain data check` and `pairs build` read
# rows without a model: tokenizer and training libraries come in with the functions that need them.

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from judgetrain.utils.errors import BadInputError
from judgetrain.utils.files import write_lines

logger = logging.getLogger(__name__)

ON_BAD_ROW = ("error", "skip")
# key of the placeholder row io.py makes for a jsonl line that is not JSON
MALFORMED = "__malformed_json__"


@dataclass(frozen=True)
class RowProblem:
    """One problem found in one row. ``row`` is the index inside ``source`` (file or hub split)."""

    source: str
    split: str
    row: int | None
    field: str
    problem: str

    def describe(self) -> str:
        where = "all rows" if self.row is None else f"row {self.row}"
        return f"{self.source} [split={self.split}] {where}, field {self.field!r}: {self.problem}"


class DataValidationError(BadInputError, ValueError):
    """Raised when rows fail validation. The message names source, split, row, field, problem and the bad-row count."""

    def __init__(self, problems: Sequence[RowProblem], n_bad_rows: int | None = None, n_rows: int | None = None):
        if not problems:
            raise ValueError("DataValidationError needs at least one problem")
        self.problems = list(problems)
        self.n_bad_rows = n_bad_rows if n_bad_rows is not None else len({(p.source, p.row) for p in problems})
        self.n_rows = n_rows
        first = self.problems[0]
        self.source, self.split, self.row, self.field, self.problem = (
            first.source, first.split, first.row, first.field, first.problem)
        total = f" of {n_rows}" if n_rows is not None else ""
        lines = [f"{first.describe()}", f"{self.n_bad_rows}{total} rows are bad in total."]
        reasons = Counter(f"{p.field}: {_reason_key(p.problem)}" for p in self.problems)
        if len(reasons) > 1:
            lines.append("problems by field: " + "; ".join(f"{k} x{v}" for k, v in reasons.most_common()))
        for p in self.problems[1:5]:
            lines.append(f"  also: {p.describe()}")
        lines.append("Fix the data or pass --on_bad_row skip (a recipe's key on_bad_row: skip) to drop and record bad rows.")
        super().__init__("\n".join(lines))


def _reason_key(problem: str) -> str:
    """Problem text without the row-specific detail after the first colon, for counting per reason."""
    return problem.split(":", 1)[0]


# Everything json.loads raises on hostile text: JSONDecodeError (a ValueError), a number of over 4,300 digits
# (ValueError from int max str digits), bracket nesting deeper than the interpreter's recursion limit.
JSON_ERRORS = (ValueError, RecursionError)


def json_problem(exc: BaseException, line: int | None = None) -> str:
    """One line saying why a JSON text could not be read (``line``: the file line the text was, for JSON lines)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"malformed JSON: {exc.msg} at line {line or exc.lineno} column {exc.colno}"
    where = f" (line {line})" if line is not None else ""
    if isinstance(exc, RecursionError):
        return f"malformed JSON: nested deeper than can be read (RecursionError){where}"
    return f"malformed JSON: {str(exc).split(';')[0]}{where}"  # "Exceeds the limit (4300 digits) for integer ..."


# ---------------------------------------------------------------- field checks (return a problem or None)

def is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    # numpy scalars without importing numpy here
    return type(value).__module__ == "numpy" and hasattr(value, "dtype") and value.dtype.kind in "iuf"


def check_number(value: Any, lo: float | None = None, hi: float | None = None) -> str | None:
    if value is None:
        return "missing value"
    if not is_number(value):
        return f"wrong type: expected a number, got {type(value).__name__}"
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        return f"not finite: {v}"
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        return f"out of range: {v} not in [{lo}, {hi}]"
    return None


def check_int(value: Any) -> str | None:
    if value is None:
        return "missing value"
    dtype = getattr(value, "dtype", None)  # numpy integer scalars
    is_int = isinstance(value, int) or (is_number(value) and dtype is not None and dtype.kind in "iu")
    if isinstance(value, bool) or not is_int:
        return f"wrong type: expected an integer, got {type(value).__name__}"
    if not -(2**63) <= int(value) < 2**63:
        return f"out of range: {value} does not fit a 64-bit integer"
    return None


def check_text(value: Any) -> str | None:
    if value is None:
        return "missing value"
    if not isinstance(value, str):
        return f"wrong type: expected a string, got {type(value).__name__}"
    if not value.strip():
        return "empty content"
    return None


def parse_messages(value: Any) -> tuple[list | None, str | None]:
    """Decode a message list given as a JSON string (the hub schema) or already decoded."""
    if value is None:
        return None, "missing value"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except JSON_ERRORS as exc:
            return None, json_problem(exc)
    if not isinstance(value, (list, tuple)):
        return None, f"wrong type: expected a list of messages, got {type(value).__name__}"
    return list(value), None


def check_messages(messages: list, roles_allowed: Sequence[Sequence[str]]) -> str | None:
    """Each message a {role, content} dict with non-empty string content; roles exactly one of ``roles_allowed``."""
    roles = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"wrong type: message {i} is {type(m).__name__}, expected an object with role and content"
        missing = [k for k in ("role", "content") if k not in m]
        if missing:
            return f"missing key: message {i} has no {missing[0]!r}"
        if not isinstance(m["content"], str):
            return f"wrong type: message {i} content is {type(m['content']).__name__}"
        if not m["content"].strip():
            return f"empty content: message {i} ({m['role']}) is empty"
        roles.append(m["role"])
    if [list(r) for r in roles_allowed if list(r) == roles]:
        return None
    want = " or ".join("[" + ", ".join(r) + "]" for r in roles_allowed)
    return f"wrong roles: got [{', '.join(map(str, roles))}], expected {want}"


def check_pair_messages(row: dict, prompt_roles: Sequence[Sequence[str]], skip: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Problems (field, problem) of a preference row's ``prompt`` (roles one of ``prompt_roles``), ``chosen`` and
    ``rejected`` (one assistant turn each, not the same text); the columns in ``skip`` are not read."""
    problems, contents = [], {}
    for col, roles in (("prompt", prompt_roles), ("chosen", [["assistant"]]), ("rejected", [["assistant"]])):
        if col in skip:
            continue
        msgs, err = parse_messages(row.get(col))
        err = err or check_messages(msgs, roles)
        if err:
            problems.append((col, err))
        else:
            contents[col] = msgs[-1]["content"]
    if "chosen" in contents and contents.get("chosen") == contents.get("rejected"):
        problems.append(("rejected", "chosen identical to rejected"))
    return problems


# ---------------------------------------------------------------- running checks over rows

def json_safe(value: Any) -> Any:
    """A JSON-writable copy of a raw row (NaN/inf written as strings, numpy scalars as Python)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return json_safe(value.tolist())
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def default_rejects_path(dataset: str, split: str) -> Path:
    """``$JUDGETRAIN_CACHE/rejects/<dataset>-<split>.jsonl`` (default cache ~/.cache/judgetrain)."""
    from judgetrain.utils.files import cache_root

    return cache_root() / "rejects" / f"{dataset}-{split}.jsonl"


def write_rejects(path: str | os.PathLike, records: Iterable[dict]) -> Path:
    """Write the rejects jsonl through a temporary file and a rename (a reader never sees half a file). In a
    multi-process launch every process validates the same rows; only global rank 0 writes."""
    path = Path(path)
    if not is_global_main_process():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lines(path, (json.dumps(json_safe(rec), ensure_ascii=False) for rec in records))
    return path


def is_global_main_process() -> bool:
    """Rank 0 of a torchrun / accelerate launch (RANK is set by the launcher), or a process that was not launched."""
    return int(os.environ.get("RANK", "0") or 0) == 0


@dataclass
class Verdict:
    """Outcome of validating one table: indices of good rows and the problems of the bad ones."""

    good: list[int]
    problems: list[RowProblem]
    n_rows: int

    @property
    def bad_rows(self) -> list[int]:
        return sorted({p.row for p in self.problems if p.row is not None})


def validate_rows(
    rows: Iterable[Any],
    check: Callable[[Any], list[tuple[str, str]]],
    *,
    source: str,
    split: str,
) -> tuple[Verdict, dict[int, Any]]:
    """Run ``check`` on every row. Returns the verdict and the raw bad rows by index (for the rejects file)."""
    good, problems, bad_raw = [], [], {}
    n = 0
    for i, row in enumerate(rows):
        n += 1
        if isinstance(row, dict) and MALFORMED in row:
            found = [("<line>", row[MALFORMED])]
        elif not isinstance(row, dict):
            found = [("<row>", f"wrong type: expected a JSON object, got {type(row).__name__}")]
        else:
            found = check(row)
        if found:
            problems.extend(RowProblem(source, split, i, f, p) for f, p in found)
            bad_raw[i] = row
        else:
            good.append(i)
    return Verdict(good, problems, n), bad_raw


class Rejects:
    """Collects bad rows of one adapter call and applies the on_bad_row policy once all sources are checked."""

    def __init__(self, dataset: str, split: str, on_bad_row: str = "error", rejects_path: str | os.PathLike | None = None):
        if on_bad_row not in ON_BAD_ROW:
            raise ValueError(f"on_bad_row must be one of {ON_BAD_ROW}, got {on_bad_row!r}")
        self.dataset, self.split, self.on_bad_row = dataset, split, on_bad_row
        self.rejects_path = rejects_path
        self.problems: list[RowProblem] = []
        self.records: list[dict] = []
        self.n_rows = 0
        self.n_bad = 0

    def add(self, verdict: Verdict, bad_raw: dict[int, Any]) -> None:
        self.n_rows += verdict.n_rows
        self.problems.extend(verdict.problems)
        self.n_bad += len(bad_raw)
        by_row: dict[int, list[RowProblem]] = {}
        for p in verdict.problems:
            by_row.setdefault(p.row, []).append(p)
        for i, raw in bad_raw.items():
            ps = by_row[i]
            self.records.append({
                "source": ps[0].source, "split": ps[0].split, "row": i,
                "field": ps[0].field, "reason": ps[0].problem,
                "problems": [{"field": p.field, "problem": p.problem} for p in ps],
                "data": raw,
            })

    def add_problem(self, problem: RowProblem, raw: Any = None, n_rows: int = 1) -> None:
        """A problem not tied to a checked row (a line that is not JSON, a row-level duplicate)."""
        self.n_rows += n_rows
        self.n_bad += 1
        self.problems.append(problem)
        self.records.append({"source": problem.source, "split": problem.split, "row": problem.row,
                             "field": problem.field, "reason": problem.problem,
                             "problems": [{"field": problem.field, "problem": problem.problem}], "data": raw})

    def finish(self) -> Path | None:
        """Raise (error mode) or write the rejects file and log counts (skip mode). Returns the rejects path."""
        if not self.problems:
            return None
        if self.on_bad_row == "error":
            raise DataValidationError(self.problems, self.n_bad, self.n_rows)
        path = write_rejects(self.rejects_path or default_rejects_path(self.dataset, self.split), self.records)
        counts = Counter(f"{r['field']}: {_reason_key(r['reason'])}" for r in self.records)
        logger.warning(
            "%s/%s: skipped %d of %d rows as bad; written with reasons to %s; by reason: %s",
            self.dataset, self.split, self.n_bad, self.n_rows, path,
            ", ".join(f"{k} x{v}" for k, v in counts.most_common()),
        )
        return path
