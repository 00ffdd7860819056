"""The pair builder on the bundled judge panel: rules of the card, schema, splits, rejects, CLI."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import judgetrain
from judgetrain.cli import main as cli_main
from judgetrain.data.pairs import (Evaluation, PanelDataError, build_pairs, candidate_pairs, cap_pairs, count_rejects,
                              deduplicate, direct, load_table, make_pairs, output_schema, pair_statistics,
                              parse_set_name, read_evaluations, sample_anchors, score_evaluations, split_by_sample,
                              validation_samples)
from judgetrain.data.scoreparse import parse_overall_score

from helpers import REPO, run

PANEL = Path(judgetrain.__file__).parent / "data" / "samples" / "panel" / "evaluations.jsonl.gz"
# medians of the 20 (4 judges x 5 representational rates) scores per sample, computed by hand from the panel
HAND_ANCHORS = {0: 4.5, 1: 3.75, 2: 3.0, 3: 3.75, 4: 3.0, 5: 3.25}
PLANTED_REJECTS = {
    (1, "element_substitution_100pct", "Llama-3.1-8B-Instruct"): "unparseable",
    (3, "llm_to_name_100pct", "Qwen3-8B"): "unparseable",
    (2, "numerical_perturbation_100pct", "Qwen3-8B"): "out_of_range",
    (4, "llm_to_formula_100pct", "Llama-3.1-8B-Instruct"): "out_of_range",
}


@pytest.fixture(scope="module")
def panel_rows():
    return read_evaluations(PANEL)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("pairs")
    stats = build_pairs(PANEL, out)
    train = pq.read_table(out / "train.parquet").to_pylist()
    validation = pq.read_table(out / "validation.parquet").to_pylist()
    return out, stats, train, validation


def _score(row_json: str) -> float:
    return parse_overall_score(json.loads(row_json)[0]["content"])


def _set_name(row: dict) -> str:
    rate = round(row["perturbation_rate"] * 100)
    return f"{row['perturbation_type']}_{rate}pct"


def test_panel_covers_17_sets_4_judges_6_samples(panel_rows):
    assert len(panel_rows) == 6 * 17 * 4
    assert len({r["perturbation_set"] for r in panel_rows}) == 17
    assert len({r["judge_model"] for r in panel_rows}) == 4
    assert Counter(r["perturbation_category"] for r in panel_rows) == {"error": 6 * 9 * 4, "represent": 6 * 8 * 4}


def test_panel_regenerates_identically_from_the_sample_generators(tmp_path):
    run([sys.executable, REPO / "scripts" / "make_panel.py", "--out", tmp_path / "panel.jsonl.gz"])
    assert (tmp_path / "panel.jsonl.gz").read_bytes() == PANEL.read_bytes()


def test_output_has_exactly_the_judgebias_schema(built):
    out, _, train, _ = built
    for split in ("train", "validation"):
        assert pq.read_schema(out / f"{split}.parquet").remove_metadata() == output_schema()
    row = train[0]
    prompt = json.loads(row["prompt"])
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert [m["role"] for m in json.loads(row["chosen"])] == ["assistant"]
    assert [m["role"] for m in json.loads(row["rejected"])] == ["assistant"]


def test_pairs_exist_in_both_categories(built):
    _, stats, train, validation = built
    rows = train + validation
    assert {r["perturbation_category"] for r in rows} == {"error", "represent"}
    assert stats["error_pairs"] + stats["represent_pairs"] == stats["total_pairs"] == len(rows)
    assert stats["train_pairs"] == len(train) and stats["validation_pairs"] == len(validation)


def test_every_pair_obeys_its_category_direction_and_the_minimum_gap(built):
    _, _, train, validation = built
    for row in train + validation:
        chosen, rejected = _score(row["chosen"]), _score(row["rejected"])
        assert (chosen, rejected) == (row["score_chosen"], row["score_rejected"])
        if row["perturbation_category"] == "represent":
            assert row["score_chosen"] > row["score_rejected"]
        else:
            assert row["score_chosen"] < row["score_rejected"]
        assert row["score_delta"] == pytest.approx(abs(row["score_chosen"] - row["score_rejected"]))
        assert row["score_delta"] >= 0.5
        assert row["chosen_model"] != row["rejected_model"]


def test_chosen_and_rejected_are_the_named_judges_evaluations(built, panel_rows):
    _, _, train, validation = built
    text = {(r["sample_id"], r["perturbation_set"], r["judge_model"]): r["evaluation"] for r in panel_rows}
    for row in train + validation:
        key = (row["sample_id"], _set_name(row))
        assert json.loads(row["chosen"])[0]["content"] == text[(*key, row["chosen_model"])]
        assert json.loads(row["rejected"])[0]["content"] == text[(*key, row["rejected_model"])]


def test_anchors_equal_the_hand_computed_median(built, panel_rows):
    _, stats, train, validation = built
    recomputed = defaultdict(list)
    for r in panel_rows:
        if r["perturbation_category"] == "represent" and r["perturbation_rate"] < 1:
            score = parse_overall_score(r["evaluation"])
            if score is not None:
                recomputed[r["sample_id"]].append(score)
    assert {sid: statistics.median(s) for sid, s in recomputed.items()} == HAND_ANCHORS
    for row in train + validation:
        assert row["anchor_score"] == HAND_ANCHORS[row["sample_id"]]
    assert stats["anchor_sets"] == "rates" and stats["skipped_samples"] == 0


def test_anchor_filter_holds_and_drops_the_planted_low_groups(built):
    _, stats, train, validation = built
    rows = train + validation
    for row in rows:
        if row["perturbation_category"] == "represent":
            assert row["score_chosen"] >= row["anchor_score"] - 1.5
        else:
            assert row["score_rejected"] >= row["anchor_score"] - 2.0
    assert stats["dropped"]["anchor_filter"] > 0
    # every judge scored these far below the anchor: no pair survives
    assert not [r for r in rows if r["sample_id"] == 0 and r["perturbation_type"] == "action_antonym"]
    assert not [r for r in rows if r["sample_id"] == 5 and r["perturbation_type"] == "llm_to_iupac"]


def test_at_most_five_pairs_per_sample_and_set_and_the_largest_gaps_are_kept(built, panel_rows):
    _, stats, train, validation = built
    per_group = defaultdict(list)
    for row in train + validation:
        per_group[(row["sample_id"], _set_name(row))].append(row)
    assert max(len(v) for v in per_group.values()) <= 5
    assert stats["dropped"]["cap"] > 0
    # recompute every group's valid pairs independently: a group's kept gaps are its top gaps
    scores = defaultdict(dict)
    for r in panel_rows:
        s = parse_overall_score(r["evaluation"])
        if s is not None:
            scores[(r["sample_id"], r["perturbation_set"])][r["judge_model"]] = s
    for (sid, set_name), by_judge in scores.items():
        anchor = HAND_ANCHORS[sid]
        represent = set_name.startswith("llm_")
        valid = []
        for a, b in combinations(sorted(by_judge), 2):
            hi, lo = max(by_judge[a], by_judge[b]), min(by_judge[a], by_judge[b])
            if hi - lo < 0.5:
                continue
            if (represent and hi < anchor - 1.5) or (not represent and hi < anchor - 2.0):
                continue
            valid.append(hi - lo)
        kept = sorted((r["score_delta"] for r in per_group.get((sid, set_name), [])), reverse=True)
        expected = sorted(valid, reverse=True)[:5]
        if (sid, set_name) == (3, "equipment_substitution_100pct"):
            assert len(kept) < len(expected)  # identical evaluations of two judges: duplicates removed
        else:
            assert kept == expected, (sid, set_name)


def test_no_duplicate_pairs(built):
    _, stats, train, validation = built
    digests = [hashlib.sha256(json.dumps([r["prompt"], r["chosen"], r["rejected"]]).encode()).hexdigest()
               for r in train + validation]
    assert len(digests) == len(set(digests))
    assert stats["dropped"]["duplicate"] > 0  # the panel plants one pair of byte-identical evaluations


def test_no_sample_is_in_both_splits(built):
    _, stats, train, validation = built
    train_ids, val_ids = {r["sample_id"] for r in train}, {r["sample_id"] for r in validation}
    assert train_ids and val_ids
    assert not train_ids & val_ids
    assert len(train_ids | val_ids) == stats["unique_samples"] == 6


def test_unparseable_and_out_of_range_scores_are_counted_and_written_to_rejects(built):
    out, stats, _, _ = built
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    found = {(r["sample_id"], r["perturbation_set"], r["judge_model"]): r["reason"] for r in rejects}
    assert found == PLANTED_REJECTS
    assert {r["value"] for r in rejects if r["reason"] == "out_of_range"} == {7.0, 0.0}
    assert all(r["evaluation"] for r in rejects)
    assert stats["rejects_by_judge"]["Qwen3-8B"] == {"unparseable": 1, "out_of_range": 1}
    assert stats["rejects_by_judge"]["Llama-3.1-8B-Instruct"] == {"unparseable": 1, "out_of_range": 1}
    assert stats["rejects_by_judge"]["gemini-2.5-flash"] == {}
    assert stats["rejected_rows"] == 4 and stats["scored_rows"] == 404


def test_stats_json_matches_the_returned_statistics(built):
    out, stats, train, validation = built
    saved = json.loads((out / "stats.json").read_text())
    assert saved["total_pairs"] == len(train) + len(validation)
    deltas = [r["score_delta"] for r in train + validation]
    assert saved["score_delta_mean"] == pytest.approx(statistics.fmean(deltas))
    assert saved["score_delta_median"] == statistics.median(deltas)
    assert saved["error_share"] == pytest.approx(stats["error_pairs"] / stats["total_pairs"])


def test_same_seed_gives_identical_files(built, tmp_path):
    out, _, _, _ = built
    build_pairs(PANEL, tmp_path)
    for name in ("train.parquet", "validation.parquet"):
        assert pq.read_table(tmp_path / name).equals(pq.read_table(out / name))


def test_samples_without_enough_representational_scores_are_skipped(panel_rows, tmp_path):
    rows = [r for r in panel_rows
            if not (r["sample_id"] == 5 and r["perturbation_category"] == "represent" and r["perturbation_rate"] < 1
                    and r["judge_model"] != "Qwen3-32B")]
    # sample 5 now has 5 anchor scores (one judge x 5 rates); require 6
    stats = build_pairs(rows, tmp_path, min_represent_evals=6)
    assert stats["skipped_samples"] == 1 and stats["skipped_sample_ids"] == [5]
    samples = {r["sample_id"] for name in ("train", "validation")
               for r in pq.read_table(tmp_path / f"{name}.parquet").to_pylist()}
    assert 5 not in samples and len(samples) == 5


def test_category_and_rate_are_derived_from_either_spelling_of_the_set_name(panel_rows, tmp_path):
    rows = []
    for r in panel_rows:
        r = {k: v for k, v in r.items() if k not in ("perturbation_category", "perturbation_rate")}
        r["perturbation_set"] = (r["perturbation_set"].replace("all_error_perturbation", "all_error_injection")
                                 .replace("llm_representational_perturbation", "all_equivalence_rewriting"))
        r["prompt"] = json.dumps(r["prompt"])  # prompt as a JSON string is accepted too
        rows.append(r)
    build_pairs(rows, tmp_path)
    renamed = pq.read_table(tmp_path / "train.parquet").to_pylist()
    build_pairs(PANEL, tmp_path / "orig")
    original = pq.read_table(tmp_path / "orig" / "train.parquet").to_pylist()
    assert renamed == original
    assert parse_set_name("all_equivalence_rewriting_5pct") == ("llm_representational_perturbation", 0.05)
    assert parse_set_name("element_substitution_100pct") == ("element_substitution", 1.0)


def test_output_loads_with_load_judgebias(built):
    out, stats, _, _ = built
    try:
        from judgetrain.data import load_judgebias
    except ImportError:  # the package re-export may lag the adapter module
        load_judgebias = pytest.importorskip("judgetrain.data.judgebias").load_judgebias
    train = load_judgebias(str(out), split="train")
    validation = load_judgebias(str(out), split="validation")
    assert len(train) == stats["train_pairs"] and len(validation) == stats["validation_pairs"]
    assert train[0]["chosen"][0]["role"] == "assistant"


def test_cli_builds_pairs_and_writes_stats(tmp_path, capsys):
    assert cli_main(["pairs", "build", "--evaluations", str(PANEL), "--out", str(tmp_path), "--max-pairs", "3",
                     "--seed", "1"]) == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["options"]["max_pairs"] == 3 and stats["total_pairs"] > 0
    assert "Total pairs" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert max(Counter((r["sample_id"], _set_name(r)) for r in rows).values()) <= 3


def test_cli_refuses_a_table_without_required_columns(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"sample_id": 1, "evaluation": "x"}) + "\n")
    assert cli_main(["pairs", "build", "--evaluations", str(bad), "--out", str(tmp_path / "o")]) == 2


# ------------------------------------------------------------------ the stages, one by one

def _ev(judge: str, score: float, *, sample_id: int = 0, category: str = "error", rate: float = 1.0,
        text: str | None = None) -> Evaluation:
    ptype = "element_substitution" if category == "error" else "llm_to_name"
    return Evaluation(sample_id, f"{ptype}_{round(rate * 100)}pct", ptype, category, rate, judge, '[{"role": "user"}]',
                      text or f"{judge} says {score}", score)


def _row(judge: str, evaluation: str, sample_id: int = 0, perturbation_set: str = "llm_to_name_100pct") -> dict:
    return {"sample_id": sample_id, "perturbation_set": perturbation_set, "judge_model": judge,
            "prompt": [{"role": "user", "content": "rate it"}], "evaluation": evaluation}


def test_load_table_names_the_missing_columns_and_refuses_an_empty_table():
    with pytest.raises(PanelDataError, match="lacks column.*judge_model, prompt"):
        load_table([{"sample_id": 1, "perturbation_set": "x", "evaluation": "y"}])
    with pytest.raises(PanelDataError, match="empty"):
        load_table([])


def test_score_evaluations_scores_rows_and_rejects_unreadable_out_of_range_and_repeated_ones():
    rows = [_row("a", '{"overall_score": 4.5}'), _row("b", "no score here"), _row("c", '{"overall_score": 9}'),
            _row("a", '{"overall_score": 3.0}'), _row("d", '{"overall_score": 2}', sample_id="x")]
    evals, rejects = score_evaluations(rows)
    assert [(e.judge_model, e.score, e.perturbation_category, e.perturbation_rate) for e in evals] == \
        [("a", 4.5, "represent", 1.0)]
    assert [(r["row"], r["reason"]) for r in rejects] == \
        [(1, "unparseable"), (2, "out_of_range"), (3, "duplicate"), (4, "bad_row")]
    assert count_rejects(rejects, ["a", "b", "c", "d", "e"]) == {
        "a": {"duplicate": 1}, "b": {"unparseable": 1}, "c": {"out_of_range": 1}, "d": {"bad_row": 1}, "e": {}}


def test_a_prompt_the_endpoint_refused_is_counted_apart_from_unparseable_scores(tmp_path):
    """`judgetrain judge` writes a row with reason endpoint_rejected and no evaluation where an endpoint refused the
    prompt: pairs build counts it as such, not as the judge's unreadable score."""
    from judgetrain.cli.pairs import stats_table

    refused = {**_row("b", "", sample_id=1), "reason": "endpoint_rejected", "error": "HTTP 400: context too long"}
    rows = [_row("a", '{"overall_score": 4.5}'), _row("b", "no score here"), refused,
            {**_row("c", "", sample_id=2), "reason": "endpoint_rejected"}, _row("c", "")]
    _, rejects = score_evaluations(rows)
    assert [(r["row"], r["reason"]) for r in rejects] == \
        [(1, "unparseable"), (2, "endpoint_rejected"), (3, "endpoint_rejected"), (4, "unparseable")]
    assert rejects[1]["detail"] == "HTTP 400: context too long"
    stats = build_pairs(rows, tmp_path / "out")
    assert stats["endpoint_rejected_rows"] == 2 and stats["rejected_rows"] == 4
    assert stats["rejects_by_reason"] == {"endpoint_rejected": 2, "unparseable": 2}
    assert stats["rejects_by_judge"]["b"] == {"endpoint_rejected": 1, "unparseable": 1}
    table = {row[0]: row[1] for row in zip(*(col._cells for col in stats_table(stats).columns))}
    assert table["Prompts an endpoint refused"] == "2"


