"""Adapters on the bundled samples and the real RM-Bench files: counts, schema, ids, splits, modes, mixtures."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest

from judgetrain.data import load_ideation, load_judgebias, load_mixture, load_rmbench, sample_source
from judgetrain.data.judgebias import PERTURBATION_SETS, perturbation_set
from judgetrain.data.rmbench import DOMAINS

from helpers import REPO, run

REAL_ROWS = {"chat": 129, "code": 228, "safety-refuse": 284, "safety-response": 157}
JUDGEBIAS_DTYPES = {"prompt": "string", "chosen": "string", "rejected": "string", "score_chosen": "double",
                    "score_rejected": "double", "score_delta": "double", "anchor_score": "double", "sample_id": "int64",
                    "perturbation_type": "string", "perturbation_category": "string", "perturbation_rate": "double",
                    "chosen_model": "string", "rejected_model": "string"}


# ------------------------------------------------------------------ JudgeBias

def test_bundled_judgebias_parquet_has_exact_hub_schema():
    for split in ("train", "validation"):
        schema = pq.read_schema(Path(sample_source("judgebias")) / f"{split}.parquet")
        assert {f.name: str(f.type) for f in schema} == JUDGEBIAS_DTYPES


def test_judgebias_decodes_json_messages_into_trl_conversational_rows():
    ds = load_judgebias("bundled", "train")
    assert len(ds) == 320
    row = ds[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert [m["role"] for m in row["chosen"]] == ["assistant"]
    assert row["chosen"][0]["content"].rstrip().endswith("```")
    assert json.loads(row["chosen"][0]["content"].split("```json")[1].split("```")[0])["overall_score"] == row["score_chosen"]


def test_bundled_judgebias_covers_all_17_sets_in_both_splits_and_disjoint_samples():
    train, val = load_judgebias("bundled", "train"), load_judgebias("bundled", "validation")
    want = {perturbation_set(t, r) for t, r in PERTURBATION_SETS}
    assert len(want) == 17
    for ds in (train, val):
        assert {perturbation_set(t, r) for t, r in zip(ds["perturbation_type"], ds["perturbation_rate"])} == want
    assert len(val) == 96
    assert not set(train["sample_id"]) & set(val["sample_id"])


def test_judgebias_chosen_names_error_or_equivalence_with_direction_aware_scores():
    ds = load_judgebias("bundled", "validation")
    for row in ds:
        chosen, rejected = row["chosen"][0]["content"], row["rejected"][0]["content"]
        if row["perturbation_category"] == "error":
            assert "Detected error:" in chosen and "No errors found" in rejected
            assert row["score_chosen"] < row["score_rejected"]
        else:
            assert "Equivalent representation:" in chosen and "Penalty:" in rejected
            assert row["score_chosen"] > row["score_rejected"]
        assert row["score_delta"] == abs(row["score_chosen"] - row["score_rejected"]) >= 0.5


def test_judgebias_filters_and_even_type_cap_are_deterministic():
    err = load_judgebias("bundled", categories=["error"])
    assert set(err["perturbation_category"]) == {"error"} and len(err) == 171
    one = load_judgebias("bundled", types=["all_error_injection"])  # other spelling of the combined error set
    assert set(one["perturbation_type"]) == {"all_error_perturbation"}
    assert min(load_judgebias("bundled", min_score_delta=1.5)["score_delta"]) >= 1.5
    a = load_judgebias("bundled", max_rows=45, seed=3)
    b = load_judgebias("bundled", max_rows=45, seed=3)
    assert len(a) == 45 and a["sample_id"] == b["sample_id"] and a["perturbation_type"] == b["perturbation_type"]
    assert set(Counter(a["perturbation_type"]).values()) == {5}  # 9 types x 5
    assert load_judgebias("bundled", max_rows=45, seed=4)["sample_id"] != a["sample_id"]


def test_judgebias_accepts_both_combined_spellings_and_decoded_lists(tmp_path):
    rows = pq.read_table(Path(sample_source("judgebias")) / "validation.parquet").to_pylist()
    for r in rows:
        r["perturbation_type"] = {"all_error_perturbation": "all_error_injection",
                                  "llm_representational_perturbation": "all_equivalence_rewriting"}.get(r["perturbation_type"], r["perturbation_type"])
        r["prompt"] = json.loads(r["prompt"])  # already decoded
    path = tmp_path / "validation.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = load_judgebias(str(path), "validation")
    assert len(ds) == 96
    assert "all_error_injection" not in ds["perturbation_type"] and "all_error_perturbation" in ds["perturbation_type"]
    assert "llm_representational_perturbation" in ds["perturbation_type"]


def test_synthetic_samples_regenerate_identically(tmp_path):
    run([sys.executable, REPO / "scripts" / "make_samples.py", "--only", "judgebias", "ideation", "--out", tmp_path])
    for name in ("judgebias/train.parquet", "judgebias/validation.parquet", "ideation/train.parquet", "ideation/test.parquet"):
        assert (tmp_path / name).read_bytes() == (Path(sample_source(name.split("/")[0])) / name.split("/")[1]).read_bytes(), name


# ------------------------------------------------------------------ Ideation

def test_ideation_implicit_rows_are_prompt_to_proposal():
    raw = pq.read_table(Path(sample_source("ideation")) / "test.parquet").to_pylist()
    ds = load_ideation("bundled", "test", mode="implicit")
    assert len(ds) == len(raw) == 40
    assert ds[0]["prompt"] == [{"role": "user", "content": raw[0]["prompt"]}]
    assert ds[0]["chosen"][0]["content"] == raw[0]["chosen"] and ds[0]["rejected"][0]["content"] == raw[0]["rejected"]
    assert "order" not in ds.column_names and ds["pair_id"] == ds["sample_id"]


def test_ideation_pairwise_emits_both_orders_with_verdicts_for_every_pair():
    ds = load_ideation("bundled", "test", mode="pairwise")
    assert len(ds) == 80
    orders = {}
    for row in ds:
        orders.setdefault(row["pair_id"], set()).add(row["order"])
        assert row["chosen"][0]["content"] == f"Proposal {row['preferred']} is better."
        assert row["rejected"][0]["content"] == f"Proposal {'B' if row['preferred'] == 'A' else 'A'} is better."
        assert row["preferred"] == row["order"][0] if row["order"] == "AB" else row["preferred"] == "B"
    assert all(v == {"AB", "BA"} for v in orders.values()) and len(orders) == 40


def test_ideation_pairwise_prompt_never_leaks_labels_or_provenance():
    raw = pq.read_table(Path(sample_source("ideation")) / "train.parquet").to_pylist()
    banned = {"chosen", "rejected", "human_preference", "preferred", "shares_test_group", "split_group_id",
              "position_swapped", "response_a", "response_b", "generator"}
    for r in raw:
        banned |= {r["split_group_id"], r["context_id"], r["generator_a"], r["generator_b"], r["source_dimension_results"],
                   r["sample_id"]}
    for split in ("train", "validation", "test"):
        for row in load_ideation("bundled", split, mode="pairwise", group_disjoint=False):
            text = " ".join(m["content"] for m in row["prompt"]).lower()
            hits = [b for b in banned if b.lower() in text]
            assert not hits, (split, row["pair_id"], hits)
            # the proposals themselves are shown
            assert "proposal a:" in text and "proposal b:" in text


def test_ideation_group_disjoint_drops_shared_rows_and_validation_is_whole_groups():
    raw = pq.read_table(Path(sample_source("ideation")) / "train.parquet").to_pylist()
    shared = {r["sample_id"] for r in raw if r["shares_test_group"]}
    assert shared
    train = load_ideation("bundled", "train")
    val = load_ideation("bundled", "validation")
    assert not shared & set(train["sample_id"]) and not shared & set(val["sample_id"])
    assert len(val) > 0 and not set(train["split_group_id"]) & set(val["split_group_id"])
    by_group = Counter(r["split_group_id"] for r in raw)
    assert all(Counter(val["split_group_id"])[g] == by_group[g] for g in set(val["split_group_id"]))  # whole groups
    assert len(train) + len(val) + len(shared) == len(raw)
    loose = load_ideation("bundled", "train", group_disjoint=False)
    assert shared <= set(loose["sample_id"]) and not set(loose["split_group_id"]) & set(val["split_group_id"])
    assert load_ideation("bundled", "validation", seed=1)["split_group_id"] != val["split_group_id"] or len(val) == 0


def test_ideation_max_rows_caps_pairs_and_keeps_both_orders():
    ds = load_ideation("bundled", "train", mode="pairwise", max_rows=10)
    assert len(ds) == 20 and Counter(Counter(ds["pair_id"]).values()) == {2: 10}


# ------------------------------------------------------------------ RM-Bench

def test_bundled_rmbench_is_a_byte_faithful_prefix_of_the_real_files(rmbench_real_dir):
    sample = Path(sample_source("rmbench"))
    assert (sample / "NOTICE").read_text().count("ODC-By") >= 1
    for f in sorted(sample.glob("*_filtered.json")):
        real = json.loads((rmbench_real_dir / f.name).read_text())
        mine = json.loads(f.read_text())
        assert mine == real[: len(mine)] and len(mine) == 12
        assert f.read_text() == json.dumps(mine, indent=4, ensure_ascii=False)


def test_bundled_rmbench_rows_have_domain_ids_and_three_styles():
    ds = load_rmbench("bundled")
    assert len(ds) == 48 and Counter(ds["domain"]) == {d: 12 for d in REAL_ROWS}
    assert len(set(ds["id"])) == 48 and all(i.startswith(d + "/") for i, d in zip(ds["id"], ds["domain"]))
    assert all(len(c) == len(r) == 3 for c, r in zip(ds["chosen"], ds["rejected"]))


def test_real_rmbench_files_load_with_unique_domain_ids_and_style_order(rmbench_real_dir):
    ds = load_rmbench(str(rmbench_real_dir))
    assert Counter(ds["domain"]) == REAL_ROWS and len(ds) == sum(REAL_ROWS.values())
    assert len(set(ds["id"])) == len(ds)  # 23 raw ids occur in both chat and code
    raw_chat = json.loads((rmbench_real_dir / "chat_filtered.json").read_text())
    first = ds[0]
    assert first["id"] == f"chat/{raw_chat[0]['id']}" and first["chosen"] == raw_chat[0]["chosen"]
    # style order [concise, detailed plain, detailed markdown]: concise is shortest, markdown carries markup
    n = len(ds)
    shorter = sum(len(r["chosen"][0]) < len(r["chosen"][1]) for r in ds)
    assert shorter / n > 0.9
    md = sum(("**" in r["chosen"][2] or "#" in r["chosen"][2]) and "**" not in r["chosen"][1] for r in ds)
    assert md / n > 0.5


def test_rmbench_domain_filter_subset_folder_and_even_cap(rmbench_real_dir, tmp_path):
    ds = load_rmbench(str(rmbench_real_dir), domains=["chat", "safety-refuse"])
    assert set(ds["domain"]) == {"chat", "safety-refuse"}
    capped = load_rmbench(str(rmbench_real_dir), max_rows=40, seed=1)
    assert Counter(capped["domain"]) == {d: 10 for d in REAL_ROWS}
    (tmp_path / "code_filtered.json").write_bytes((rmbench_real_dir / "code_filtered.json").read_bytes())
    assert set(load_rmbench(str(tmp_path))["domain"]) == {"code"}


def test_rmbench_total_dataset_layout_with_string_ids(tmp_path):
    rows = json.loads((Path(sample_source("rmbench")) / "safety-refuse_filtered.json").read_text())
    total = [{"id": f"safety-refuse/{r['id']}", "prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"],
              "domain": "safety-refuse"} for r in rows]
    (tmp_path / "total_dataset.json").write_text(json.dumps(total))
    ds = load_rmbench(str(tmp_path))
    assert ds["id"] == [t["id"] for t in total] and set(ds["domain"]) == {"safety-refuse"}


# ------------------------------------------------------------------ mixture

def test_mixture_weights_and_rows_are_deterministic_and_labelled():
    comps = [{"dataset": "judgebias", "source": "bundled", "split": "train", "weight": 0.25, "categories": ["represent"]},
             {"dataset": "ideation", "source": "bundled", "split": "train", "rows": 30, "mode": "pairwise"}]
    a, b = load_mixture(comps, seed=7), load_mixture(comps, seed=7)
    assert Counter(a["dataset"]) == {"judgebias": round(0.25 * 149), "ideation": 30}
    assert a.column_names == ["prompt", "chosen", "rejected", "dataset", "group", "tie"]
    assert a["prompt"] == b["prompt"] and a["dataset"] == b["dataset"]
    assert load_mixture(comps, seed=8)["dataset"] != a["dataset"]
    assert isinstance(a.features["prompt"], datasets.List)


def test_mixture_component_takes_weight_or_rows_and_defaults_to_all_rows():
    with pytest.raises(ValueError, match="weight or rows, not both"):
        load_mixture([{"dataset": "judgebias", "source": "bundled", "split": "train", "weight": 1.0, "rows": 5}])
    whole = load_mixture([{"dataset": "judgebias", "source": "bundled", "split": "train"}])
    assert len(whole) == len(load_judgebias("bundled", split="train"))


def test_rmbench_folder_given_as_a_relative_path_with_dotdot(rmbench_real_dir, monkeypatch):
    # `--rmbench-source ../shared/data/rm-bench` from the repository root: ".." is not a hidden folder
    monkeypatch.chdir(rmbench_real_dir)
    ds = load_rmbench("../rm-bench")
    assert len(ds) == 129 + 228 + 284 + 157
