"""The pairwise sources (judgetrain/data/pairwise.py): EvalBiasBench and JudgeBench's real rows, a team's own pairs
with its column names, bad rows named by file, row and field; the verdict prompt in both orders; the [[A>B]] parser."""

from __future__ import annotations

import json
import logging
from collections import Counter

import datasets
import pytest

from judgetrain.data import DataValidationError
from judgetrain.data.pairwise import (FIELDS, PAIRWISE_USER, both_orders, check_template, load_evalbiasbench,
                                      load_judgebench, load_pairwise, parse_label, verdict_messages)
from judgetrain.data.scoreparse import count_pair_verdicts, parse_pair_verdict
from judgetrain.metrics import judgebench_category, swap_verdict


@pytest.fixture(scope="module")
def judgebench_dir(shared_dir):
    return shared_dir / "data" / "judgebench"


@pytest.fixture(scope="module")
def evalbiasbench_dir(shared_dir):
    return shared_dir / "data" / "evalbiasbench"


# ------------------------------------------------------------------------------------------- the real rows
def test_real_judgebench_rows_load_with_their_sources_and_labels(judgebench_dir, caplog):
    """The README's counts: gpt 350 rows (193 A>B / 157 B>A; knowledge 154, reasoning 98, math 56, coding 42), claude
    270 (143 / 127); the one claude row that shows the same text twice is kept (the benchmark's 270) and named."""
    with caplog.at_level(logging.WARNING, logger="judgetrain.data.pairwise"):
        ds = load_judgebench(judgebench_dir)
    assert len(ds) == 620 and list(ds.features) == list(FIELDS)
    gpt = ds.filter(lambda s: s.startswith("gpt-4o"), input_columns="subset")
    claude = ds.filter(lambda s: s.startswith("claude"), input_columns="subset")
    assert (len(gpt), len(claude)) == (350, 270)
    assert Counter(gpt["label"]) == {"A>B": 193, "B>A": 157}
    assert Counter(claude["label"]) == {"A>B": 143, "B>A": 127}
    assert Counter(judgebench_category(s) for s in gpt["source"]) == {"knowledge": 154, "reasoning": 98, "math": 56,
                                                                      "coding": 42}
    assert len({s for s in ds["source"] if s.startswith("mmlu-pro-")}) == 14 and set(ds["category"]) == {None}
    assert len(set(ds["id"])) == 620  # pair_id
    assert "1 pair(s) show the same text as both responses" in caplog.text and "row 264" in caplog.text


def test_real_evalbiasbench_rows_load_with_their_biases_and_every_label_first(evalbiasbench_dir):
    ds = load_evalbiasbench(evalbiasbench_dir)
    assert len(ds) == 80
    assert Counter(ds["category"]) == {"length bias": 17, "concreteness": 14, "empty reference": 13,
                                       "content_continuation": 12, "nested_instruction": 12,
                                       "familiar knowledge preference bias": 12}
    assert set(ds["label"]) == {"A>B"}  # every label in the published file is 1
    assert ds[0]["id"] == "biasbench.json#length bias/0"
    raw = json.loads((evalbiasbench_dir / "biasbench.json").read_text())
    assert ds[0]["prompt"] == raw["length bias"][0]["instruction"]
    assert ds[0]["response_b"] == raw["length bias"][0]["response2"]


def test_real_rows_reach_the_judge_in_both_orders(judgebench_dir, evalbiasbench_dir):
    for ds in (load_judgebench(judgebench_dir, max_rows=8), load_evalbiasbench(evalbiasbench_dir, max_rows=6)):
        assert len(ds) in (8, 6)
        for row in ds:
            (o1, ab), (o2, ba) = both_orders(row)
            assert (o1, o2) == ("AB", "BA")
            first, second = ab[-1]["content"], ba[-1]["content"]
            a_at, b_at = first.index(row["response_a"]), first.index(row["response_b"])
            assert a_at < b_at  # as stored: response_a shown as A
            assert second.index(row["response_b"]) < second.index(row["response_a"])  # swapped
            assert first.startswith("[User Question]\n" + row["prompt"])
            assert ab[0] == ba[0] and ab[0]["role"] == "system" and "[[A>B]]" in ab[0]["content"]


