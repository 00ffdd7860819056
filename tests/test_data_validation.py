"""Every bad-row kind stops loading with source/split/row/field named, or is skipped into a rejects file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from judgetrain.data import DataValidationError, load_ideation, load_judgebias, load_rmbench, sample_source
from judgetrain.data.judgebias import check_row as judgebias_check
from judgetrain.data.validate import check_messages, check_number, parse_messages


def judgebias_rows() -> list[dict]:
    return pq.read_table(Path(sample_source("judgebias")) / "validation.parquet").to_pylist()[:6]


def ideation_rows() -> list[dict]:
    return pq.read_table(Path(sample_source("ideation")) / "test.parquet").to_pylist()[:6]


def rmbench_rows() -> list[dict]:
    return json.loads((Path(sample_source("rmbench")) / "chat_filtered.json").read_text())[:6]


def _msgs(s):
    return json.loads(s)


JUDGEBIAS_BAD = {  # kind -> (mutation of one row, field named, problem text)
    "malformed_json": (lambda r: r.update(prompt=r["prompt"][:-7]), "prompt", "malformed JSON"),
    "roles_out_of_order": (lambda r: r.update(prompt=json.dumps(_msgs(r["prompt"])[::-1])), "prompt", "wrong roles"),
    "two_assistant_messages": (lambda r: r.update(chosen=json.dumps(_msgs(r["chosen"]) * 2)), "chosen", "wrong roles"),
    "user_role_in_chosen": (lambda r: r.update(rejected=json.dumps([{"role": "user", "content": "x"}])), "rejected", "wrong roles"),
    "empty_content": (lambda r: r.update(chosen=json.dumps([{"role": "assistant", "content": "  "}])), "chosen", "empty content"),
    "chosen_equals_rejected": (lambda r: r.update(rejected=r["chosen"]), "rejected", "identical"),
    "nan_score": (lambda r: r.update(score_chosen=math.nan), "score_chosen", "not finite"),
    "inf_anchor": (lambda r: r.update(anchor_score=math.inf), "anchor_score", "not finite"),
    "score_out_of_range": (lambda r: r.update(score_rejected=7.0, score_delta=abs(7.0 - r["score_chosen"])), "score_rejected", "out of range"),
    "delta_inconsistent": (lambda r: r.update(score_delta=r["score_delta"] + 0.5), "score_delta", "inconsistent"),
    "unknown_category": (lambda r: r.update(perturbation_category="bias"), "perturbation_category", "unknown category"),
    "unknown_type": (lambda r: r.update(perturbation_type="color_swap"), "perturbation_type", "unknown perturbation type"),
    "type_category_mismatch": (lambda r: r.update(perturbation_type="llm_to_name", perturbation_category="error"), "perturbation_type", "mismatch"),
    "rate_out_of_range": (lambda r: r.update(perturbation_rate=0.0), "perturbation_rate", "out of range"),
}
# kinds that need mixed types in a column: only a jsonl file can hold them
JUDGEBIAS_BAD_JSONL_ONLY = {
    "missing_value": (lambda r: r.pop("score_chosen"), "score_chosen", "missing value"),
    "wrong_type_sample_id": (lambda r: r.update(sample_id="seven"), "sample_id", "wrong type"),
    "wrong_type_score": (lambda r: r.update(score_delta="1.0"), "score_delta", "wrong type"),
    "prompt_not_a_list": (lambda r: r.update(prompt=json.dumps({"role": "user"})), "prompt", "wrong type"),
}
BAD_ROW = 3


def write(rows: list[dict], path: Path) -> Path:
    if path.suffix == ".parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def corrupt(rows, mutate):
    rows = [dict(r) for r in rows]
    mutate(rows[BAD_ROW])
    return rows


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("kind", sorted(JUDGEBIAS_BAD))
def test_judgebias_bad_row_raises_naming_file_split_row_field(kind, fmt, tmp_path):
    mutate, field, problem = JUDGEBIAS_BAD[kind]
    path = write(corrupt(judgebias_rows(), mutate), tmp_path / f"validation.{fmt}")
    with pytest.raises(DataValidationError) as err:
        load_judgebias(str(path), "validation")
    e = err.value
    assert (e.source, e.split, e.row, e.field) == (str(path), "validation", BAD_ROW, field)
    assert problem in e.problem
    msg = str(e)
    assert str(path) in msg and f"row {BAD_ROW}" in msg and repr(field) in msg and "1 of 6 rows are bad" in msg


@pytest.mark.parametrize("kind", sorted(JUDGEBIAS_BAD) + sorted(JUDGEBIAS_BAD_JSONL_ONLY))
def test_judgebias_skip_drops_bad_row_and_writes_it_with_reason(kind, tmp_path, caplog):
    mutate, field, problem = {**JUDGEBIAS_BAD, **JUDGEBIAS_BAD_JSONL_ONLY}[kind]
    path = write(corrupt(judgebias_rows(), mutate), tmp_path / "train.jsonl")
    rejects = tmp_path / "out" / "rejects.jsonl"
    with caplog.at_level("WARNING"):
        ds = load_judgebias(str(path), "train", on_bad_row="skip", rejects_path=rejects)
    assert len(ds) == 5
    recs = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert len(recs) == 1 and recs[0]["row"] == BAD_ROW and recs[0]["field"] == field and problem in recs[0]["reason"]
    assert recs[0]["source"] == str(path) and recs[0]["data"]["sample_id"] is not None
    assert "skipped 1 of 6 rows" in caplog.text and str(rejects) in caplog.text


@pytest.mark.parametrize("kind", sorted(JUDGEBIAS_BAD_JSONL_ONLY))
def test_judgebias_mixed_type_rows_in_jsonl_raise(kind, tmp_path):
    mutate, field, problem = JUDGEBIAS_BAD_JSONL_ONLY[kind]
    path = write(corrupt(judgebias_rows(), mutate), tmp_path / "train.jsonl")
    with pytest.raises(DataValidationError) as err:
        load_judgebias(str(path))
    assert (err.value.row, err.value.field) == (BAD_ROW, field) and problem in err.value.problem


def test_malformed_jsonl_line_is_a_bad_row(tmp_path):
    path = tmp_path / "train.jsonl"
    lines = [json.dumps(r) for r in judgebias_rows()]
    lines[2] = lines[2][:40]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataValidationError, match=r"row 2, field '<line>': malformed JSON"):
        load_judgebias(str(path))
    assert len(load_judgebias(str(path), on_bad_row="skip", rejects_path=tmp_path / "r.jsonl")) == 5


def test_missing_column_raises_even_in_skip_mode(tmp_path):
    rows = judgebias_rows()
    for r in rows:
        r.pop("anchor_score")
    path = write(rows, tmp_path / "train.parquet")
    for mode in ("error", "skip"):
        with pytest.raises(DataValidationError, match="'anchor_score': missing column") as err:
            load_judgebias(str(path), on_bad_row=mode)
        assert err.value.row is None and err.value.n_bad_rows == 6


def test_error_counts_all_bad_rows_and_default_rejects_path_is_in_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGETRAIN_CACHE", str(tmp_path / "cache"))
    rows = judgebias_rows()
    for i in (1, 4):
        rows[i]["perturbation_category"] = "other"
    path = write(rows, tmp_path / "train.parquet")
    with pytest.raises(DataValidationError, match="2 of 6 rows are bad") as err:
        load_judgebias(str(path))
    assert err.value.row == 1 and err.value.n_bad_rows == 2
    assert len(load_judgebias(str(path), on_bad_row="skip")) == 4
    default = tmp_path / "cache" / "rejects" / "judgebias-train.jsonl"
    assert [json.loads(x)["row"] for x in default.read_text().splitlines()] == [1, 4]


def test_directory_source_names_the_bad_file(tmp_path):
    rows = judgebias_rows()
    write(rows, tmp_path / "train-00000-of-00002.parquet")
    bad = write(corrupt(rows, JUDGEBIAS_BAD["nan_score"][0]), tmp_path / "train-00001-of-00002.parquet")
    write(rows, tmp_path / "validation.parquet")
    with pytest.raises(DataValidationError) as err:
        load_judgebias(str(tmp_path), "train")
    assert err.value.source == str(bad) and err.value.row == BAD_ROW
    assert len(load_judgebias(str(tmp_path), "validation")) == 6


def test_invalid_on_bad_row_value_is_refused():
    with pytest.raises(ValueError, match="on_bad_row"):
        load_judgebias("bundled", on_bad_row="ignore")


# ------------------------------------------------------------------ RM-Bench

RMBENCH_BAD = {
    "two_styles": (lambda r: r.update(chosen=r["chosen"][:2]), "chosen", "wrong length"),
    "four_styles": (lambda r: r.update(rejected=r["rejected"] + ["x"]), "rejected", "wrong length"),
    "empty_response": (lambda r: r["rejected"].__setitem__(1, ""), "rejected", "empty content"),
    "identical_pair": (lambda r: r.update(rejected=list(r["chosen"])), "rejected", "identical"),
    "missing_prompt": (lambda r: r.pop("prompt"), "prompt", "missing value"),
    "list_not_list": (lambda r: r.update(chosen="text"), "chosen", "wrong type"),
    "duplicate_id": (lambda r: r.update(id=8), "id", "duplicate id"),
}


@pytest.mark.parametrize("kind", sorted(RMBENCH_BAD))
def test_rmbench_bad_row_raises_or_skips(kind, tmp_path):
    mutate, field, problem = RMBENCH_BAD[kind]
    rows = json.loads(json.dumps(rmbench_rows()))
    assert rows[0]["id"] == 8
    mutate(rows[BAD_ROW])
    path = tmp_path / "chat_filtered.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(DataValidationError) as err:
        load_rmbench(str(tmp_path))
    assert (err.value.source, err.value.row, err.value.field) == (str(path), BAD_ROW, field)
    assert problem in err.value.problem
    ds = load_rmbench(str(tmp_path), on_bad_row="skip", rejects_path=tmp_path / "rej.jsonl")
    assert len(ds) == 5
    assert json.loads((tmp_path / "rej.jsonl").read_text())["field"] == field


def test_rmbench_unknown_domain_in_total_dataset(tmp_path):
    rows = [dict(r, id=f"chat/{r['id']}", domain="chat") for r in rmbench_rows()]
    rows[BAD_ROW]["domain"] = "poetry"
    (tmp_path / "total_dataset.json").write_text(json.dumps(rows))
    with pytest.raises(DataValidationError, match="unknown domain") as err:
        load_rmbench(str(tmp_path))
    assert (err.value.row, err.value.field) == (BAD_ROW, "domain")


def test_malformed_json_array_file_raises_with_line(tmp_path):
    (tmp_path / "code_filtered.json").write_text('[{"id": 1, "prompt": "x",}]')
    with pytest.raises(DataValidationError, match="malformed JSON: .* line 1"):
        load_rmbench(str(tmp_path))


# ------------------------------------------------------------------ Ideation

IDEATION_BAD = {
    "empty_chosen": (lambda r: r.update(chosen=" ", response_a=" " if r["human_preference"] == "A" else r["response_a"]), "chosen", "empty content"),
    "chosen_equals_rejected": (lambda r: r.update(rejected=r["chosen"]), "rejected", "identical"),
    "unknown_preference": (lambda r: r.update(human_preference="tie"), "human_preference", "unknown label"),
    "preference_inconsistent": (lambda r: r.update(human_preference="B" if r["human_preference"] == "A" else "A"), "human_preference", "inconsistent"),
    "shares_flag_not_bool": (lambda r: r.update(shares_test_group="no"), "shares_test_group", "wrong type"),
    "missing_group": (lambda r: r.pop("split_group_id"), "split_group_id", "missing value"),
}


@pytest.mark.parametrize("kind", sorted(IDEATION_BAD))
def test_ideation_bad_row_raises_or_skips(kind, tmp_path):
    mutate, field, problem = IDEATION_BAD[kind]
    path = write(corrupt(ideation_rows(), mutate), tmp_path / "test.jsonl")
    with pytest.raises(DataValidationError) as err:
        load_ideation(str(tmp_path), "test", mode="pairwise")
    assert (err.value.source, err.value.split, err.value.row, err.value.field) == (str(path), "test", BAD_ROW, field)
    assert problem in err.value.problem
    ds = load_ideation(str(tmp_path), "test", mode="pairwise", on_bad_row="skip", rejects_path=tmp_path / "r.jsonl")
    assert len(ds) == 10


# ------------------------------------------------------------------ property tests of the validators

@settings(max_examples=60, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10)))
def test_check_number_accepts_exactly_finite_values_in_range(x):
    ok = check_number(x, 0.5, 5.5) is None
    assert ok == (math.isfinite(x) and 0.5 <= x <= 5.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]), st.text(max_size=5)), max_size=3))
def test_check_messages_accepts_only_the_allowed_role_sequences_with_content(msgs):
    messages = [{"role": r, "content": c} for r, c in msgs]
    ok = check_messages(messages, [["system", "user"]]) is None
    assert ok == ([r for r, _ in msgs] == ["system", "user"] and all(c.strip() for _, c in msgs))


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=30))
def test_parse_messages_never_raises_on_arbitrary_strings(text):
    msgs, err = parse_messages(text)
    assert (msgs is None) != (err is None)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.5, 5.5), st.floats(0.5, 5.5), st.one_of(st.floats(-1, 6), st.just(math.nan)))
def test_judgebias_delta_is_consistent_only_when_it_equals_the_score_gap(sc, sr, delta):
    row = dict(judgebias_rows()[0], score_chosen=sc, score_rejected=sr, score_delta=delta)
    fields = {f for f, _ in judgebias_check(row)}
    # in range (a difference of two scores: never negative, not even -1e-305) and equal to the score gap within 1e-6
    consistent = math.isfinite(delta) and delta >= 0 and math.isclose(delta, abs(sc - sr), abs_tol=1e-6)
    assert ("score_delta" not in fields) == consistent
