"""Pairwise sources (evaluation only): a prompt, two responses, which one is better, and the verdict prompt that shows
them to a judge in both orders.

    from judgetrain.data.pairwise import load_evalbiasbench, load_judgebench, load_pairwise, both_orders
    ds = load_judgebench("data/judgebench")             # 620 rows: id, prompt, response_a, response_b, label, ...
    ds = load_pairwise("my_pairs.parquet", columns={"prompt": "question", "label": "winner"})
    for order, messages in both_orders(ds[0]):          # ("AB", [system, user]), ("BA", the responses swapped)
        ...

Every source becomes the same rows (`features`): ``id``, ``prompt``, ``response_a``, ``response_b``, ``label``
("A>B" or "B>A": the better response in the source's order), ``category`` (EvalBiasBench: the bias; a user's own
pairs: the optional category column, else None), ``source`` (JudgeBench's source string, e.g. ``mmlu-pro-law``: its
paper's four categories are part of its scoring rule, `judgetrain.metrics.judgebench_category`), ``subset``
(JudgeBench: the response model) and ``sample_id`` (a team's own pairs: the optional source sample a pair was made
from, as `judgetrain perturb`'s items name it; the pairs of one sample are one unit of the suite's statistics).

- ``evalbiasbench`` (OffsetBias): ``biasbench.json``, one JSON object {bias: [rows]}; each row ``bias``,
  ``instruction``, ``response1``, ``response2``, ``label`` (1 or 2). A row is named by its bias list and its index in
  it (``biasbench.json#length bias row 3``). Every label in the published file is 1: only the two presentations
  keep the benchmark from measuring the judge's position bias.
- ``judgebench`` (ScalerLab): one JSON line per pair, ``pair_id``, ``source``, ``question``, ``response_model``,
  ``response_A``, ``response_B``, ``label`` ("A>B" / "B>A"); a folder of its files, or the hub dataset (splits ``gpt``
  and ``claude``). One published row (claude, ``livecodebench``) shows the same text twice: it is kept, as the
  benchmark has it, and counted in a warning.
- ``pairwise``: a team's own held-out pairs in any JSONL / JSON / parquet file, folder or hub dataset, with the
  columns named by ``columns`` (our field -> the source's column). A label may be written "A>B", "B>A", "A", "B",
  1, 2, "response_a", "model_b" and the like. A pair whose two responses are the same text is a bad row.

Bad rows are named by file, row and field before anything else happens; ``on_bad_row="skip"`` drops them into a
rejects file and counts them (`judgetrain.data.validate`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from .ideation import preference_letter
from .io import Table, UnreadableFile, build_dataset, data_files, load_hub, read_or_reject, resolve_local, split_files
from .sampling import balanced_sample
from .validate import JSON_ERRORS, DataValidationError, Rejects, RowProblem, check_text, json_problem, validate_rows

logger = logging.getLogger(__name__)

SPLIT = "test"  # label used in messages; the pairwise benchmarks have one split
LABELS = ("A>B", "B>A")
FIELDS = ("id", "prompt", "response_a", "response_b", "label", "category", "source", "subset", "sample_id")
REQUIRED = ("prompt", "response_a", "response_b", "label")

JUDGEBENCH_HUB_ID = "ScalerLab/JudgeBench"
JUDGEBENCH_HUB_SPLITS = ("gpt", "claude")
EVALBIASBENCH_FILE = "biasbench.json"


@dataclass(frozen=True)
class PairwiseFormat:
    """How one kind of source names its fields: ``columns`` maps each of `FIELDS` to the source's column (a field
    absent from it is not read); ``duplicates``: "reject" a pair that shows the same text twice, or "keep" it;
    ``also_required``: fields beyond `REQUIRED` every row holds; ``category_from_list``: a row without a category
    takes the name of the list it is in (a file of {category: [rows]}), and one in no list must have its own."""

    name: str
    columns: Mapping[str, str]
    duplicates: str = "reject"
    also_required: tuple[str, ...] = ()
    category_from_list: bool = False


PAIRWISE = PairwiseFormat("pairwise", {f: f for f in FIELDS if f != "source"})
EVALBIASBENCH = PairwiseFormat("evalbiasbench", {"prompt": "instruction", "response_a": "response1",
                                                 "response_b": "response2", "label": "label", "category": "bias"},
                               category_from_list=True)
JUDGEBENCH = PairwiseFormat("judgebench", {"id": "pair_id", "prompt": "question", "response_a": "response_A",
                                           "response_b": "response_B", "label": "label", "source": "source",
                                           "subset": "response_model"}, duplicates="keep", also_required=("source",))


def features() -> datasets.Features:
    return datasets.Features({f: datasets.Value("string") for f in FIELDS})


def parse_label(value: Any) -> str | None:
    """"A>B" or "B>A" from the spellings of "which response is better": "A>B", "B>A", "A", "b", 1, 2, "1",
    "response_a", "model_b", ...; None for anything else (a tie is not a label)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.strip() in ("1", "2")):
        return {1: "A>B", 2: "B>A"}.get(int(value))
    if isinstance(value, str):
        compact = value.replace(" ", "").upper()
        if compact in LABELS:
            return compact
        if compact in ("B<A", "A<B"):
            return "A>B" if compact == "B<A" else "B>A"
    letter = preference_letter(value)
    return None if letter is None else ("A>B" if letter == "A" else "B>A")