def test_sample_anchors_take_the_median_of_the_rate_sets_and_skip_thin_samples():
    evals = [_ev(j, s, category="represent", rate=0.05) for j, s in (("a", 2.0), ("b", 4.0), ("c", 5.0))]
    evals += [_ev("a", 1.0, category="represent"), _ev("b", 3.0, sample_id=1, category="represent", rate=0.05)]
    anchors, skipped, used = sample_anchors(evals, min_represent_evals=3)
    assert anchors == {0: 4.0} and skipped == [1] and used == "rates"
    anchors, _, used = sample_anchors(evals, anchor_sets="represent", min_represent_evals=3)
    assert anchors == {0: 3.0} and used == "represent"  # the 100% set (1.0) now counts too


def test_direct_orders_pairs_by_category():
    assert [e.judge_model for e in direct(_ev("a", 2.0), _ev("b", 4.0))] == ["a", "b"]  # error: lower is chosen
    assert [e.judge_model for e in direct(_ev("a", 2.0, category="represent"), _ev("b", 4.0, category="represent"))
            ] == ["b", "a"]


def test_candidate_pairs_drop_ties_small_gaps_and_pairs_below_the_anchor():
    dropped = Counter()
    members = [_ev("a", 4.0), _ev("b", 4.0), _ev("c", 3.5), _ev("d", 1.0)]
    kept = candidate_pairs(members, 4.0, dropped, min_delta=1.0, represent_anchor_margin=1.5,
                           error_anchor_margin=2.0)
    assert [(c.judge_model, r.judge_model, d) for c, r, d in kept] == [("d", "a", 3.0), ("d", "b", 3.0),
                                                                     ("d", "c", 2.5)]
    assert dropped == {"candidates": 6, "tie": 1, "min_delta": 2}
    represent = [_ev("a", 2.0, category="represent"), _ev("b", 1.0, category="represent")]
    assert candidate_pairs(represent, 4.0, dropped, min_delta=0.5, represent_anchor_margin=1.5,
                           error_anchor_margin=2.0) == []
    assert dropped["anchor_filter"] == 1  # chosen 2.0 sits 2.0 below the anchor 4.0


