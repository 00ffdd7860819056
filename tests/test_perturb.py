"""`judgetrain perturb`: the spec (unknown keys refused with the nearest one, the packs), the rule operators (tables
on whole words with case, numbers with units, format rewrites, rates with a floor of one edit), the checks and the
rejects, bad source rows named before any model loads, byte-identical output for a seed, the items read by
`judgetrain judge`'s own reader; model rewrites on the judge engine (the tiny judge, a local OpenAI-compatible
server), resumed without a rewrite made twice; (slow) two processes killed and resumed, and the loop source ->
perturb -> judge -> pairs build -> DPO -> the trained judge; (extended) SmolLM2-135M-Instruct's rewrites."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from helpers import REPO, read_jsonl, train_on_pairs

RECIPES = REPO / "judgetrain" / "data" / "samples" / "recipes"
TEMPLATE = [{"role": "system", "content": "Judge the note. End with ```json {\"overall_score\": ...}```."},
            {"role": "user", "content": "Patient: {{patient}}\n\nNote:\n{{text}}"}]


def perturb(*argv) -> int:
    from judgetrain.cli import main  # the entry: bad input is its one line, exit code 2

    return main(["perturb", *(str(a) for a in argv)])


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def materials_source(path: Path, split: str = "validation") -> Path:
    from judgetrain.perturb.source import bundled_recipes

    return write_jsonl(path, bundled_recipes(split))


def spec_of(tmp_path: Path, operators: dict, sets: list, **extra) -> Path:
    spec = {"name": "clinic", "template": TEMPLATE, "operators": operators, "sets": sets, **extra}
    path = tmp_path / "clinic.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def parsed(data: dict):
    from judgetrain.perturb.spec import parse_spec

    return parse_spec({"template": TEMPLATE, **data})


def edit(spec_data: dict, name: str, text: str, rate: float = 1.0, seed: int = 0):
    from judgetrain.perturb.edits import apply, pick
    from judgetrain.perturb.operators import Rules

    spec = parsed(spec_data)
    rng = random.Random(seed)
    return apply(text, pick(Rules(spec).spans(name, text), rate, rng), rng)


# ------------------------------------------------------------------------------------------------ the spec
@pytest.mark.parametrize("data, message", [
    ({"operators": {"a": {"kind": "table", "catgory": "error", "pairs": {"x": "y"}}}, "sets": [{"name": "a"}]},
     "operators.a: unknown key 'catgory'; did you mean 'category'?"),
    ({"oprators": {}, "sets": []}, "unknown key 'oprators'; did you mean 'operators'?"),
    ({"operators": {"dose": {"kind": "table", "category": "error", "pairs": {"x": "y"}}}, "sets": [{"name": "dos"}]},
     "sets[0] (dos): no operator 'dos'; did you mean 'dose'?"),
    ({"operators": {"a": {"kind": "table", "category": "error", "table": "drugz"}}, "tables": {"drugs": {"a": "b"}},
      "sets": [{"name": "a"}]}, "no table 'drugz' under tables; did you mean 'drugs'?"),
    ({"operators": {"a": {"kind": "table", "category": "error", "pairs": {"x": "y"}},
                    "b": {"kind": "format", "category": "represent", "rewrite": "whitespace"}},
      "sets": [{"name": "ab", "operators": ["a", "b"]}]}, "mix the categories error and represent"),
    ({"operators": {"a": {"kind": "numeric", "category": "error", "mode": "convert"}}, "units": {"t": {"s": 1, "h": 3600}},
      "sets": [{"name": "a"}]}, "a correct unit conversion is represent"),
    ({"operators": {"a": {"kind": "table", "category": "error", "pairs": {"x": "y"}}}, "sets": [{"name": "a", "rates": [0]}]},
     "rates must be numbers in (0, 1]"),
])
def test_a_bad_spec_is_refused_naming_the_key_and_the_nearest_valid_one(data, message):
    from judgetrain.perturb.spec import SpecError

    with pytest.raises(SpecError) as err:
        parsed(data)
    assert message in str(err.value)


def test_the_packs_load_the_materials_pack_has_the_17_judgebias_sets(tmp_path):
    from judgetrain.data.pairs import ERROR_SETS, REPRESENT_SETS
    from judgetrain.perturb.spec import SpecError, load_spec, pack_names

    assert {"materials", "style"} <= set(pack_names())
    spec = load_spec("materials")
    names = [s.set_name(r) for s in spec.sets for r in s.rates]
    assert len(names) == 17 and set(names) == set(ERROR_SETS) | set(REPRESENT_SETS)  # pairs build's 17 sets
    assert {s.name: s.category for s in spec.sets}["llm_to_formula"] == "represent"
    style = load_spec("style")
    assert {s.name for s in style.sets} >= {"concise", "detailed_plain", "detailed_markdown", "markdown_to_plain"}
    assert load_spec("materials", seed=7).seed == 7
    with pytest.raises(SpecError, match="packs: .*materials"):
        load_spec("no-such-pack")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n!!python/object/apply:os.system ['echo hi']: 1\n")
    with pytest.raises(SpecError, match="cannot read it"):  # safe YAML: no Python objects
        load_spec(str(bad))


def test_a_table_file_next_to_the_spec(tmp_path):
    from judgetrain.perturb.spec import load_spec

    (tmp_path / "drugs.tsv").write_text("# brand\tgeneric swap\nwarfarin\theparin\nmetformin\tglipizide\n")
    path = spec_of(tmp_path, {"drug_swap": {"kind": "table", "category": "error", "file": "drugs.tsv",
                                            "case": "preserve"}}, [{"name": "drug_swap"}])
    spec = load_spec(str(path))
    assert spec.operators["drug_swap"].options["pairs"] == {"warfarin": "heparin", "metformin": "glipizide"}


# ------------------------------------------------------------------------------------------------ rule operators
def test_table_substitution_matches_whole_words_and_keeps_case():
    ops = {"antonym": {"kind": "table", "category": "error", "pairs": {"heat": "cool"}, "case": "preserve"},
           "element": {"kind": "table", "category": "error", "pairs": {"Co": "Ni", "Co3O4": "Ni3O4"}},
           "dose": {"kind": "table", "category": "error", "match": "pattern", "pairs": {r"(\d+) mg": r"\g<1>0 mg"}}}
    spec = {"operators": ops, "sets": [{"name": k} for k in ops]}
    text, changes = edit(spec, "antonym", "Heat it, preheat the oven, then HEAT and heat.")
    assert text == "Cool it, preheat the oven, then COOL and cool."
    assert [(c.before, c.after, c.position) for c in changes] == [("Heat", "Cool", 0), ("HEAT", "COOL", 32),
                                                                  ("heat", "cool", 41)]
    text, _ = edit(spec, "element", "Co3O4 and Co, not CoO or co.")
    assert text == "Ni3O4 and Ni, not CoO or co."  # exact case: "co" is not cobalt
    text, _ = edit(spec, "dose", "give 5 mg twice")
    assert text == "give 50 mg twice"


def test_numbers_scale_shift_swap_units_or_convert_them_correctly():
    units = {"temperature": {"°C": [1, 273.15], "K": [1, 0], "°F": [0.5555555556, 255.3722222]}}
    ops = {"scale": {"kind": "numeric", "category": "error", "mode": "scale", "factor": [2, 2], "require_unit": True},
           "shift": {"kind": "numeric", "category": "error", "mode": "shift", "shift": [5, 5]},
           "shift_bare": {"kind": "numeric", "category": "error", "mode": "shift", "shift": [5, 5], "require_unit": False},
           "swap": {"kind": "numeric", "category": "error", "mode": "unit_swap"},
           "convert": {"kind": "numeric", "category": "represent", "mode": "convert"}}
    spec = {"operators": ops, "sets": [{"name": k} for k in ops], "units": units}
    text = "1. Heat LiCoO2 at 100 °C for 12 h, then 37.5 °C."
    assert edit(spec, "scale", text)[0] == "1. Heat LiCoO2 at 200 °C for 12 h, then 75.0 °C."  # 12 has no unit here
    assert edit(spec, "shift", text)[0] == "1. Heat LiCoO2 at 105 °C for 12 h, then 42.5 °C."  # no unit: no edit
    assert edit(spec, "shift_bare", text)[0] == "1. Heat LiCoO2 at 105 °C for 17 h, then 42.5 °C."  # the marker kept
    assert edit(spec, "shift_bare", "Step 2: add 5 g.")[0] == "Step 2: add 10 g."  # a step's number is a label
    swapped, changes = edit(spec, "swap", "at 100 °C")
    assert swapped in ("at 100 K", "at 100 °F") and changes[0].before == "100 °C"
    converted = {edit(spec, "convert", "at 100 °C", seed=s)[0] for s in range(20)}
    assert converted == {"at 373.15 K", "at 212 °F"}  # exact: 100 °C is 373.15 K


def test_format_rewrites_without_a_model():
    ops = {"plain": {"kind": "format", "category": "represent", "rewrite": "markdown_to_plain"},
           "order": {"kind": "format", "category": "represent", "rewrite": "list_order"},
           "numbers": {"kind": "format", "category": "represent", "rewrite": "number_format"},
           "md": {"kind": "format", "category": "represent", "rewrite": "plain_to_markdown"}}
    spec = {"operators": ops, "sets": [{"name": k} for k in ops]}
    text, _ = edit(spec, "plain", "## Dose\n- take **two** tablets\n- see [the leaflet](http://x)")
    assert text == "Dose\ntake two tablets\nsee the leaflet (http://x)"  # the address kept
    listed = "Needs:\n1. salt\n2. water\n3. sugar\nDone."
    text, changes = edit(spec, "order", listed)
    assert text != listed and text.splitlines()[1:4] != listed.splitlines()[1:4]
    assert [line[:3] for line in text.splitlines()[1:4]] == ["1. ", "2. ", "3. "]  # the numbers stay in place
    assert sorted(line[3:] for line in text.splitlines()[1:4]) == ["salt", "sugar", "water"] and len(changes) == 1
    assert edit(spec, "numbers", "1500 mL and 2,000 g, 0.5 h")[0] == "1,500 mL and 2000 g, 0.5 h"
    assert edit(spec, "md", "Steps:\nmix it\nstir it")[0] == "**Steps:**\n- mix it\n- stir it"


def test_a_rate_is_a_share_of_the_eligible_spans_with_a_floor_of_one_edit():
    from judgetrain.perturb.edits import Span, pick

    spans = [Span(i * 2, i * 2 + 1, "x", lambda r: "y") for i in range(40)]
    assert [len(pick(spans, rate, random.Random(0))) for rate in (0.001, 0.01, 0.05, 0.1, 0.15, 1.0)] == \
        [1, 1, 2, 4, 6, 40]  # 40 x rate, rounded, at least one
    overlapping = [Span(0, 5, "a", lambda r: "y"), Span(3, 8, "b", lambda r: "y"), Span(8, 9, "c", lambda r: "y")]
    assert [s.kind for s in pick(overlapping, 1.0, random.Random(0))] == ["a", "c"]


def test_an_edit_not_where_its_operator_said_is_caught():
    from judgetrain.perturb.edits import Change, misplaced

    source = "heat to 100 C"
    assert misplaced(source, "cool to 100 C", [Change("a", "heat", "cool", 0)]) is None
    assert "does not hold 'heat'" in misplaced(source, "cool to 100 C", [Change("a", "heat", "cool", 3)])
    assert "after the last edit" in misplaced(source, "cool to 200 C", [Change("a", "heat", "cool", 0)])
    assert "changes nothing" in misplaced(source, source, [Change("a", "heat", "heat", 0)])


# ------------------------------------------------------------------------------------------------ the command
def test_rule_sets_give_the_items_judge_reads_seeded_byte_identical_with_rejects_and_summary(tmp_path, capsys):
    """The materials pack without a model (its model sets made by their stand-ins) over the 12 bundled recipes:
    every item read back by `judgetrain judge`'s item reader, each change where it says, the same bytes for the same
    seed and other bytes for another, and every sample x set either an item or a reject with its reason."""
    from judgetrain.judge.items import read_items

    source = materials_source(tmp_path / "recipes.jsonl")
    out = tmp_path / "a"
    assert perturb("--source", source, "--spec", "materials", "--output_dir", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    items, rejects = read_jsonl(out / "items.jsonl"), read_jsonl(out / "rejects.jsonl")
    assert summary["samples"] == 12 and len(summary["sets"]) == 17
    assert len(items) + len(rejects) == 12 * 17 and summary["items"] == len(items)
    for name, s in summary["sets"].items():
        assert s["items"] + s["rejected"] == 12 and sum(s["rejects"].values()) == s["rejected"]
        mine = [i for i in items if i["perturbation_set"] == name]
        assert len(mine) == s["items"]
        if mine:
            assert s["edits_per_item"]["min"] == min(len(i["perturbation_changes"]) for i in mine) >= 1
    assert {r["reason"] for r in rejects} == {"no_eligible_span"}  # samples without an element of the table, ...
    assert summary["sets"]["all_error_perturbation_1pct"]["edits_per_item"] == {"mean": 1.0, "min": 1, "max": 1}
    assert summary["sets"]["all_error_perturbation_15pct"]["edits_per_item"]["mean"] > 3
    assert summary["sets"]["llm_to_formula_100pct"]["method"] == "stand_in"

    item_set = read_items(str(out / "items.jsonl"))  # the judge's own reader: every row an item
    assert len(item_set.items) == len(items) and item_set.n_rejected == 0
    first = item_set.items[0]
    assert set(first.columns) >= {"sample_id", "perturbation_set", "perturbation_category", "perturbation_rate",
                                  "perturbation_changes"}
    sources = {r["sample_id"]: r for r in read_jsonl(source)}
    for row in items:
        user = row["prompt"][-1]["content"]
        target, _, text = user.partition("\n\n## AI-generated recipe\n")
        assert target == "## Target material\n" + sources[row["sample_id"]]["target"]
        shift = 0
        for c in row["perturbation_changes"]:  # each edit: before in the source, after in the item, where it says
            assert sources[row["sample_id"]]["text"][c["position"]: c["position"] + len(c["before"])] == c["before"]
            assert text[c["position"] + shift: c["position"] + shift + len(c["after"])] == c["after"]
            shift += len(c["after"]) - len(c["before"])
        assert row["perturbation_category"] == ("error" if "error" in row["perturbation_set"] or
                                                row["perturbation_type"] in ("element_substitution",
                                                                             "numerical_perturbation",
                                                                             "equipment_substitution",
                                                                             "action_antonym") else "represent")

    assert perturb("--source", source, "--spec", "materials", "--output_dir", tmp_path / "b") == 0
    assert perturb("--source", source, "--spec", "materials", "--seed", "1", "--output_dir", tmp_path / "c") == 0
    for name in ("items.jsonl", "rejects.jsonl", "summary.json"):
        assert (out / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (out / "items.jsonl").read_bytes() != (tmp_path / "c" / "items.jsonl").read_bytes()
    # one set asked for alone: its items are those of the full run (each item draws from its own seed)
    assert perturb("--source", source, "--spec", "materials", "--sets", "all_error_perturbation", "--output_dir",
                   tmp_path / "d") == 0
    alone = read_jsonl(tmp_path / "d" / "items.jsonl")
    assert alone == [i for i in items if i["perturbation_type"] == "all_error_perturbation"] and len(alone) == 60
    assert "judgetrain perturb: materials (seed 0), per set" in capsys.readouterr().out


def test_declared_checks_reject_with_reasons_and_the_original_is_its_own_set(tmp_path):
    ops = {"to_plain": {"kind": "format", "category": "represent", "rewrite": "markdown_to_plain",
                        "checks": {"length_ratio": [0.8, 1.0]}},
           "swap": {"kind": "table", "category": "error", "pairs": {"warfarin": "heparin"}}}
    spec = spec_of(tmp_path, ops, [{"name": "to_plain"}, {"name": "swap"}], original=True)
    rows = [{"sample_id": 1, "patient": "A", "text": "Take **warfarin** 5 mg."},
            {"sample_id": 2, "patient": "B", "text": "## Hi\nwarfarin"},
            {"sample_id": 3, "patient": "C", "text": "Rest."}]
    out = tmp_path / "out"
    assert perturb("--source", write_jsonl(tmp_path / "notes.jsonl", rows), "--spec", spec, "--output_dir", out) == 0
    items = {(i["sample_id"], i["perturbation_set"]): i for i in read_jsonl(out / "items.jsonl")}
    rejects = {(r["sample_id"], r["perturbation_set"]): r for r in read_jsonl(out / "rejects.jsonl")}
    assert set(items) == {(1, "original_0pct"), (2, "original_0pct"), (3, "original_0pct"), (1, "to_plain_100pct"),
                          (1, "swap_100pct"), (2, "swap_100pct")}
    original = items[(1, "original_0pct")]
    assert (original["perturbation_category"], original["perturbation_rate"], original["perturbation_changes"]) == \
        ("represent", 0.0, [])
    assert original["prompt"][1]["content"] == "Patient: A\n\nNote:\nTake **warfarin** 5 mg."
    assert items[(1, "swap_100pct")]["prompt"][1]["content"] == "Patient: A\n\nNote:\nTake **heparin** 5 mg."
    assert rejects[(2, "to_plain_100pct")]["reason"] == "length_ratio"  # 11 / 14 characters: 0.79
    assert rejects[(3, "to_plain_100pct")]["reason"] == "no_eligible_span"
    assert rejects[(3, "swap_100pct")]["reason"] == "no_eligible_span"
    summary = json.loads((out / "summary.json").read_text())["sets"]
    assert summary["to_plain_100pct"]["rejects"] == {"length_ratio": 1, "no_eligible_span": 1}
    assert summary["original_0pct"]["items"] == 3


def test_bad_source_rows_are_named_by_file_row_and_field_before_any_model_loads(tmp_path, capsys):
    ops = {"swap": {"kind": "table", "category": "error", "pairs": {"warfarin": "heparin"}},
           "rewrite": {"kind": "model", "category": "represent", "instruction": "Rewrite it."}}
    spec = spec_of(tmp_path, ops, [{"name": "swap"}, {"name": "rewrite"}])
    good = {"sample_id": 1, "patient": "A", "text": "warfarin"}
    cases = [({"sample_id": 2, "patient": "B"}, "row 1, field 'text': missing column"),
             ({"sample_id": 2, "text": "warfarin"}, "row 1, field 'patient': missing value for the template's "
                                                    "{{patient}}"),
             ({"sample_id": 1, "patient": "B", "text": "x"}, "row 1, field 'sample_id': duplicated sample_id 1"),
             ({"sample_id": 2, "patient": "B", "text": "x", "prompt_template": [{"role": "user", "content": "no"}]},
              "row 1, field 'prompt_template': no message holds {{text}}")]
    for bad, message in cases:
        source = write_jsonl(tmp_path / "notes.jsonl", [good, bad])
        capsys.readouterr()
        # a model that does not exist: refused on the rows before anything tries to load it
        assert perturb("--source", source, "--spec", spec, "--model", "no/such-model", "--output_dir",
                       tmp_path / "out") == 2
        err = capsys.readouterr().err
        assert f"{source} [split=train] {message}" in err, err
        assert not (tmp_path / "out" / "rewrites").exists()
    source = write_jsonl(tmp_path / "notes.jsonl", [good, {"sample_id": 2}, {**good, "sample_id": 3,
                         "prompt_template": json.dumps([{"role": "user", "content": "Own: {{text}}"}])}])
    assert perturb("--source", source, "--spec", spec, "--sets", "swap", "--on_bad_row", "skip", "--output_dir",
                   tmp_path / "skip") == 0
    skipped = read_jsonl(tmp_path / "skip" / "source_rejects.jsonl")
    assert [(r["row"], r["field"]) for r in skipped] == [(1, "text")]
    items = read_jsonl(tmp_path / "skip" / "items.jsonl")
    assert [i["prompt"][-1]["content"] for i in items] == ["Patient: A\n\nNote:\nheparin", "Own: heparin"]
    assert perturb("--source", source, "--spec", spec, "--sets", "swapp", "--output_dir", tmp_path / "x") == 2
    assert "no set 'swapp'; did you mean 'swap'?" in capsys.readouterr().err
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([good, {**good, "sample_id": 2, "text": "no drug"}]), tmp_path / "notes.parquet")
    assert perturb("--source", tmp_path / "notes.parquet", "--spec", spec, "--sets", "swap", "--output_dir",
                   tmp_path / "parquet") == 0  # a parquet source: the same rows, the same checks
    assert [i["sample_id"] for i in read_jsonl(tmp_path / "parquet" / "items.jsonl")] == [1]
    assert [r["reason"] for r in read_jsonl(tmp_path / "parquet" / "rejects.jsonl")] == ["no_eligible_span"]


# ------------------------------------------------------------------------------------------------ model rewrites
def model_spec(tmp_path: Path) -> Path:
    ops = {"reword": {"kind": "model", "category": "represent", "instruction": "Reword {{percent}}% of it.",
                      "checks": {"numbers": True, "length_ratio": [0.5, 4.0]}},
           "shorten": {"kind": "model", "category": "represent", "instruction": "Shorten it.",
                       "checks": {"length_ratio": [0.1, 0.9]}},
           "swap": {"kind": "table", "category": "error", "pairs": {"warfarin": "heparin"}}}
    return spec_of(tmp_path, ops, [{"name": "reword", "rates": [0.1]}, {"name": "shorten"}, {"name": "swap"}])


NOTES = [{"sample_id": i, "patient": f"P{i}", "text": f"Give warfarin {i + 1} mg at {8 + i} h daily."}
         for i in range(4)]


def test_model_rewrites_run_on_the_judge_engine_and_are_checked(tmp_path, monkeypatch, capsys):
    """An OpenAI-compatible server on localhost (it answers the user message reversed word by word) as the
    rewriting model, through `judgetrain judge`'s engine: one request per sample x model set, the rewrite as the
    item's text with its changes, checked (the reversal keeps the numbers and is longer: `reword` passes,
    `shorten` is rejected by its length ratio); the same command again makes no request and the same bytes."""
    from openai_server import ScriptedServer

    spec, source = model_spec(tmp_path), write_jsonl(tmp_path / "notes.jsonl", NOTES)
    out = tmp_path / "out"
    monkeypatch.setenv("JT_REWRITE_KEY", "sk-rewrite-secret")
    with ScriptedServer(model="rewriter", key="sk-rewrite-secret") as server:
        model = f"endpoint={server.base_url},model=rewriter,key_env=JT_REWRITE_KEY,name=hosted"
        args = ["--source", source, "--spec", spec, "--model", model, "--output_dir", out, "--max_new_tokens", 200]
        assert perturb(*args) == 0
        assert len(server.requests) == 8
        sent = [r["messages"] for r in server.requests]
        first = perturb(*args)
        assert first == 0 and len(server.requests) == 8  # resumed: every rewrite is in the done index
    users = sorted(m[-1]["content"] for m in sent)
    assert "Reword 10% of it.\n\nText:\nGive warfarin 1 mg at 8 h daily." in users
    items, rejects = read_jsonl(out / "items.jsonl"), read_jsonl(out / "rejects.jsonl")
    reword = [i for i in items if i["perturbation_set"] == "reword_10pct"]
    assert len(reword) == 4 and all(i["perturbation_method"] == "model:hosted" for i in reword)
    text = reword[0]["prompt"][-1]["content"].split("Note:\n", 1)[1]
    assert text == " ".join(reversed("Reword 10% of it.\n\nText:\nGive warfarin 1 mg at 8 h daily.".split()))
    assert reword[0]["perturbation_changes"] and reword[0]["perturbation_changes"][0]["kind"] == "reword"
    assert [r["reason"] for r in rejects] == ["length_ratio"] * 4
    summary = json.loads((out / "summary.json").read_text())["sets"]
    assert summary["shorten_100pct"]["rejects"] == {"length_ratio": 4} and summary["swap_100pct"]["items"] == 4
    assert json.loads((out / "rewrites" / "summary.json").read_text())["hosted"]["rows"] == 8
    for path in out.rglob("*"):
        assert not path.is_file() or "sk-rewrite-secret" not in path.read_text(errors="replace")


def test_a_local_model_rewrites_through_the_engine_and_what_fails_is_counted(tmp_path, tiny_judge):
    """The tiny judge (random weights) as the rewriting model: every model item is generated once, and what it
    writes either passes the checks or is a reject with its reason; without --model the model sets without a
    stand-in are left out and said so."""
    spec, source = model_spec(tmp_path), write_jsonl(tmp_path / "notes.jsonl", NOTES)
    out = tmp_path / "out"
    assert perturb("--source", source, "--spec", spec, "--model", "tiny-judge", "--max_new_tokens", 8,
                   "--output_dir", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads((out / "rewrites" / "summary.json").read_text())["tiny-judge"]["rows"] == 8
    for name in ("reword_10pct", "shorten_100pct"):
        s = summary["sets"][name]
        assert s["items"] + s["rejected"] == 4 and s["method"] == "model"
    reasons = Counter(r["reason"] for r in read_jsonl(out / "rejects.jsonl"))
    assert sum(reasons.values()) == summary["rejected"] and set(reasons) <= {
        "empty", "cut_at_max_new_tokens", "unchanged", "numbers_lost", "length_ratio"}
    no_model = tmp_path / "no-model"
    assert perturb("--source", source, "--spec", spec, "--output_dir", no_model) == 0
    summary = json.loads((no_model / "summary.json").read_text())
    assert set(summary["skipped_sets"]) == {"reword_10pct", "shorten_100pct"} and summary["items"] == 4


# ------------------------------------------------------------------------------------------------ kills (slow)
def _done(out: Path) -> Counter:
    from judgetrain.judge.output import read_done

    return Counter(i for c in read_done(out / "rewrites") for b in c.batches for i in b["items"])


@pytest.mark.slow
def test_model_rewrites_on_two_processes_killed_then_resumed_make_each_rewrite_once(tmp_path, tiny_judge):
    from helpers import free_port
    import psutil

    # 48 rewrites of 32 tokens: a run on a loaded machine cannot finish between the 4th commit and the kill
    n = 24
    notes = [{**NOTES[i % 4], "sample_id": i} for i in range(n)]
    spec, source = model_spec(tmp_path), write_jsonl(tmp_path / "notes.jsonl", notes)
    out = tmp_path / "out"
    tail = ["--source", source, "--spec", spec, "--model", "tiny-judge", "--max_new_tokens", 32, "--chunk_size", 1,
            "--output_dir", out]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", REPO / "accelerate_configs" /
              "cpu.yaml", "--main_process_port", free_port(), "-m", "judgetrain.cli.perturb"]
    proc = subprocess.Popen([str(a) for a in launch + tail], cwd=REPO, stdout=(tmp_path / "first.log").open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    while sum(_done(out).values()) < 4:
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        if time.monotonic() - t0 > 300:  # a deadline for the wait, not a speed figure
            pytest.fail("no rewrite committed in 300 s")
        time.sleep(0.2)
    tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for pid in tree:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    before = _done(out)
    assert max(before.values()) == 1 and 4 <= sum(before.values()) < 2 * n
    assert not (out / "items.jsonl").exists()
    second = subprocess.run([sys.executable, "-m", "judgetrain.cli.perturb", *map(str, tail)], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    done = sum(before.values())
    assert f"{done}/{2 * n} evaluations done, {2 * n - done} to generate" in second.stderr
    after = _done(out)
    assert len(after) == 2 * n and max(after.values()) == 1  # every rewrite made exactly once
    summary = json.loads((out / "summary.json").read_text())
    assert all(s["items"] + s["rejected"] == n for s in summary["sets"].values())


# ------------------------------------------------------------------------------------------------ the loop (slow)
@pytest.mark.slow
def test_the_loop_source_perturb_judge_pairs_dpo_then_the_trained_judge_on_held_out_items(tmp_path, tiny_judge):
    """Raw recipes -> `judgetrain perturb` (the materials pack, rule operators and stand-ins, the originals too)
    -> three tiny judges -> pairs build -> 4 DPO steps -> the trained adapter and its base over the perturbed items
    of held-out samples. Each stage's output is the next one's input."""
    from judgetrain.cli import main as cli
    from judgetrain.cli.judge import main as judge

    rows = read_jsonl(materials_source(tmp_path / "recipes.jsonl"))
    write_jsonl(tmp_path / "train.jsonl", rows[:2])
    write_jsonl(tmp_path / "heldout.jsonl", rows[10:])
    for name in ("train", "heldout"):
        assert perturb("--source", tmp_path / f"{name}.jsonl", "--spec", "materials", "--sets", "all_error_perturbation",
                       "llm_representational_perturbation", "element_substitution", "llm_to_formula",
                       "--output_dir", tmp_path / f"perturbed-{name}") == 0
    items = tmp_path / "perturbed-train" / "items.jsonl"
    n_items = len(read_jsonl(items))
    assert n_items >= 20
    for seed in (1, 2):
        assert cli(["tiny", "build", "--seed", str(seed), "--out", str(tmp_path / f"tiny-seed{seed}")]) == 0
    panel = tmp_path / "panel"
    assert judge(["--items", str(items), "--judge", "tiny-judge", "--judge", f"model={tmp_path / 'tiny-seed1'},name=s1",
                  "--judge", f"model={tmp_path / 'tiny-seed2'},name=s2", "--force_score_prefix",
                  "--output_dir", str(panel)]) == 0
    summary = json.loads((panel / "summary.json").read_text())
    assert [s["rows"] for s in summary.values()] == [n_items] * 3
    assert all(s["parse_rate"] == 1.0 for s in summary.values())
    panel_rows = read_jsonl(panel / "evaluations.jsonl")
    assert panel_rows[0]["perturbation_changes"] == read_jsonl(items)[0]["perturbation_changes"]  # carried through

    assert cli(["pairs", "build", "--evaluations", str(panel / "evaluations.jsonl"), "--out", str(tmp_path / "pairs"),
                "--validation-fraction", "0"]) == 0
    stats = json.loads((tmp_path / "pairs" / "stats.json").read_text())
    assert stats["scored_rows"] == 3 * n_items and stats["rejected_rows"] == 0
    import pyarrow.parquet as pq

    pairs = pq.read_table(tmp_path / "pairs" / "train.parquet").to_pylist()
    assert len(pairs) >= 4 and {p["sample_id"] for p in pairs} <= {r["sample_id"] for r in rows[:2]}

    run = tmp_path / "run"
    train_on_pairs(tmp_path / "pairs", run)

    heldout = tmp_path / "perturbed-heldout" / "items.jsonl"
    out = tmp_path / "heldout"
    assert judge(["--items", str(heldout), "--judge", "tiny-judge", "--judge",
                  f"model=tiny-judge,adapter={run},name=trained", "--force_score_prefix", "--output_dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trained"]["rows"] == len(read_jsonl(heldout)) and summary["trained"]["parse_rate"] == 1.0
    assert {r["sample_id"] for r in read_jsonl(out / "evaluations.jsonl")}.isdisjoint({r["sample_id"] for r in rows[:2]})


# ------------------------------------------------------------------------------------------------ SmolLM2 (extended)
@pytest.mark.extended(reason="SmolLM2-135M-Instruct: 32 rewrites of up to 400 tokens (4 took 22 min on 2 busy cores)")
def test_smollm2_rewrites_of_the_materials_pack_are_checked_and_counted(tmp_path):
    """SmolLM2-135M-Instruct as the rewriting model of the materials pack's model sets: each of the 32 rewrites is
    an item or a reject with its reason; the figures (how many pass) are printed, and docs/perturb.md gives them."""
    from judgetrain.models.smollm2 import SmolLM2Unavailable, gguf_path

    try:
        gguf_path()
    except SmolLM2Unavailable as e:
        pytest.skip(str(e))
    source = write_jsonl(tmp_path / "recipes.jsonl", read_jsonl(RECIPES / "validation.jsonl")[:4])
    out = tmp_path / "out"
    assert perturb("--source", source, "--spec", "materials", "--sets", "llm_to_formula", "llm_to_name",
                   "llm_to_iupac", "llm_representational_perturbation", "--model", "smollm2-135m-instruct",
                   "--max_new_tokens", 400, "--output_dir", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads((out / "rewrites" / "summary.json").read_text())["smollm2-135m-instruct"]["rows"] == 4 * 8
    for s in summary["sets"].values():
        assert s["items"] + s["rejected"] == 4 and s["method"] == "model"
    assert len(read_jsonl(out / "items.jsonl")) + len(read_jsonl(out / "rejects.jsonl")) == 32
    print(json.dumps({k: (v["items"], v["rejects"]) for k, v in summary["sets"].items()}))


def test_the_pack_docs_perturb_md_writes_for_a_new_domain_parses_and_runs(tmp_path):
    """The clinical-notes spec of docs/perturb.md, as written there, over two notes: its rule sets make items."""
    text = (REPO / "docs" / "perturb.md").read_text(encoding="utf-8")
    block = text.split("```yaml\n", 1)[1].split("\n```\n", 1)[0]
    (tmp_path / "clinic.yaml").write_text(block, encoding="utf-8")
    (tmp_path / "drug_swaps.tsv").write_text("warfarin\theparin\nmetformin\tglipizide\n", encoding="utf-8")
    notes = [{"sample_id": 1, "patient": "F, 71", "note": "Warfarin 5 mg p.o. q.d. for 90 d; INR in 7 d."},
             {"sample_id": 2, "patient": "M, 54", "note": "**Metformin** 500 mg b.i.d. with meals."}]
    out = tmp_path / "out"
    assert perturb("--source", write_jsonl(tmp_path / "notes.jsonl", notes), "--spec", tmp_path / "clinic.yaml",
                   "--output_dir", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["spec"] == "clinic" and summary["skipped_sets"] == {}
    assert summary["sets"]["lay_summary_100pct"]["method"] == "stand_in"
    items = {(i["sample_id"], i["perturbation_set"]): i for i in read_jsonl(out / "items.jsonl")}
    assert items[(1, "drug_substitution_100pct")]["prompt"][1]["content"].endswith(
        "Heparin 5 mg p.o. q.d. for 90 d; INR in 7 d.")
    assert items[(2, "expand_abbreviations_100pct")]["prompt"][1]["content"].endswith(
        "**Metformin** 500 mg twice daily with meals.")
    assert items[(1, "unit_conversion_100pct")]["perturbation_changes"][0]["before"] in ("5 mg", "90 d", "7 d")


def test_the_bundled_recipes_regenerate_identically(tmp_path):
    from helpers import run

    run([sys.executable, REPO / "scripts" / "make_samples.py", "--only", "recipes", "--out", tmp_path])
    for name in ("train.jsonl", "validation.jsonl", "README.md"):
        assert (tmp_path / "recipes" / name).read_bytes() == (RECIPES / name).read_bytes(), name
    rows = read_jsonl(RECIPES / "validation.jsonl")
    assert [r["sample_id"] for r in rows] == list(range(1000, 1012)) and set(rows[0]) == {"sample_id", "target", "text"}


def test_an_entity_survives_as_itself_or_a_represent_equivalent_never_as_its_error_swap():
    from judgetrain.perturb.build import Planned, check
    from judgetrain.perturb.source import Sample
    from judgetrain.perturb.spec import table_entities

    ops = {"to_formula": {"kind": "table", "category": "represent", "pairs": {"acetone": "C3H6O"}},
           "swap": {"kind": "table", "category": "error", "pairs": {"tube furnace": "hot plate"}},
           "rewrite": {"kind": "model", "category": "represent", "instruction": "Rewrite.",
                       "checks": {"entities": ["swap", "to_formula", "argon"]}}}
    spec = parsed({"operators": ops, "sets": [{"name": k} for k in ops]})
    assert table_entities(spec, ["swap", "to_formula", "argon"]) == {
        "tube furnace": {"tube furnace"}, "acetone": {"acetone", "C3H6O"}, "argon": {"argon"}}
    source = "Wash with acetone, heat in the tube furnace under argon."
    p = Planned(Sample(1, source, TEMPLATE, {}, "x", 0), spec.sets[2], 1.0, "rewrite_100pct", ("rewrite",), "model")
    done = {"stopped": True, "n_tokens": 9}
    assert check(spec, p, "Wash with C3H6O, then heat in the tube furnace under argon.", [None], done) is None
    assert check(spec, p, "Wash with C3H6O, heat on the hot plate under argon.", [None], done) == (
        "entity_lost", "'tube furnace'")
    assert check(spec, p, "Wash, heat in the tube furnace under argon.", [None], done) == (
        "entity_lost", "'acetone' (nor C3H6O)")
    assert check(spec, p, source, [], done)[0] == "unchanged"


def test_the_bench_part_at_its_smallest_writes_its_figures(tmp_path):
    """`judgetrain bench --only perturb` at 17 recipes: the structure of its figures, not their timings."""
    from judgetrain.cli import bench as bench_cli

    out = tmp_path / "bench.json"
    assert bench_cli.main(["--only", "perturb", "--perturb-samples", "17", "--workdir", str(tmp_path / "w"),
                           "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    part = report["perturb"]
    assert (part["samples"], part["sets"], part["sample_x_set"]) == (17, 17, 289) and part["identical"] is True
    assert part["items"] + part["rejected"] == 289 and sum(part["rejects_by_reason"].values()) == part["rejected"]
    assert part["seconds_per_34000"] > 0 and report["summary"]["perturb_seconds_per_34000"] == part["seconds_per_34000"]


def test_the_style_pack_without_a_model_makes_its_rule_sets_and_says_what_it_left_out(tmp_path):
    answers = [{"sample_id": 1, "question": "How do I boil an egg?",
                "text": "## Steps\n- Boil **500 mL** of water.\n- Cook the egg for 9 min."},
               {"sample_id": 2, "question": "What is 12 x 12?", "text": "Short answer:\n12 x 12 = 144\nso 144."}]
    out = tmp_path / "out"
    assert perturb("--source", write_jsonl(tmp_path / "answers.jsonl", answers), "--spec", "style",
                   "--output_dir", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["skipped_sets"]) == {"concise_100pct", "detailed_plain_100pct", "one_error_100pct"}
    items = {(i["sample_id"], i["perturbation_set"]): i for i in read_jsonl(out / "items.jsonl")}
    assert items[(1, "markdown_to_plain_100pct")]["prompt"][1]["content"].endswith(
        "## Answer\nSteps\nBoil 500 mL of water.\nCook the egg for 9 min.")
    assert items[(2, "plain_to_markdown_100pct")]["prompt"][1]["content"].endswith(
        "## Answer\n**Short answer:**\n- 12 x 12 = 144\n- so 144.")
    assert items[(2, "detailed_markdown_100pct")]["perturbation_method"] == "stand_in"
    assert {k[1] for k in items} >= {"original_0pct"} and items[(1, "original_0pct")]["perturbation_changes"] == []
    assert [(r["sample_id"], r["perturbation_set"], r["reason"]) for r in read_jsonl(out / "rejects.jsonl")] == [
        (1, "detailed_markdown_100pct", "no_eligible_span"), (2, "markdown_to_plain_100pct", "no_eligible_span"),
        (1, "plain_to_markdown_100pct", "no_eligible_span")]  # in the spec's order of sets


def test_model_rewrites_take_the_endpoint_options_of_judge_retry_rejected_included():
    from judgetrain.cli.judge import options
    from judgetrain.cli.perturb import build_parser

    args = build_parser().parse_args(["--source", "s", "--spec", "materials", "--output_dir", "o", "--retry_rejected",
                                      "--endpoint_max_retries", "3"])
    opts = options(args)
    assert opts.retry_rejected is True and opts.endpoint_max_retries == 3