# --------------------------------------------------------------------------------------------------- loaders
def load_pairwise(source: str | os.PathLike, *, columns: Mapping[str, str] | None = None, split: str | None = None,
                  max_rows: int | None = None, seed: int = 0, on_bad_row: str = "error",
                  rejects_path: str | os.PathLike | None = None, revision: str | None = None) -> datasets.Dataset:
    """A team's own pairs (see the module docstring): a JSONL / JSON / parquet file, a folder of them (``split``: only
    that split's files), or a hub dataset (``split``, default "test"). ``columns`` maps our fields (`FIELDS`) to the
    source's columns where their names differ, e.g. ``{"prompt": "question", "label": "winner"}``."""
    fmt = PAIRWISE
    if columns:
        unknown = sorted(set(columns) - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown pairwise field(s) {unknown} in columns; the fields are {list(FIELDS)}")
        fmt = PairwiseFormat("pairwise", {**PAIRWISE.columns, **columns})
    path = resolve_local(source, "pairwise")
    rejects = Rejects("pairwise", split or SPLIT, on_bad_row, rejects_path)
    if path is None:
        tables = [load_hub(str(source), split or SPLIT, revision=revision)]
    else:
        files = [path] if path.is_file() else (data_files(path) if split is None else split_files(path, split))
        tables = [t for t in (read_or_reject(p, rejects, split or SPLIT) for p in files) if t is not None]
    return _load(fmt, tables, rejects, str(source), max_rows, seed)


def load_evalbiasbench(source: str | os.PathLike, *, max_rows: int | None = None, seed: int = 0,
                       on_bad_row: str = "error", rejects_path: str | os.PathLike | None = None,
                       revision: str | None = None) -> datasets.Dataset:
    """OffsetBias's EvalBiasBench (80 pairs, 6 biases): ``biasbench.json`` or the folder holding it (its rows may also
    come as a list, JSON lines or parquet with the same fields), or a hub dataset of those rows (split "test")."""
    path = resolve_local(source, "evalbiasbench")
    rejects = Rejects("evalbiasbench", SPLIT, on_bad_row, rejects_path)
    if path is None:
        tables = [load_hub(str(source), SPLIT, revision=revision)]
    else:
        files = [path] if path.is_file() else ([path / EVALBIASBENCH_FILE] if (path / EVALBIASBENCH_FILE).is_file()
                                               else data_files(path))
        tables = [t for p in files for t in _bias_tables(p, rejects)]
    return _load(EVALBIASBENCH, tables, rejects, str(source), max_rows, seed)


def load_judgebench(source: str | os.PathLike = JUDGEBENCH_HUB_ID, *, splits: tuple[str, ...] = JUDGEBENCH_HUB_SPLITS,
                    max_rows: int | None = None, seed: int = 0, on_bad_row: str = "error",
                    rejects_path: str | os.PathLike | None = None, revision: str | None = None) -> datasets.Dataset:
    """JudgeBench (350 GPT-4o and 270 Claude-3.5-Sonnet pairs): a file, the folder of its JSON-lines files, or the hub
    dataset (``splits`` of it: gpt, claude). ``max_rows`` draws evenly over the ``source`` values."""
    path = resolve_local(source, "judgebench")
    rejects = Rejects("judgebench", SPLIT, on_bad_row, rejects_path)
    if path is None:
        tables = [load_hub(str(source), s, revision=revision) for s in splits]
    else:
        files = [path] if path.is_file() else data_files(path)
        tables = [t for t in (read_or_reject(p, rejects, SPLIT) for p in files) if t is not None]
    return _load(JUDGEBENCH, tables, rejects, str(source), max_rows, seed)


# ------------------------------------------------------------------------------------------------ the rows
def _load(fmt: PairwiseFormat, tables: list[Table], rejects: Rejects, source: str, max_rows: int | None,
          seed: int) -> datasets.Dataset:
    """Every row checked (bad rows raised or rejected), then normalised to `features`, then the cap."""
    goods, seen, same = [], {}, []
    for table in tables:
        absent = _missing_columns(fmt, table)
        if absent:
            raise DataValidationError([RowProblem(table.source, SPLIT, None, field, f"missing column {column!r} (name "
                                                  f"the source's column with columns={{{field!r}: ...}})")
                                       for field, column in absent], len(table.rows), len(table.rows))
        verdict, bad = validate_rows(table.rows, _check(fmt, table), source=table.source, split=SPLIT)
        for i in list(verdict.good):  # ids unique over the whole source
            rid = _row_id(fmt, table.rows[i], table, i)
            if rid in seen:
                verdict.good.remove(i)
                verdict.problems.append(RowProblem(table.source, SPLIT, i, "id", f"duplicate id: {rid!r} (first at "
                                                                                 f"{seen[rid]})"))
                bad[i] = table.rows[i]
            else:
                seen[rid] = f"{table.source} row {i}"
                row = table.rows[i]
                if row[fmt.columns["response_a"]] == row[fmt.columns["response_b"]]:
                    same.append(f"{table.source} row {i}")
        rejects.add(verdict, bad)
        goods.append(verdict.good)
    rejects.finish()
    if same:
        logger.warning("%s: %d pair(s) show the same text as both responses, kept as the benchmark has them (a "
                       "verdict can be right on them only by chance): %s", fmt.name, len(same),
                       ", ".join(same[:5]))
    ds = build_dataset(tables, goods, lambda row, table: _normalise(fmt, row, table), features())
    ds = ds.remove_columns("id").add_column("id", list(seen)).select_columns(list(FIELDS))  # good rows, in order
    if not len(ds):
        raise DataValidationError([RowProblem(source, SPLIT, None, "<file>", "no pairs in the source")], 0, 0)
    if max_rows is not None and max_rows < len(ds):
        ds = ds.select(balanced_sample([c or s for c, s in zip(ds["category"], ds["source"])], max_rows, seed))
    return ds


def _check(fmt: PairwiseFormat, table: Table):
    cols = fmt.columns

    def check_row(row: dict) -> list[tuple[str, str]]:
        problems = []
        for field in ("prompt", "response_a", "response_b"):
            if err := check_text(row.get(cols[field])):
                problems.append((cols[field], err))
        label = row.get(cols["label"])
        if label is None:
            problems.append((cols["label"], "missing value"))
        elif parse_label(label) is None:
            problems.append((cols["label"], f"unknown label: {label!r}, expected which response is better: A>B or "
                                            "B>A (A, B, 1, 2)"))
        for field in ("id", "category", "source", "subset", "sample_id"):
            value = row.get(cols[field]) if field in cols else None
            if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))
                                      or not str(value).strip()):
                problems.append((cols[field], f"wrong type: expected a non-empty string, got {value!r}"))
        for field in fmt.also_required:
            if row.get(cols[field]) is None:
                problems.append((cols[field], "missing value"))
        if fmt.category_from_list and row.get(cols["category"]) is None and table.domain_hint is None:
            problems.append((cols["category"], "missing value"))
        if fmt.duplicates == "reject" and not problems and row[cols["response_a"]] == row[cols["response_b"]]:
            problems.append((cols["response_b"], f"the same text as {cols['response_a']}: no response is better"))
        return problems

    return check_row