def test_max_rows_draws_evenly_over_sources_and_categories(judgebench_dir, evalbiasbench_dir):
    ds = load_judgebench(judgebench_dir, max_rows=17, seed=3)
    assert len(set(ds["source"])) == 17  # 14 mmlu-pro subjects, livebench reasoning and math, livecodebench
    biases = load_evalbiasbench(evalbiasbench_dir, max_rows=12)["category"]
    assert set(Counter(biases).values()) == {2}
    assert ds["id"] == load_judgebench(judgebench_dir, max_rows=17, seed=3)["id"]  # seeded


# ------------------------------------------------------------------------------------- the authors' file by URL
def test_evalbiasbench_by_its_authors_url_is_fetched_once_and_read_as_the_file(evalbiasbench_dir, tmp_path,
                                                                               monkeypatch):
    """An http(s) source (the 8B recipes name OffsetBias's biasbench.json at a commit) from a real HTTP server on
    localhost: fetched once into the judgetrain cache and read as the file is, then read from the cache with the server
    gone; a URL the server does not have is a MissingFileError naming it; not fetched yet with the network off
    (HF_HUB_OFFLINE) is a ConnectionError, which the dry run reports as unreachable."""
    import functools
    import http.server
    import shutil
    import threading

    from huggingface_hub import constants

    from judgetrain.utils.errors import MissingFileError
    from judgetrain.utils.hub import hub_unreachable

    www = tmp_path / "www"
    (www / "data").mkdir(parents=True)
    shutil.copy(evalbiasbench_dir / "biasbench.json", www / "data" / "biasbench.json")
    asked = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(www)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/data/biasbench.json"
    monkeypatch.setenv("JUDGETRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    try:
        ds = load_evalbiasbench(url)
        with pytest.raises(MissingFileError, match=r"/data/nope\.json: HTTP 404"):
            load_evalbiasbench(url.replace("biasbench.json", "nope.json"))
    finally:
        server.shutdown()
        server.server_close()
    assert asked == ["/data/biasbench.json", "/data/nope.json"]
    local = load_evalbiasbench(evalbiasbench_dir)
    assert len(ds) == 80 and ds["id"] == local["id"] and ds["prompt"] == local["prompt"]
    assert ds["id"][0] == "biasbench.json#length bias/0"
    assert load_evalbiasbench(url)["response_b"] == local["response_b"]  # the server is gone: the cached file
    assert len(list((tmp_path / "cache" / "downloads").glob("*/biasbench.json"))) == 1
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConnectionError, match="not downloaded yet") as offline:
        load_evalbiasbench(url.replace("biasbench.json", "other.json"))
    assert hub_unreachable(offline.value)


# ----------------------------------------------------------------------------------------- a team's own pairs
def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_own_pairs_with_column_names_and_label_spellings(tmp_path):
    rows = [{"question": f"q{i}", "first": f"a{i}", "second": f"b{i}", "winner": w, "topic": t}
            for i, (w, t) in enumerate([("A", "math"), ("b", "math"), (1, "code"), ("2", None), ("B>A", "code"),
                                        ("model_a", "chat"), ("A < B", "chat")])]
    path = _write_jsonl(tmp_path / "pairs.jsonl", rows)
    ds = load_pairwise(path, columns={"prompt": "question", "response_a": "first", "response_b": "second",
                                      "label": "winner", "category": "topic"})
    assert ds["label"] == ["A>B", "B>A", "A>B", "B>A", "B>A", "A>B", "B>A"]
    assert ds["category"] == ["math", "math", "code", None, "code", "chat", "chat"]
    assert ds["id"] == [f"pairs.jsonl/{i}" for i in range(7)]  # no id column: named by place
    assert ds[2]["prompt"] == "q2" and ds[2]["response_a"] == "a2" and ds[2]["response_b"] == "b2"
    # the same rows as parquet (a column has one type: the labels as text): the same dataset
    datasets.Dataset.from_list([{**r, "winner": str(r["winner"])} for r in rows]).to_parquet(
        str(tmp_path / "pairs.parquet"))
    again = load_pairwise(tmp_path / "pairs.parquet", columns={"prompt": "question", "response_a": "first",
                                                              "response_b": "second", "label": "winner",
                                                              "category": "topic"})
    assert again["label"] == ds["label"] and again["prompt"] == ds["prompt"]


