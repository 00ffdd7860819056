"""Files that are not valid text or not valid data: each is one clear error naming the file (and line), never a
traceback, and ``on_bad_row: skip`` skips exactly what cannot be read (the line, or the whole file), with a record.

The shapes are the ones Python's readers raise on without naming anything: bytes that are not UTF-8
(UnicodeDecodeError), a JSON integer of over 4,300 digits (ValueError from int max str digits), 100,000-deep
bracket nesting (RecursionError) and a torn parquet / gzip file."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from judgetrain.data import DataValidationError, load_judgebias, load_rmbench
from judgetrain.data.io import UnreadableFile, read_file
from judgetrain.data.pairs import PanelDataError, read_evaluations

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "judgetrain" / "data" / "samples" / "judgebias" / "train.parquet"

BAD_LINES = {
    "not-utf8": (b'{"prompt": "caf\xe9 \xff"}', "not UTF-8 text: byte 0xe9 at line 3 column 16"),
    "huge-int": (b'{"sample_id": ' + b"9" * 5000 + b"}", "Exceeds the limit (4300 digits)"),
    "deep-nesting": (b"[" * 100_000 + b"]" * 100_000, "nested deeper than can be read (RecursionError)"),
}


@pytest.fixture(scope="module")
def good_lines() -> list[bytes]:
    rows = pq.read_table(SAMPLE).slice(0, 3).to_pylist()
    return [json.dumps(r, default=str).encode() for r in rows]


def _jsonl(tmp_path: Path, good: list[bytes], bad: bytes) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\n".join([good[0], good[1], bad, good[2]]) + b"\n")
    return path


@pytest.mark.parametrize("kind", list(BAD_LINES))
def test_a_bad_jsonl_line_names_file_row_and_line_and_is_skippable(kind, good_lines, tmp_path):
    bad, expected = BAD_LINES[kind]
    path = _jsonl(tmp_path, good_lines, bad)
    with pytest.raises(DataValidationError) as err:
        load_judgebias(str(path))
    first = str(err.value).splitlines()[0]
    assert str(path) in first and "row 2" in first and expected in first and "line 3" in first, first
    rejects = tmp_path / "rejects.jsonl"
    ds = load_judgebias(str(path), on_bad_row="skip", rejects_path=str(rejects))
    assert len(ds) == 3  # the three good rows, nothing else lost
    records = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert [(r["row"], r["field"]) for r in records] == [(2, "<line>")]
    assert expected in records[0]["reason"]


WHOLE_FILES = {
    "not-utf8.json": (b'[{"a": "\xff"}]', "unreadable: not UTF-8 text: byte 0xff at line 1 column 9"),
    "huge-int.json": (b'[{"a": ' + b"1" * 5000 + b"}]", "unreadable: malformed JSON: Exceeds the limit (4300 digits)"),
    "deep.json": (b"[" * 100_000 + b"]" * 100_000, "unreadable: malformed JSON: nested deeper than can be read"),
    "torn.parquet": (None, "unreadable: not a readable parquet file: ArrowInvalid: Parquet magic bytes not found"),
}


@pytest.mark.parametrize("name", list(WHOLE_FILES))
def test_an_unreadable_file_is_one_line_naming_it_and_skip_skips_the_file(name, tmp_path):
    data, expected = WHOLE_FILES[name]
    if data is None:
        whole = SAMPLE.read_bytes()
        data = whole[: len(whole) // 2]  # a copy interrupted half way
    folder = tmp_path / "jb"
    folder.mkdir()
    bad = folder / f"train-{name}"
    bad.write_bytes(data)
    (folder / "train-good.parquet").write_bytes(SAMPLE.read_bytes())
    with pytest.raises(UnreadableFile) as err:
        load_judgebias(str(folder))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{bad}: ") and expected in message, message
    assert err.value.split == "train"
    rejects = tmp_path / "rejects.jsonl"
    ds = load_judgebias(str(folder), on_bad_row="skip", rejects_path=str(rejects))
    assert len(ds) == pq.read_metadata(SAMPLE).num_rows  # the good file is read whole
    (record,) = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert (record["source"], record["row"], record["field"]) == (str(bad), None, "<file>")


def test_rmbench_skips_a_torn_domain_file_and_keeps_the_others(tmp_path):
    sample = REPO / "judgetrain" / "data" / "samples" / "rmbench"
    for p in sample.glob("*_filtered.json"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    torn = tmp_path / "code_filtered.json"
    torn.write_bytes(torn.read_bytes()[:1000])
    with pytest.raises(UnreadableFile, match=r"code_filtered.json: unreadable: malformed JSON"):
        load_rmbench(str(tmp_path))
    ds = load_rmbench(str(tmp_path), on_bad_row="skip", rejects_path=str(tmp_path / "rej.jsonl"))
    assert len(ds) > 0 and "code" not in set(ds["domain"])


def test_a_utf8_byte_order_mark_and_a_line_separator_inside_a_string_are_content_not_errors(good_lines, tmp_path):
    row = json.loads(good_lines[0])
    row["prompt"] = row["prompt"].replace("recipe", "recipe\u2028next", 1) if isinstance(row["prompt"], str) else row["prompt"]
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(row, ensure_ascii=False).encode() + b"\r\n" + good_lines[1] + b"\r\n")
    table = read_file(path)
    assert len(table.rows) == 2 and all("__malformed_json__" not in r for r in table.rows)
    assert table.rows[0]["prompt"] == row["prompt"]


@pytest.mark.parametrize("kind", ["not-utf8", "huge-int", "deep-nesting", "torn-gzip"])
def test_pairs_evaluations_file_errors_name_the_file_and_line(kind, tmp_path):
    ok = b'{"sample_id": 1}'
    if kind == "torn-gzip":
        path = tmp_path / "evaluations.jsonl.gz"
        path.write_bytes(gzip.compress(ok * 200)[:60])
        expected = "unreadable: not a readable gzip file"
    else:
        path = tmp_path / "evaluations.jsonl"
        path.write_bytes(ok + b"\n" + ok + b"\n" + BAD_LINES[kind][0] + b"\n")
        expected = BAD_LINES[kind][1]
    with pytest.raises(PanelDataError) as err:
        read_evaluations(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and expected in message, message


def test_train_with_a_torn_parquet_file_stops_with_one_line_naming_it(tmp_path):
    torn = tmp_path / "train.parquet"
    torn.write_bytes(SAMPLE.read_bytes()[:5000])
    recipe = tmp_path / "r.yaml"
    recipe.write_text((REPO / "recipes" / "quickstart.yaml").read_text().replace(
        "source: bundled, split: train}", f"source: {torn}, split: train}}"))
    p = subprocess.run([sys.executable, "-m", "judgetrain.train", str(recipe), "--output_dir", str(tmp_path / "run")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("judgetrain.train: UnreadableFile: ") and str(torn) in last and "parquet" in last, last
    assert "Traceback" not in p.stderr, p.stderr[-3000:]


@pytest.mark.parametrize("data, expected", [
    (b"learning_rate: 1e-4\nrun_name: caf\xe9\n", "not UTF-8 text: byte 0xe9 at line 2 column 14"),
    (b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "not valid YAML"),
])
def test_an_unreadable_recipe_is_one_line_naming_it(data, expected, tmp_path):
    from judgetrain.config.recipe import RecipeError, load_recipe_file

    path = tmp_path / "r.yaml"
    path.write_bytes(data)
    with pytest.raises(RecipeError) as err:
        load_recipe_file(path)
    message = str(err.value)
    assert message.startswith(f"recipe {path}: ") and expected in message, message[:300]
    assert len(message) < 600


def test_the_report_reads_a_damaged_metrics_file_with_notes_not_a_traceback(tmp_path):
    from judgetrain.report.build import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "train/loss": 0.5}\n'
                     + b'{"step": 2, "train/loss": ' + b"9" * 5000 + b"}\n"
                     + b"[" * 100_000 + b"]" * 100_000 + b"\n"
                     + b'{"step": 3, "train/loss": 0.\xff4}\n'
                     + b'{"step": 4, "train/loss": 0.3}\n')
    notes: list[str] = []
    records = read_metrics(path, notes)
    assert sorted(records) == [1, 4] and records[4]["train/loss"] == 0.3
    assert notes == ["metrics.jsonl: 3 unreadable line(s) skipped"]


def test_a_malformed_json_line_names_its_own_line_and_column(good_lines, tmp_path):
    path = _jsonl(tmp_path, good_lines, b'{"prompt": "x",, }')
    (row,) = [r for r in read_file(path).rows if "__malformed_json__" in r]
    assert row["__malformed_json__"] == "malformed JSON: Expecting property name enclosed in double quotes at line 3 column 16"


def test_json_lines_stream_into_the_datasets_cache_once_per_file_version(tmp_path, monkeypatch):
    import judgetrain.data.io as io
    from judgetrain.data.io import MALFORMED, JsonLines, read_file

    small = tmp_path / "small.jsonl"
    small.write_text('{"a": 1}\n{"a": 2,\n')
    assert read_file(small).rows == [{"a": 1}, read_file(small).rows[1]] and isinstance(read_file(small).rows, list)
    monkeypatch.setattr(io, "STREAM_BYTES", 0)  # every file streams

    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2,\n' + b'{"a": "\xff"}\n{"a": 4}\n')
    first = read_file(path)
    assert isinstance(first.rows, JsonLines) and len(first.rows) == 4  # the blank line is not a row
    assert first.rows[0] == {"a": 1} and first.rows[3] == {"a": 4}
    assert "line 3" in first.rows[1][MALFORMED] and "not UTF-8 text" in first.rows[2][MALFORMED]
    assert list(first.rows) == first.rows[:]
    again = read_file(path)  # the same file version: the same Arrow file, not written again
    assert again.rows.lines.cache_files == first.rows.lines.cache_files
    path.write_text('{"a": 10}\n')
    assert read_file(path).rows.to_list() == [{"a": 10}]
    assert list(JsonLines.parse(small))[0] == {"a": 1} and MALFORMED in list(JsonLines.parse(small))[1]