def _row_id(fmt: PairwiseFormat, row: dict, table: Table, index: int) -> str:
    value = row.get(fmt.columns["id"]) if "id" in fmt.columns else None
    if value is not None:
        return str(value)
    where = table.source if table.source.startswith("hub:") else Path(table.source.split("#")[0]).name
    return f"{where}#{table.domain_hint}/{index}" if table.domain_hint else f"{where}/{index}"


def _normalise(fmt: PairwiseFormat, row: dict, table: Table) -> dict:
    cols = fmt.columns

    def text(field: str) -> str | None:
        value = row.get(cols[field]) if field in cols else None
        return None if value is None else str(value)

    out = {f: text(f) for f in FIELDS}  # the id is set by _load (a row without one is named by its place)
    out["label"] = parse_label(row[cols["label"]])
    if fmt.category_from_list and out["category"] is None:
        out["category"] = table.domain_hint
    return out


def _missing_columns(fmt: PairwiseFormat, table: Table) -> list[tuple[str, str]]:
    """(field, column) of the required columns no row of the table has."""
    wanted = [(f, fmt.columns[f]) for f in REQUIRED + fmt.also_required]
    if isinstance(table.rows, datasets.Dataset):
        return [(f, c) for f, c in wanted if c not in table.rows.column_names]
    present = set().union(*(r.keys() for r in table.rows if isinstance(r, dict))) if len(table.rows) else set()
    return [(f, c) for f, c in wanted if c not in present] if present else []


