"""The pair builder on the bundled judge panel: rules of the card, schema, splits, rejects, CLI."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import judgetrain
from judgetrain.cli import main as cli_main
from judgetrain.pairs import build_pairs, output_schema, parse_set_name, read_evaluations
from judgetrain.scoreparse import parse_overall_score

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


@pytest.mark.slow
def test_built_pairs_train_a_tiny_judge_with_dpo(built, tmp_path):
    """The output goes through load_judgebias into TRL's DPOTrainer (LoRA, the quickstart's max_length)."""
    import math

    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from judgetrain.data.judgebias import load_judgebias
    from judgetrain.tiny import ensure_tiny_judge

    out, _, _, _ = built
    path = ensure_tiny_judge()
    dataset = load_judgebias(str(out), split="train", max_rows=4)
    args = DPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, max_length=1024,
                     report_to="none", logging_steps=1, save_strategy="no", use_cpu=True)
    trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args, train_dataset=dataset,
                         processing_class=AutoTokenizer.from_pretrained(path),
                         peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    result = trainer.train()
    assert math.isfinite(result.training_loss)
    assert "rewards/accuracies" in trainer.state.log_history[0]