def test_cap_pairs_keeps_the_largest_gaps_and_is_seeded():
    import random

    kept = [(_ev("a", 1), _ev("b", 2), d) for d in (0.5, 2.0, 1.0, 2.0, 1.5)]
    capped = cap_pairs(kept, 3, random.Random(0))
    assert [d for _, _, d in capped] == [2.0, 2.0, 1.5]
    assert capped == cap_pairs(kept, 3, random.Random(0)) and len(kept) == 5


def test_make_pairs_builds_schema_rows_and_counts_the_cap():
    dropped = Counter()
    evals = [_ev(j, s) for j, s in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.5))]
    rows = make_pairs(evals, {0: 4.0}, dropped, max_pairs=2)
    assert [(r["chosen_model"], r["rejected_model"], r["score_delta"]) for r in rows] == [("a", "d", 3.5),
                                                                                          ("b", "d", 2.5)]
    assert set(rows[0]) == set(output_schema().names) and rows[0]["anchor_score"] == 4.0
    assert json.loads(rows[0]["chosen"]) == [{"role": "assistant", "content": "a says 1.0"}]
    assert dropped["cap"] == 4 and dropped["candidates"] == 6
    assert make_pairs(evals, {}, Counter()) == []  # unanchored samples give no pairs


def test_deduplicate_keeps_the_first_of_identical_triples():
    dropped = Counter()
    rows = [{"prompt": "p", "chosen": "c", "rejected": r, "n": n} for n, r in enumerate(("r1", "r2", "r1"))]
    assert [r["n"] for r in deduplicate(rows, dropped)] == [0, 1] and dropped["duplicate"] == 1


