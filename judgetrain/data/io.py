"""Resolve a data source to raw rows: a hub id, a local parquet / jsonl / json file, a directory of them, or
"bundled" (the sample packaged in judgetrain/data/samples/).

Rows come back unvalidated, one :class:`Table` per file (so that errors can name the file and the row index in
it). A jsonl line that is not JSON becomes a placeholder row that the validator reports as malformed.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .validate import MALFORMED, DataValidationError, RowProblem

logger = logging.getLogger(__name__)

SAMPLES_DIR = Path(__file__).parent / "samples"
SAMPLE_NAMES = ("judgebias", "ideation", "rmbench", "panel")
DATA_EXTS = (".parquet", ".jsonl", ".json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def sample_source(name: str) -> str:
    """Path (str) of a bundled sample directory: judgebias, ideation, rmbench or panel."""
    if name not in SAMPLE_NAMES:
        raise ValueError(f"unknown bundled sample {name!r}; choose one of {SAMPLE_NAMES}")
    path = SAMPLES_DIR / name
    if not path.is_dir():
        raise FileNotFoundError(f"bundled sample {name!r} is not installed at {path}")
    return str(path)


@dataclass
class Table:
    """Raw rows of one file (a list of dicts, or a datasets.Dataset for parquet / hub data)."""

    source: str
    rows: Sequence[Any]
    domain_hint: str | None = None  # RM-Bench: domain taken from a per-domain file name


def is_hub_id(source: str) -> bool:
    return not Path(source).exists() and bool(_HUB_ID.match(source)) and not source.startswith((".", "/", "~"))


def resolve_local(source: str | os.PathLike, dataset: str) -> Path | None:
    """The local path a source means, or None when it is a hub id. Raises FileNotFoundError for a missing path."""
    source = str(source)
    if source == "bundled":
        return Path(sample_source(dataset))
    path = Path(source).expanduser()
    if path.exists():
        return path
    if is_hub_id(source):
        return None
    raise FileNotFoundError(f"data source {source!r} is neither an existing file/directory nor a hub id (owner/name)")


def data_files(directory: Path) -> list[Path]:
    """All parquet / jsonl / json files below ``directory`` (sorted; README and hidden files ignored)."""
    return sorted(p for p in directory.rglob("*")
                  if p.is_file() and p.suffix in DATA_EXTS
                  # hidden below the folder itself (a source may well be ../data)
                  and not any(part.startswith(".") for part in p.relative_to(directory).parts))


def split_files(directory: Path, split: str) -> list[Path]:
    """Files of one split in a directory: ``<split>.parquet``, ``<split>-00000-of-00001.parquet``, ``<split>/*``."""
    files = data_files(directory)
    chosen = [p for p in files
              if p.stem == split or re.match(rf"^{re.escape(split)}[-_.]", p.name) or split in p.relative_to(directory).parts[:-1]]
    if not chosen:
        names = ", ".join(str(p.relative_to(directory)) for p in files) or "none"
        raise FileNotFoundError(f"no files for split {split!r} in {directory} (data files there: {names})")
    return chosen


def read_file(path: Path) -> Table:
    """Read one file into a Table. json: a JSON array of objects (or JSON lines); jsonl: one object per line."""
    if path.suffix == ".parquet":
        import datasets

        return Table(str(path), datasets.Dataset.from_parquet(str(path)))
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataValidationError([RowProblem(str(path), "-", None, "<file>",
                                                  f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")],
                                      n_bad_rows=1) from exc
        return Table(str(path), rows)
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            rows.append({MALFORMED: f"malformed JSON: {exc.msg} at char {exc.pos}", "line": line})
    return Table(str(path), rows)


def load_hub(repo_id: str, split: str, **kwargs) -> Table:
    import datasets

    logger.info("loading %s split %s from the Hugging Face hub", repo_id, split)
    return Table(f"hub:{repo_id}", datasets.load_dataset(repo_id, split=split, **kwargs))


def read_split(source: str | os.PathLike, dataset: str, split: str, **hub_kwargs) -> list[Table]:
    """Tables of one split: a hub split, a single file (taken as that split), or the split's files in a directory."""
    path = resolve_local(source, dataset)
    if path is None:
        return [load_hub(str(source), split, **hub_kwargs)]
    if path.is_file():
        return [read_file(path)]
    return [read_file(p) for p in split_files(path, split)]


def build_dataset(tables: Sequence[Table], goods: Sequence[Sequence[int]], normalise, features):
    """A datasets.Dataset of ``normalise(row)`` for the good rows of each table, cast to ``features``.

    Parquet / hub tables stay Arrow-backed (``select`` + ``map``); Python lists go through ``from_list``.
    """
    import datasets

    parts = []
    for table, good in zip(tables, goods):
        if isinstance(table.rows, datasets.Dataset):
            ds = table.rows.select(list(good)) if len(good) != len(table.rows) else table.rows
            parts.append(ds.map(lambda r: normalise(r, table), remove_columns=ds.column_names, features=features,
                                desc=f"normalising {Path(table.source).name}"))
        else:
            rows = [normalise(table.rows[i], table) for i in good]
            parts.append(datasets.Dataset.from_list(rows, features=features) if rows else _empty(features))
    if not parts:
        return _empty(features)
    return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]


def _empty(features):
    """A 0-row dataset with the adapter's columns (``Dataset.from_list([])`` fails with 'Keys mismatch' when every
    row of a source was rejected)."""
    import datasets

    return datasets.Dataset.from_dict({name: [] for name in features}, features=features)


def message_feature():
    """Arrow type of a TRL conversational column: a list of {role, content}."""
    import datasets

    return datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})