def _bias_tables(path: Path, rejects: Rejects) -> list[Table]:
    """EvalBiasBench's file as one Table per bias list ({bias: [rows]}, named ``file#bias``), or the file's rows as
    they are (a list, JSON lines, parquet)."""
    if path.suffix != ".json" or not path.read_bytes()[:65536].lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        table = read_or_reject(path, rejects, SPLIT)
        return [] if table is None else [table]
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        return _unreadable(path, f"not UTF-8: {exc.reason} at byte {exc.start}", rejects)
    except JSON_ERRORS as exc:
        return _unreadable(path, json_problem(exc), rejects)
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        return _unreadable(path, "expected a JSON object {bias: [rows]} or a JSON array of rows", rejects)
    return [Table(f"{path}#{bias}", rows, domain_hint=str(bias)) for bias, rows in data.items()]


def _unreadable(path: Path, problem: str, rejects: Rejects) -> list[Table]:
    if rejects.on_bad_row != "skip":
        raise UnreadableFile(path, problem, SPLIT)
    logger.warning("%s: skipped the whole file: %s", path, problem)
    rejects.add_problem(RowProblem(str(path), SPLIT, None, "<file>", problem), n_rows=0)
    return []


# -------------------------------------------------------------------------------------------- verdict prompt
PAIRWISE_SYSTEM = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI assistants to the "
    "user question shown below. Choose the response that answers the question correctly and follows the user's "
    "instructions; do not let the order of the responses, their length or their style influence you. After a short "
    'explanation, output your final verdict strictly in this format: "[[A>B]]" if assistant A is better, "[[B>A]]" '
    'if assistant B is better, and "[[A=B]]" for a tie.'
)
PAIRWISE_USER = (
    "[User Question]\n{question}\n\n[The Start of Assistant A's Answer]\n{response_a}\n[The End of Assistant A's "
    "Answer]\n\n[The Start of Assistant B's Answer]\n{response_b}\n[The End of Assistant B's Answer]"
)
PLACEHOLDERS = ("question", "response_a", "response_b")
_PLACEHOLDER = re.compile(r"\{(question|response_a|response_b)\}")
ORDERS = ("AB", "BA")  # AB: response_a shown as A; BA: the two swapped, response_b shown as A


def check_template(user: str) -> None:
    """ValueError unless the user template holds each of {question}, {response_a} and {response_b} exactly once."""
    counts = {p: len(re.findall(r"\{" + p + r"\}", user)) for p in PLACEHOLDERS}
    wrong = [f"{{{p}}} x{n}" for p, n in counts.items() if n != 1]
    if wrong:
        raise ValueError(f"the pairwise prompt template must hold {{question}}, {{response_a}} and {{response_b}} "
                         f"once each; it has {', '.join(wrong)}")


def verdict_messages(question: str, response_a: str, response_b: str, *, system: str | None = PAIRWISE_SYSTEM,
                     user: str = PAIRWISE_USER) -> list[dict]:
    """The judge's chat messages for one presentation: ``system`` (left out when None or empty) and ``user`` with its
    placeholders filled in one pass (a response holding the text "{response_b}" stays as it is)."""
    values = {"question": question, "response_a": response_a, "response_b": response_b}
    content = _PLACEHOLDER.sub(lambda m: values[m.group(1)], user)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]


def both_orders(row: Mapping[str, Any], *, system: str | None = PAIRWISE_SYSTEM,
                user: str = PAIRWISE_USER) -> list[tuple[str, list[dict]]]:
    """[("AB", messages), ("BA", messages)] of one pairwise row: as stored, then with the two responses swapped. A
    verdict about the BA prompt names the row's B as "A": read it back with `judgetrain.metrics.swap_verdict`."""
    a, b = row["response_a"], row["response_b"]
    return [("AB", verdict_messages(row["prompt"], a, b, system=system, user=user)),
            ("BA", verdict_messages(row["prompt"], b, a, system=system, user=user))]
