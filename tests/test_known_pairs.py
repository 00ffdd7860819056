"""`judgetrain pairs known`: pairs whose direction the factory knows, on worked items: the source against its error
copy in both orders (the verdict preferring the source chosen, whatever its position), a representational copy as a
tie or no pair, a copy that is its source or has no source rejected with its reason; the pointwise form ranks a
panel's evaluations of a copy against the source's median score; the rows are what `judgetrain.train` reads."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from helpers import read_jsonl

TEMPLATE = [{"role": "system", "content": "Judge the note. End with ```json {\"overall_score\": ...}```."},
            {"role": "user", "content": "Patient: {{patient}}\n\nNote:\n{{text}}"}]
SOURCE = [{"sample_id": 1, "patient": "Ann", "text": "Give aspirin 1000 mg daily."},
          {"sample_id": 2, "patient": "Bob", "text": "Give ibuprofen 2000 mg in all."},
          {"sample_id": 3, "patient": "Cy", "text": "Rest and fluids, 3000 mL."}]


def cli(*argv) -> int:
    from judgetrain.cli import main

    return main([str(a) for a in argv])


def factory(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The spec (an error table, a whitespace rewrite, the originals), its source and the items perturb made."""
    spec = {"name": "clinic", "template": TEMPLATE, "original": True,
            "operators": {"drug_swap": {"kind": "table", "category": "error", "pairs": {"aspirin": "warfarin",
                                                                                       "ibuprofen": "codeine"}},
                          "spacing": {"kind": "format", "category": "represent", "rewrite": "number_format"}},
            "sets": [{"name": "drug_swap"}, {"name": "spacing"}]}
    (tmp_path / "clinic.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SOURCE), encoding="utf-8")
    assert cli("perturb", "--source", tmp_path / "notes.jsonl", "--spec", tmp_path / "clinic.yaml",
               "--output_dir", tmp_path / "items") == 0
    return tmp_path / "clinic.yaml", tmp_path / "notes.jsonl", tmp_path / "items" / "items.jsonl"


def test_pairwise_pairs_prefer_the_source_in_both_orders_ties_and_rejects(tmp_path):
    spec, source, items_path = factory(tmp_path)
    items = read_jsonl(items_path)
    # a copy that is its source (an error label that changed nothing), and one of a sample the source lacks
    same = next(i for i in items if i["perturbation_set"] == "original_0pct" and i["sample_id"] == 1)
    items.append({**same, "perturbation_set": "drug_swap_noop_100pct", "perturbation_category": "error",
                  "perturbation_type": "drug_swap_noop"})
    items.append({**same, "sample_id": 9, "perturbation_set": "drug_swap_100pct", "perturbation_category": "error"})
    items_path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    out = tmp_path / "pairs"
    assert cli("pairs", "known", "--items", items_path, "--source", source, "--spec", spec, "--output_dir", out,
               "--validation_fraction", "0") == 0
    rows = pq.read_table(out / "train.parquet").to_pylist()
    errors = [r for r in rows if r["perturbation_category"] == "error"]
    # samples 1 and 2 hold a drug of the table; sample 3 none (perturb rejected it): 2 copies x 2 orders
    assert sorted((r["sample_id"], r["order"], r["label"]) for r in errors) == [
        (1, "AB", "A>B"), (1, "BA", "B>A"), (2, "AB", "A>B"), (2, "BA", "B>A")]
    for r in errors:
        prompt, chosen, rejected = (json.loads(r[k]) for k in ("prompt", "chosen", "rejected"))
        user = prompt[-1]["content"]
        a = user.split("[The Start of Assistant A's Answer]\n")[1].split("\n[The End")[0]
        b = user.split("[The Start of Assistant B's Answer]\n")[1].split("\n[The End")[0]
        source_text = SOURCE[r["sample_id"] - 1]["text"]
        assert (a == source_text) == (r["order"] == "AB") and (b == source_text) == (r["order"] == "BA")
        assert "warfarin" in (b if r["order"] == "AB" else a) or "codeine" in (b if r["order"] == "AB" else a)
        assert user.startswith(f"[User Question]\nPatient: {SOURCE[r['sample_id'] - 1]['patient']}\n\nNote:")
        assert chosen == [{"role": "assistant", "content": "[[A>B]]" if r["order"] == "AB" else "[[B>A]]"}]
        assert rejected == [{"role": "assistant", "content": "[[B>A]]" if r["order"] == "AB" else "[[A>B]]"}]
    ties = [r for r in rows if r["perturbation_category"] == "represent"]
    assert ties and all(json.loads(r["chosen"])[0]["content"] == "[[A=B]]" for r in ties)
    per_copy = {(t["sample_id"], t["order"]): sorted(json.loads(r["rejected"])[0]["content"] for r in ties
                                                      if (r["sample_id"], r["order"]) == (t["sample_id"], t["order"]))
                for t in ties}
    assert all(v == ["[[A>B]]", "[[B>A]]"] for v in per_copy.values())
    assert {o for _, o in per_copy} == {"AB", "BA"}
    rejects = read_jsonl(out / "rejects.jsonl")
    assert sorted((r["reason"], r["sample_id"]) for r in rejects) == [("no_source", 9), ("unchanged", 1)]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["total_pairs"] == len(rows) == 4 + len(ties)
    assert stats["rejects_by_reason"] == {"no_source": 1, "unchanged": 1}
    assert stats["pairs_by_label"] == {"A=B": len(ties), "A>B": 2, "B>A": 2}

    # ties: drop writes no pair for a representational copy, and counts it
    assert cli("pairs", "known", "--items", items_path, "--source", source, "--spec", spec, "--output_dir",
               tmp_path / "dropped", "--ties", "drop", "--validation_fraction", "0") == 0
    dropped = json.loads((tmp_path / "dropped" / "stats.json").read_text())
    assert dropped["total_pairs"] == 4 and dropped["dropped"]["represent_no_pair"] == len(ties) // 4

    # the rows are what training reads: the preference dataset of a recipe
    from judgetrain.data.mixture import load_mixture

    ds = load_mixture([{"dataset": "preference", "source": str(out), "split": "train"}], seed=0)
    assert len(ds) == len(rows) and ds[0]["prompt"][0]["role"] == "system"


def evaluation(item: dict, judge: str, score: float) -> dict:
    return {**item, "judge_model": judge, "evaluation": f"fine.\n```json\n{{\"overall_score\": {score}}}\n```"}


def test_pointwise_pairs_rank_a_copys_evaluations_against_the_source_score(tmp_path):
    _, _, items_path = factory(tmp_path)
    items = {(i["sample_id"], i["perturbation_set"]): i for i in read_jsonl(items_path)}
    scores = {  # (sample, set) -> the scores of three sampled evaluations
        (1, "original_0pct"): [4.0, 4.5, 4.0], (1, "drug_swap_100pct"): [2.0, 4.5, 4.0],
        (1, "spacing_100pct"): [4.0, 2.0, 4.5],
        (2, "drug_swap_100pct"): [1.0, 5.0, 3.0],  # sample 2 has no evaluation of its source
    }
    panel = [evaluation(items[key], f"s{k}", s) for key, ss in scores.items() for k, s in enumerate(ss)]
    panel.append({**evaluation(items[(1, "spacing_100pct")], "s9", 0), "evaluation": "no score here"})
    (tmp_path / "panel.jsonl").write_text("".join(json.dumps(r) + "\n" for r in panel), encoding="utf-8")
    out = tmp_path / "pointwise"
    assert cli("pairs", "known", "--form", "pointwise", "--evaluations", tmp_path / "panel.jsonl", "--output_dir", out,
               "--validation_fraction", "0") == 0
    rows = pq.read_table(out / "train.parquet").to_pylist()
    got = sorted((r["perturbation_category"], r["score_chosen"], r["score_rejected"], r["anchor_score"]) for r in rows)
    # anchor = median(4, 4.5, 4) = 4; error: 2.0 (below) against 4.5 and 4.0 (not below); represent: 4.0 and 4.5
    # (within 0.5) against 2.0 (2 away)
    assert got == [("error", 2.0, 4.0, 4.0), ("error", 2.0, 4.5, 4.0),
                   ("represent", 4.0, 2.0, 4.0), ("represent", 4.5, 2.0, 4.0)]
    rejects = read_jsonl(out / "rejects.jsonl")
    reasons = Counter(r["reason"] for r in rejects)
    assert reasons.pop("no_source_score") == 3 and sum(reasons.values()) == 1  # sample 2; the unreadable score
    assert next(r for r in rejects if r["reason"] != "no_source_score")["judge_model"] == "s9"
    stats = json.loads((out / "stats.json").read_text())
    assert stats["total_pairs"] == 4 and stats["rejected_rows"] == 4 and stats["score_delta_mean"] == pytest.approx(2.25)
    from judgetrain.data.mixture import load_mixture

    ds = load_mixture([{"dataset": "preference", "source": str(out), "split": "train"}], seed=0)
    assert len(ds) == 4  # the pairs build schema, read as preference rows


def test_response_pairs_put_the_question_first_prefer_the_source_to_its_error_copy_and_tie_its_rewrite(tmp_path):
    spec, source, items_path = factory(tmp_path)
    out = tmp_path / "pairs"
    assert cli("pairs", "known", "--form", "response", "--items", items_path, "--source", source, "--spec", spec,
               "--output_dir", out, "--validation_fraction", "0") == 0
    rows = pq.read_table(out / "train.parquet").to_pylist()
    # one row per error copy (samples 1 and 2 hold a drug of the table), a win; one per rewrite, a tie
    wins = [r for r in rows if not r["tie"]]
    ties = [r for r in rows if r["tie"]]
    assert sorted(r["sample_id"] for r in wins) == [1, 2] and {r["perturbation_category"] for r in wins} == {"error"}
    assert ties and {r["perturbation_category"] for r in ties} == {"represent"}
    for r in rows:
        sample = SOURCE[r["sample_id"] - 1]
        assert json.loads(r["prompt"]) == [{"role": "user", "content": f"Patient: {sample['patient']}\n\nNote:"}]
        assert json.loads(r["chosen"]) == [{"role": "assistant", "content": sample["text"]}]  # the source, always
        rejected = json.loads(r["rejected"])[0]["content"]
        assert rejected != sample["text"]
        assert ("warfarin" in rejected or "codeine" in rejected) == (not r["tie"])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["form"] == "response" and stats["ties"] == "tie"
    assert stats["pairs_by_label"] == {"response": 2, "tie": len(ties)} and "represent_no_pair" not in stats["dropped"]
    from judgetrain.data.preference import load_preference

    ds = load_preference(str(out), split="train")  # what training reads: the tie column as bools
    assert len(ds) == len(rows) and sorted(ds["tie"]) == [False] * 2 + [True] * len(ties)
    # ties drop: the rewrites make no pair, counted
    assert cli("pairs", "known", "--form", "response", "--items", items_path, "--source", source, "--spec", spec,
               "--output_dir", tmp_path / "dropped", "--validation_fraction", "0", "--ties", "drop") == 0
    dropped = pq.read_table(tmp_path / "dropped" / "train.parquet").to_pylist()
    assert len(dropped) == 2 and not any(r["tie"] for r in dropped)
    assert json.loads((tmp_path / "dropped" / "stats.json").read_text())["dropped"]["represent_no_pair"] == len(ties)


def test_pairwise_form_without_its_source_is_refused(tmp_path, capsys):
    _, _, items_path = factory(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli("pairs", "known", "--items", items_path, "--output_dir", tmp_path / "x")
    assert exit_.value.code == 2 and not (tmp_path / "x").exists()
    assert "needs --items, --source and --spec" in capsys.readouterr().err


def test_a_bad_preference_row_is_named_by_file_row_and_field(tmp_path):
    from judgetrain.data.preference import load_preference
    from judgetrain.data.validate import DataValidationError

    good = {"prompt": [{"role": "user", "content": "Which?"}], "chosen": [{"role": "assistant", "content": "[[A>B]]"}],
            "rejected": [{"role": "assistant", "content": "[[B>A]]"}], "sample_id": 4}
    bad = {**good, "rejected": good["chosen"]}
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(DataValidationError, match=r"train.jsonl \[split=train\] row 1, field 'rejected': chosen "
                                                  r"identical to rejected"):
        load_preference(str(path))
    ds = load_preference(str(path), on_bad_row="skip", rejects_path=str(tmp_path / "rejects.jsonl"))
    assert len(ds) == 1 and ds[0]["sample_id"] == "4" and len(read_jsonl(tmp_path / "rejects.jsonl")) == 1


@pytest.mark.parametrize("form", ["pairwise", "response"])
@pytest.mark.parametrize("category", ["Error", None])
def test_an_item_with_a_missing_or_misspelt_category_is_a_bad_row_never_a_tie(tmp_path, capsys, category, form):
    """An error copy whose category is misspelt ("Error") or missing used to pair as a tie (A=B, --ties drop
    dropping nothing): it is a bad row named by file, row and field, exit 2 in one line, no pair written, and the
    message advises no option the command refuses."""
    spec, source, items_path = factory(tmp_path)
    items = read_jsonl(items_path)
    k = next(k for k, i in enumerate(items) if i["perturbation_category"] == "error")
    if category is None:
        del items[k]["perturbation_category"]
    else:
        items[k]["perturbation_category"] = category
    items_path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    out = tmp_path / "pairs"
    for ties in ("tie", "drop"):
        capsys.readouterr()
        assert cli("pairs", "known", "--form", form, "--items", items_path, "--source", source, "--spec", spec,
                   "--output_dir", out, "--ties", ties) == 2
        err = capsys.readouterr().err.strip().splitlines()  # the entry's one line: "judgetrain pairs known: ..."
        assert len(err) == 1 and err[0].startswith("judgetrain pairs known: "), err
        assert f"items.jsonl [split=train] row {k}, field 'perturbation_category': {category!r} is not one of the " \
               "spec's categories (error, represent) (1 bad row(s)): fix the items" in err[0]
        assert "on_bad_row" not in err[0] and not (out / "train.parquet").exists()