def test_bad_rows_are_named_by_file_row_and_field_before_anything_else(tmp_path):
    rows = [{"prompt": "p", "response_a": "x", "response_b": "y", "label": "A"},
            {"prompt": "p", "response_a": "x", "response_b": "x", "label": "A"},     # the same text twice
            {"prompt": "p", "response_a": "x", "response_b": "y", "label": "tie"},   # not a label
            {"prompt": "  ", "response_a": "x", "response_b": "y", "label": "B"}]    # empty prompt
    path = _write_jsonl(tmp_path / "own.jsonl", rows)
    with pytest.raises(DataValidationError) as err:
        load_pairwise(path)
    text = str(err.value)
    assert f"{path} [split=test] row 1, field 'response_b': the same text as response_a" in text
    assert "row 2, field 'label': unknown label: 'tie'" in text and "row 3, field 'prompt': empty content" in text
    assert err.value.n_bad_rows == 3 and err.value.n_rows == 4


def test_skip_writes_the_rejects_and_counts_them(tmp_path, caplog):
    rows = [{"id": "k1", "prompt": "p", "response_a": "x", "response_b": "y", "label": "A"},
            {"id": "k1", "prompt": "p", "response_a": "x", "response_b": "z", "label": "B"},   # duplicate id
            {"id": "k3", "prompt": "p", "response_a": "x", "response_b": "y"}]                # no label
    path = _write_jsonl(tmp_path / "own.jsonl", rows)
    rejects = tmp_path / "rejects.jsonl"
    with caplog.at_level(logging.WARNING):
        ds = load_pairwise(path, on_bad_row="skip", rejects_path=rejects)
    assert ds["id"] == ["k1"] and ds["label"] == ["A>B"]
    written = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert sorted((r["row"], r["field"]) for r in written) == [(1, "id"), (2, "label")]
    assert "skipped 2 of 3 rows as bad" in caplog.text


def test_a_missing_column_says_how_to_name_it(tmp_path):
    path = _write_jsonl(tmp_path / "own.jsonl", [{"question": "p", "response_a": "x", "response_b": "y", "label": 1}])
    with pytest.raises(DataValidationError, match=r"missing column 'prompt' \(name the source's column with "
                                                  r"columns=\{'prompt': \.\.\.\}\)"):
        load_pairwise(path)
    with pytest.raises(ValueError, match="unknown pairwise field"):
        load_pairwise(path, columns={"question": "prompt"})


def test_a_bad_evalbiasbench_row_is_named_by_its_bias_list(tmp_path):
    good = {"bias": "length bias", "instruction": "i", "response1": "r1", "response2": "r2", "label": 1}
    data = {"length bias": [good, {**good, "response2": ""}], "concreteness": [{**good, "bias": "concreteness",
                                                                                 "label": 7}]}
    (tmp_path / "biasbench.json").write_text(json.dumps(data))
    with pytest.raises(DataValidationError) as err:
        load_evalbiasbench(tmp_path)
    text = str(err.value)
    assert f"{tmp_path / 'biasbench.json'}#length bias [split=test] row 1, field 'response2': empty content" in text
    assert "#concreteness [split=test] row 0, field 'label': unknown label: 7" in text
    (tmp_path / "biasbench.json").write_text("{not json")
    with pytest.raises(DataValidationError, match="biasbench.json: unreadable: malformed JSON"):
        load_evalbiasbench(tmp_path)