def test_split_by_sample_holds_out_whole_samples():
    rows = [{"sample_id": sid, "n": n} for n, sid in enumerate((0, 1, 1, 2, 3, 3, 4))]
    held = validation_samples([r["sample_id"] for r in rows], 0.2, seed=0)
    train, validation = split_by_sample(rows, 0.2, seed=0)
    assert len(held) == 1 and {r["sample_id"] for r in validation} == held
    assert not {r["sample_id"] for r in train} & held and len(train) + len(validation) == len(rows)
    assert validation_samples([0, 1], 0.1, seed=0) != set()  # at least one held out when asked for any
    assert validation_samples([0, 1], 0.0, seed=0) == set()


def test_pair_statistics_count_categories_samples_and_gaps():
    train = [{"sample_id": 0, "perturbation_category": "error", "perturbation_type": "x", "score_delta": 1.0},
             {"sample_id": 1, "perturbation_category": "represent", "perturbation_type": "y", "score_delta": 2.0}]
    validation = [{"sample_id": 2, "perturbation_category": "error", "perturbation_type": "x", "score_delta": 3.0}]
    stats = pair_statistics(train, validation)
    assert (stats["total_pairs"], stats["error_pairs"], stats["represent_pairs"]) == (3, 2, 1)
    assert (stats["unique_samples"], stats["train_samples"], stats["validation_samples"]) == (3, 2, 1)
    assert stats["score_delta_mean"] == 2.0 and stats["pairs_by_type"] == {"x": 2, "y": 1}
    assert math.isnan(pair_statistics([], [])["score_delta_mean"])


