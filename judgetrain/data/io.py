"""Resolve a data source to raw rows: a hub id, a local parquet / jsonl / json file, a directory of them, or
"bundled" (the sample packaged in judgetrain/data/samples/).

Rows come back unvalidated, one :class:`Table` per file (so that errors can name the file and the row index in
it). A jsonl line that is not JSON becomes a placeholder row that the validator reports as malformed.
"""

# Late imports: datasets, gzip, pyarrow, judgetrain.compat (inside the functions that use them): `judgetrain data
# check` and `pairs build` read rows without a model: tokenizer and training libraries come in with the functions that
# need them.

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from judgetrain.utils.errors import MissingFileError
from judgetrain.utils.files import cache_root, utf8_problem
from judgetrain.utils.hub import hub_offline, is_hub_id, is_url

from .validate import JSON_ERRORS, MALFORMED, DataValidationError, RowProblem, json_problem

logger = logging.getLogger(__name__)

SAMPLES_DIR = Path(__file__).parent / "samples"
SAMPLE_NAMES = ("judgebias", "ideation", "rmbench", "panel")
DATA_EXTS = (".parquet", ".jsonl", ".json")


def sample_source(name: str) -> str:
    """Path (str) of a bundled sample directory: judgebias, ideation, rmbench or panel."""
    if name not in SAMPLE_NAMES:
        raise ValueError(f"unknown bundled sample {name!r}; choose one of {SAMPLE_NAMES}")
    path = SAMPLES_DIR / name
    if not path.is_dir():
        raise MissingFileError(f"bundled sample {name!r} is not installed at {path}")
    return str(path)


@dataclass
class Table:
    """Raw rows of one file (a list of dicts, or a datasets.Dataset for parquet / hub data)."""

    source: str
    rows: Sequence[Any]
    domain_hint: str | None = None  # RM-Bench: domain taken from a per-domain file name


def resolve_local(source: str | os.PathLike, dataset: str) -> Path | None:
    """The local path a source means (an http(s) URL: its file downloaded once, `fetch_url`), or None when it is a hub
    id. Raises MissingFileError (a FileNotFoundError) for a missing path."""
    source = str(source)
    if source == "bundled":
        return Path(sample_source(dataset))
    if is_url(source):
        return fetch_url(source)
    path = Path(source).expanduser()
    if path.exists():
        return path
    if is_hub_id(source):
        return None
    raise MissingFileError(f"data source {source!r} is neither an existing file/directory nor a hub id (owner/name)")


def fetch_url(url: str, *, timeout: float = 60.0) -> Path:
    """The file ``url`` names, downloaded once into ``$JUDGETRAIN_CACHE/downloads/<first 16 hex digits of the URL's
    SHA-256>/<its file name>`` (through a temporary file and a rename) and read from there on: name a fixed version
    (a commit's raw URL, not a branch's). Raises ConnectionError when it cannot be fetched (no connection, a server
    error, or the hub offline: ``HF_HUB_OFFLINE`` keeps judgetrain off the network for URLs too) and MissingFileError
    when the server answers that there is no such file."""
    name = Path(urllib.parse.urlparse(url).path).name or "download"
    path = cache_root() / "downloads" / hashlib.sha256(url.encode("utf-8")).hexdigest()[:16] / name
    if path.is_file():
        return path
    if hub_offline():
        raise ConnectionError(f"data source {url}: not downloaded yet, and the network is off (HF_HUB_OFFLINE)")
    logger.info("downloading %s into %s", url, path.parent)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise ConnectionError(f"data source {url}: the server failed (HTTP {exc.code})") from exc
        raise MissingFileError(f"data source {url}: HTTP {exc.code} {exc.reason} (check the URL: a raw file at a "
                               "commit)") from None
    except (urllib.error.URLError, TimeoutError) as exc:
        raise ConnectionError(f"data source {url}: unreachable ({getattr(exc, 'reason', exc)})") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{name}.{os.getpid()}.part")
    part.write_bytes(data)
    os.replace(part, path)
    return path


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
        raise MissingFileError(f"no files for split {split!r} in {directory} (data files there: {names})")
    return chosen


class UnreadableFile(DataValidationError):
    """A data file that cannot be read at all (not UTF-8, not JSON, a torn parquet file): one line naming the file.

    A subclass of DataValidationError, so every caller that reports bad data reports it; with ``on_bad_row: skip``
    the adapters skip the file and write it to the rejects file instead."""

    def __init__(self, path: str | os.PathLike, reason: str, split: str = "-"):
        problem = RowProblem(str(path), split, None, "<file>", reason)
        ValueError.__init__(self, f"{path}: unreadable: {reason}")
        self.problems, self.n_bad_rows, self.n_rows = [problem], 1, None
        self.source, self.split, self.row, self.field, self.problem = str(path), split, None, "<file>", reason