def test_parse_label_spellings():
    assert [parse_label(v) for v in ("A>B", "b>a", "A", "b", 1, 2, "2", "response_b", "B<A")] == \
        ["A>B", "B>A", "A>B", "B>A", "A>B", "B>A", "B>A", "B>A", "A>B"]
    assert [parse_label(v) for v in ("A=B", 3, True, None, "C", 1.0)] == [None] * 6


# --------------------------------------------------------------------------------------------- verdict prompt
def test_a_response_holding_a_placeholder_is_shown_as_written():
    messages = verdict_messages("Q {response_b}", "says {response_b}", "B text", system=None)
    assert messages == [{"role": "user", "content": PAIRWISE_USER.replace("{question}", "Q {response_b}")
                         .replace("{response_a}", "says {response_b}").replace("{response_b}\n[The End of "
                                                                               "Assistant B", "B text\n[The End of "
                                                                               "Assistant B")}]
    assert messages[0]["content"].count("{response_b}") == 2 and "B text" in messages[0]["content"]
    custom = both_orders({"prompt": "q", "response_a": "x", "response_b": "y"}, system="",
                         user="{question}|{response_a}|{response_b}")
    assert custom == [("AB", [{"role": "user", "content": "q|x|y"}]), ("BA", [{"role": "user", "content": "q|y|x"}])]
    check_template(PAIRWISE_USER)
    with pytest.raises(ValueError, match=r"\{response_b\} x0"):
        check_template("{question} {response_a}")


# -------------------------------------------------------------------------------------------- verdict parser
@pytest.mark.parametrize("text, verdict, reason", [
    ("A is more accurate.\n\nMy final verdict is [[A>B]]", "A>B", "ok"),
    ("[[B>>A]]", "B>A", "ok"),             # Arena-Hard's strong preference reads as the preference
    ("[[ A = B ]]", "A=B", "ok"),
    ("[[A<B]]", "B>A", "ok"),
    ("first [[A>B]], then on reflection [[A>B]]", "A>B", "ok"),
    ("[[A>B]] ... no, [[B>A]]", None, "conflicting"),
    ("A is better", None, "no_verdict"),
    ("[[A>A]]", None, "no_verdict"),
    ("[[C>B]]", None, "no_verdict"),
    ("   ", None, "unparseable"),
    (None, None, "unparseable"),
])
def test_parse_pair_verdict(text, verdict, reason):
    result = parse_pair_verdict(text)
    assert (result.verdict, result.reason) == (verdict, reason)


def test_unparsed_verdicts_are_counted_and_read_back_to_the_rows_order():
    results = [parse_pair_verdict(t) for t in ("[[A>B]]", "[[B>A]]", "nothing", "", "[[A>B]][[A=B]]")]
    assert count_pair_verdicts(results) == {"n": 5, "n_parsed": 2, "parse_rate": 0.4,
                                            "unparsed": {"conflicting": 1, "no_verdict": 1, "unparseable": 1}}
    # a verdict about the swapped presentation names the row's B as "A"
    assert [swap_verdict(r.verdict) for r in results] == ["B>A", "A>B", None, None, None]


def test_the_parser_reads_a_hostile_text_in_linear_time():
    """A long run of brackets and blanks with no verdict: read without backtracking (a few ms, not seconds), and the
    verdict at the end of a long text is found."""
    text = "[[ " * 200_000 + "A" + " " * 100_000
    assert parse_pair_verdict(text).reason == "no_verdict"
    assert parse_pair_verdict("x" * 300_000 + "[[B>A]]").verdict == "B>A"