@pytest.mark.slow
def test_built_pairs_train_a_tiny_judge_with_dpo(built, tmp_path):
    """The output goes through load_judgebias into TRL's DPOTrainer (LoRA, the quickstart's max_length)."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from judgetrain.data.judgebias import load_judgebias
    from judgetrain.models.tiny import ensure_tiny_judge

    out, _, _, _ = built
    path = ensure_tiny_judge()
    dataset = load_judgebias(str(out), split="train", max_rows=4)
    # the same 4 pairs every step (one batch of 4); a learning rate that moves a LoRA of rank 4 in a few steps
    args = DPOConfig(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, max_length=1024,
                     learning_rate=1e-2, report_to="none", logging_steps=1, save_strategy="no", use_cpu=True)
    trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args, train_dataset=dataset,
                         processing_class=AutoTokenizer.from_pretrained(path),
                         peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 4
    # step 1, by hand: lora_B starts at zero, so the policy is the reference, every margin 0 and the sigmoid loss
    # -log(sigmoid(0)) = ln 2
    assert logs[0]["loss"] == pytest.approx(math.log(2), abs=1e-4) and logs[0]["rewards/margins"] == pytest.approx(0, abs=1e-6)
    # the pairs teach it: by step 4 the chosen completions outscore the rejected ones and the loss is below ln 2
    assert logs[-1]["rewards/margins"] > 0 and logs[-1]["loss"] < math.log(2) - 1e-3, logs[-1]