def _decode(data: bytes, path: Path, line: int | None = None) -> str:
    """UTF-8 text of ``data``; UnreadableFile naming the line and column of the first bad byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(path, utf8_problem(data, exc, line)) from None


def read_file(path: Path) -> Table:
    """Read one file into a Table. json: a JSON array of objects (or JSON lines); jsonl: one object per line.

    A file that cannot be read at all raises UnreadableFile; a jsonl line that is not UTF-8 or not JSON becomes a
    placeholder row the validator reports (with its line number), so ``on_bad_row: skip`` can drop just that line.
    JSON lines (plain or gzip) are read a line at a time: what stays in memory is the parsed rows, not the file's
    bytes and its lines as well."""
    path = Path(path)
    if path.suffix == ".parquet":
        return Table(str(path), _read_parquet(path))
    suffix = Path(path.stem).suffix if path.suffix == ".gz" else path.suffix  # evaluations.jsonl.gz
    if suffix == ".json" and _opening(path).lstrip().startswith(b"["):
        data = _whole(path).removeprefix(b"\xef\xbb\xbf")
        try:
            rows = json.loads(_decode(data, path))
        except JSON_ERRORS as exc:
            raise UnreadableFile(path, json_problem(exc)) from None
        return Table(str(path), rows)
    if path.stat().st_size >= STREAM_BYTES:
        return Table(str(path), JsonLines(path))
    return Table(str(path), list(JsonLines.parse(path)))


STREAM_BYTES = 32 * 2**20  # JSON-lines files from this size on stream through the datasets cache (`JsonLines`)


class JsonLines(abc.Sequence):
    """The rows of a JSON-lines file (plain or gzip) of `STREAM_BYTES` or more, parsed as they are read (a smaller
    file's rows are parsed into a list: what the cache would save is less than it costs).

    The file is streamed once, a line at a time, into an Arrow file of the datasets cache (each non-blank line's
    number and text; a line that is not UTF-8 keeps its problem), under a fingerprint of the file's path, size and
    modification time: a later read of the same file opens that Arrow file. Rows are parsed when iterated or
    indexed, so memory does not grow with the file. A line that is not JSON reads as a placeholder row naming its
    line (`MALFORMED`), which the validator reports."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lines = _lines_dataset(self.path)

    @staticmethod
    def parse(path: Path):
        """The rows of a small file, parsed straight from its lines (no cache file: for files under STREAM_BYTES)."""
        for row in _jsonl_lines(str(path), ""):
            yield _json_row(row["line"], row["text"], row["problem"])

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        row = self.lines[i]
        return _json_row(row["line"], row["text"], row["problem"])

    def __iter__(self):
        for batch in self.lines.iter(batch_size=1000):
            yield from map(_json_row, batch["line"], batch["text"], batch["problem"])

    def to_list(self) -> list:
        return list(self)


def _json_row(lineno: int, text: str, problem: str | None):
    if problem is not None:
        return {MALFORMED: problem, "line": text}
    try:
        return json.loads(text)
    except JSON_ERRORS as exc:
        return {MALFORMED: json_problem(exc, lineno), "line": text}


def _jsonl_lines(path: str, stamp: str):
    """Each non-blank line of ``path``: its number, its text and, for a line that is not UTF-8, the problem."""
    del stamp  # the file version, part of the cache fingerprint only
    path = Path(path)
    for lineno, raw in _lines(path):
        if not raw.strip():
            continue
        try:
            yield {"line": lineno, "text": _decode(raw, path, lineno), "problem": None}
        except UnreadableFile as exc:
            yield {"line": lineno, "text": raw.decode("utf-8", "replace"), "problem": exc.problem}


def _lines_dataset(path: Path):
    """The file's lines as an Arrow-backed datasets.Dataset (see `JsonLines`)."""

    import datasets
    from datasets.exceptions import DatasetGenerationError

    features = datasets.Features({"line": datasets.Value("int64"), "text": datasets.Value("string"),
                                  "problem": datasets.Value("string")})
    st = path.stat()
    stamp = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|jsonl-lines-1"
    fingerprint = hashlib.sha256(stamp.encode("utf-8")).hexdigest()[:32]
    try:
        return datasets.Dataset.from_generator(_jsonl_lines, features=features, fingerprint=fingerprint,
                                               gen_kwargs={"path": str(path), "stamp": stamp})
    except DatasetGenerationError as exc:
        if isinstance(exc.__cause__, UnreadableFile):
            raise exc.__cause__ from None
        raise
    except ValueError as exc:
        if "corresponds to no data" not in str(exc):
            raise
        return datasets.Dataset.from_dict({name: [] for name in features}, features=features)  # no non-blank line


@contextlib.contextmanager
def _reading(path: Path):
    """The file opened for bytes (gzip decompressed); a gzip file that cannot be read, at any point of the reading,
    raises UnreadableFile naming it."""
    import gzip

    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            yield f
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError; a torn file ends in EOFError
        if path.suffix != ".gz":
            raise
        raise UnreadableFile(path, f"not a readable gzip file: {exc or type(exc).__name__}") from None


def _opening(path: Path) -> bytes:
    """The first 64 KiB of the (decompressed) file, a UTF-8 byte order mark removed."""
    with _reading(path) as f:
        return f.read(65536).removeprefix(b"\xef\xbb\xbf")


def _whole(path: Path) -> bytes:
    with _reading(path) as f:
        return f.read()


def _lines(path: Path):
    """(line number, bytes) of each line, without its line end; split on b"\\n" only (U+2028 inside a JSON string
    is not a line end); a UTF-8 byte order mark at the start is not content."""
    with _reading(path) as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            yield lineno, raw.removesuffix(b"\n").removesuffix(b"\r")


def _read_parquet(path: Path):
    """The parquet file as a datasets.Dataset; UnreadableFile for a torn or corrupt file (any reader failure)."""
    import datasets

    try:
        import pyarrow.parquet as pq

        pq.read_metadata(str(path))  # a torn file has no footer: fail here, before datasets logs a traceback
        return datasets.Dataset.from_parquet(str(path))
    except Exception as exc:  # noqa: BLE001 - pyarrow / datasets raise many types; each means "unreadable"
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnreadableFile(path, f"not a readable parquet file: {type(exc).__name__}: {cause}") from None


def load_hub(repo_id: str, split: str, revision: str | None = None, **kwargs) -> Table:
    import datasets

    if revision:
        kwargs["revision"] = revision
    logger.info("loading %s split %s from the Hugging Face hub%s", repo_id, split, f" at {revision}" if revision else
                " (no revision pinned: an upstream commit changes the rows)")
    return Table(f"hub:{repo_id}", datasets.load_dataset(repo_id, split=split, **kwargs))


def read_split(source: str | os.PathLike, dataset: str, split: str, rejects=None, **hub_kwargs) -> list[Table]:
    """Tables of one split: a hub split, a single file (taken as that split), or the split's files in a directory.

    An unreadable file raises UnreadableFile, or, when ``rejects`` (a validate.Rejects) skips bad rows, is
    recorded there and left out."""
    path = resolve_local(source, dataset)
    if path is None:
        return [load_hub(str(source), split, **hub_kwargs)]
    files = [path] if path.is_file() else split_files(path, split)
    return [t for t in (read_or_reject(p, rejects, split) for p in files) if t is not None]


def read_or_reject(path: Path, rejects=None, split: str = "-") -> Table | None:
    """read_file, except that an unreadable file goes to ``rejects`` (None returned) when it skips bad rows."""
    try:
        return read_file(path)
    except UnreadableFile as exc:
        if rejects is None or rejects.on_bad_row != "skip":
            raise UnreadableFile(path, exc.problem, split) from None
        logger.warning("%s: skipped the whole file: %s", path, exc.problem)
        rejects.add_problem(RowProblem(str(path), split, None, "<file>", exc.problem), n_rows=0)
        return None


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
        elif isinstance(table.rows, JsonLines) and good:
            parts.append(_normalised_lines(table, list(good), normalise, features))
        else:
            rows = [normalise(table.rows[i], table) for i in good]
            parts.append(datasets.Dataset.from_list(rows, features=features) if rows else _empty(features))
    if not parts:
        return _empty(features)
    return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]


def _normalised_lines(table: Table, good: list[int], normalise, features):
    """``normalise(row)`` of a JSON-lines table's good rows, streamed into the datasets cache (memory does not grow
    with the file), under a fingerprint of the file's lines, the rows kept and the normaliser."""
    import datasets
    from datasets.fingerprint import Hasher

    from judgetrain.compat.datasets import dataset_fingerprint

    def rows(indices):
        for i in indices:
            yield normalise(table.rows[i], table)

    fingerprint = Hasher.hash([dataset_fingerprint(table.rows.lines), good, normalise, features.to_dict()])
    return datasets.Dataset.from_generator(rows, features=features, fingerprint=fingerprint,
                                           gen_kwargs={"indices": good})


def _empty(features):
    """A 0-row dataset with the adapter's columns (``Dataset.from_list([])`` fails with 'Keys mismatch' when every
    row of a source was rejected)."""
    import datasets

    return datasets.Dataset.from_dict({name: [] for name in features}, features=features)


def message_feature():
    """Arrow type of a TRL conversational column: a list of {role, content}."""
    import datasets

    return datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})
