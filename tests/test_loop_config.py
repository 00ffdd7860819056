"""`judgetrain loop`'s config checked whole before any stage runs (every field typed, the train keys through the
recipe's parser, the eval options through eval's, the files it names, a suite to score; one line, exit 2, no
loop_state.json), the contents of the files it reads in its fingerprint, a failed stage named by its command, and the
held-out samples drawn once for the loop over the source (a round whose items lack a sample holds out the same), and
round 1 training on no copy that reads as a held-out one, nor on an edit of a type held out whole (combined sets)."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import REPO, read_jsonl
from test_loop import loop_config

SPEC_FILE = "clinic.yaml"


def refused(tmp_path, capsys, **edit) -> str:
    """`judgetrain loop` of the test loop's config with ``edit``: exit 2, one line on stderr (returned), nothing
    written in the output folder."""
    from judgetrain.cli import main

    config = loop_config(tmp_path, **edit)
    assert main(["loop", str(config)]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"judgetrain loop: {config}: "), said
    assert "Traceback" not in said[0] and not (tmp_path / "loop" / "loop_state.json").exists()
    return said[0]


@pytest.mark.parametrize("edit, message", [
    ({"heldout": {"fraction": "0.2"}}, "heldout.fraction: '0.2' is not a number"),
    ({"judge": {"samples": "3"}}, "judge.samples: '3' is not a whole number"),
    ({"heldout": {"types": 5}}, "heldout.types: 5 is not a list"),
    ({"rounds": True}, "rounds: True is not a whole number"),
    ({"eval": {"suites": "pairwise"}}, "eval.suites: 'pairwise' is not a list"),
    ({"train": None}, "train: None is not a mapping of keys"),
    ({"eval": {"suites": []}}, "eval.suites: an empty list"),
    ({"pairs": {"options": {"ties": {"x": 1}}}}, "pairs.options.ties: {'x': 1} is not a value or a list of values"),
])
def test_every_field_is_typed(tmp_path, capsys, edit, message):
    assert message in refused(tmp_path, capsys, **edit)


def test_what_the_config_names_is_checked_before_anything_runs(tmp_path, capsys):
    base = yaml.safe_load(loop_config(tmp_path).read_text())
    # a misspelt held-out type names the nearest of the spec's (it held nothing out: its items trained)
    assert "heldout.types: no perturbation type 'drug_swaps'; did you mean 'drug_swap'?" in refused(
        tmp_path, capsys, heldout={"fraction": 0.25, "types": ["drug_swaps"]})
    # a string where a list belongs is not split into characters (perturb ran with --sets d r u g _ s w a p)
    assert "items.sets: 'drug_swap' is not a list (one name is written [drug_swap])" in refused(
        tmp_path, capsys, items={**base["items"], "sets": "drug_swap"})
    assert "no set 'spacin'; did you mean 'spacing'?" in refused(
        tmp_path, capsys, items={**base["items"], "sets": ["spacin"]})
    assert "recipe: recipe " in refused(tmp_path, capsys, recipe=str(tmp_path / "missing.yaml"))
    assert "items: " in refused(tmp_path, capsys, items={**base["items"], "source": str(tmp_path / "none.jsonl")})
    assert "items: spec " in refused(tmp_path, capsys, items={**base["items"], "spec": str(tmp_path / "no.yaml")})
    # a misspelt train key: the nearest recipe key; a train value of the wrong type: the recipe parser's words
    assert "unknown key 'train.learning_rat'; did you mean 'learning_rate'?" in refused(
        tmp_path, capsys, train={"learning_rat": 0.1})
    assert "train (over the recipe " in refused(tmp_path, capsys, train={"max_steps": "many"})
    (tmp_path / "afile").write_text("x")
    assert f"output_dir: {tmp_path / 'afile'} is a file, not a folder" in refused(
        tmp_path, capsys, output_dir=str(tmp_path / "afile"))
    # eval's options through eval's parser
    assert "eval (judgetrain eval's options): unknown option --eval_max_rowz; did you mean --eval_max_rows?" in \
        refused(tmp_path, capsys, eval={"suites": ["pairwise"], "options": {"eval_max_rowz": 3}})


def test_an_items_file_with_pointwise_pairs_and_the_default_suites_is_refused_up_front(tmp_path, capsys):
    """No source and spec: no held-out pairs, so the default suites leave eval nothing to score (it exited 2 after
    training, on every rerun)."""
    items = tmp_path / "items.jsonl"
    prompt = [{"role": "user", "content": "Rate: Give aspirin 1000 mg daily."}]
    items.write_text("".join(json.dumps({"sample_id": i, "perturbation_set": "original_0pct", "prompt": prompt,
                                         "perturbation_type": "original", "perturbation_category": "represent",
                                         "perturbation_rate": 0.0}) + "\n" for i in range(4)))
    said = refused(tmp_path, capsys, items={"file": str(items)}, pairs={"method": "known", "form": "pointwise"},
                   eval={})
    assert "eval.suites: ['pairwise'] leaves no suite to score" in said


def test_a_corrected_config_starts_the_loop_a_typo_did_not(tmp_path, capsys):
    from judgetrain.loop.config import load_config
    from judgetrain.loop.run import open_state

    refused(tmp_path, capsys, heldout={"fraction": "0.25"})
    state = open_state(load_config(loop_config(tmp_path)), tmp_path / "loop")  # not "another config's loop"
    assert state["done"] == {} and set(state["inputs"]) == {"recipe", "items.source", "items.spec"}


def test_an_edit_of_the_spec_recipe_or_source_between_runs_refuses_to_resume(tmp_path):
    from judgetrain.loop.config import LoopConfigError, load_config
    from judgetrain.loop.run import open_state

    path = loop_config(tmp_path)
    open_state(load_config(path), tmp_path / "loop")
    spec = yaml.safe_load((tmp_path / SPEC_FILE).read_text())
    spec["operators"]["drug_swap"]["pairs"]["aspirin"] = "heparin"
    (tmp_path / SPEC_FILE).write_text(yaml.safe_dump(spec))
    with pytest.raises(LoopConfigError, match=r"other contents of items\.spec \(.*clinic\.yaml\): the file changed"):
        open_state(load_config(path), tmp_path / "loop")
    loop_config(tmp_path)  # the spec and source written again as they were
    open_state(load_config(path), tmp_path / "loop")
    with (tmp_path / "notes.jsonl").open("a") as f:
        f.write(json.dumps({"sample_id": 99, "patient": "P99", "text": "Give aspirin 5 mg."}) + "\n")
    with pytest.raises(LoopConfigError, match=r"other contents of items\.source"):
        open_state(load_config(path), tmp_path / "loop")


def test_a_failed_stage_is_named_by_its_command():
    from judgetrain.loop.run import StageFailed, run_command

    with pytest.raises(StageFailed, match=r"^judgetrain perturb exited with 2$"):
        run_command(["perturb", "--source", "no-such-file.jsonl", "--spec", "materials", "--output_dir", "x"])


DRUGS = ("aspirin", "ibuprofen", "paracetamol")


def test_the_heldout_samples_are_drawn_once_over_the_source_whatever_a_round_drops(tmp_path):
    """40 notes, a quarter held out, no original set: round 2's items lack sample 3 (none of its copies accepted).
    Drawn from the ids present in each round's items, round 2 held out other samples and trained on copies
    byte-identical to held-out evaluation copies; drawn once over the source, the held-out set is the same and no
    training item reads as a held-out copy."""
    from judgetrain.loop.config import load_config
    from judgetrain.loop.run import Loop, open_state
    from judgetrain.perturb.known import item_text

    path = loop_config(tmp_path)
    spec = yaml.safe_load((tmp_path / SPEC_FILE).read_text())
    spec["original"] = False
    (tmp_path / SPEC_FILE).write_text(yaml.safe_dump(spec))
    notes = [{"sample_id": i, "patient": f"P{i}", "text": f"Give {DRUGS[i % 3]} {1000 + 100 * i} mg daily."}
             for i in range(40)]
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps(n) + "\n" for n in notes))
    config = load_config(path)
    out = tmp_path / "loop"
    loop = Loop(config, out, open_state(config, out))
    for k in (1, 2):
        loop.stage_items(k, out / f"round-{k}")
    items2 = out / "round-2" / "items" / "items.jsonl"
    kept = [line for line in items2.read_text().splitlines() if json.loads(line)["sample_id"] != 3]
    assert len(kept) < len(items2.read_text().splitlines())
    items2.write_text("\n".join(kept) + "\n")
    for k in (1, 2):
        loop.stage_split(k, out / f"round-{k}")
    split = [json.loads((out / f"round-{k}" / "split" / "split.json").read_text()) for k in (1, 2)]
    assert split[0]["heldout_samples"] == split[1]["heldout_samples"] and len(split[0]["heldout_samples"]) == 10
    copies = {r["response_b"] for r in read_jsonl(out / "heldout" / "pairwise.jsonl")}
    samples = {s.sample_id: s for s in loop.samples()}
    for k in (1, 2):
        train = read_jsonl(out / f"round-{k}" / "split" / "train.jsonl")
        assert not {str(r["sample_id"]) for r in train} & set(split[0]["heldout_samples"])
        assert not [r for r in train if item_text(samples[r["sample_id"]], r["prompt"]) in copies]


def split_round_1(tmp_path, config_path, allow_shortcuts: bool = False) -> tuple[list[dict], list[dict], dict, object]:
    """(round 1's training items, its held-out items, its split.json, the loop) after its items and split stages."""
    from judgetrain.loop.config import load_config
    from judgetrain.loop.run import Loop, open_state

    config = load_config(config_path)
    out = tmp_path / "loop"
    loop = Loop(config, out, open_state(config, out), allow_shortcuts)
    loop.stage_items(1, out / "round-1")
    loop.stage_split(1, out / "round-1")
    split = out / "round-1" / "split"
    return (read_jsonl(split / "train.jsonl"), read_jsonl(split / "heldout.jsonl"),
            json.loads((split / "split.json").read_text()), loop)


def test_round_1_trains_on_no_copy_whose_text_a_held_out_pair_shows(tmp_path):
    """Two error types whose edits coincide (the same table), one held out whole: each sample's copy of the other
    type reads as the held-out copy. Round 1 kept them in training (round 2 did not); now neither does."""
    from judgetrain.perturb.known import item_text

    path = loop_config(tmp_path, heldout={"fraction": 0.25, "types": ["drug_copy"]})
    spec = yaml.safe_load((tmp_path / SPEC_FILE).read_text())
    spec["operators"]["drug_copy"] = dict(spec["operators"]["drug_swap"])
    spec["sets"].append({"name": "drug_copy"})
    (tmp_path / SPEC_FILE).write_text(yaml.safe_dump(spec))
    train, heldout, split, loop = split_round_1(tmp_path, path)
    samples = {s.sample_id: s for s in loop.samples()}
    copies = {r["response_b"] for r in read_jsonl(tmp_path / "loop" / "heldout" / "pairwise.jsonl")}
    assert len(copies) == 12  # every sample's drug_copy copy
    assert not [r for r in train if item_text(samples[r["sample_id"]], r["prompt"]) in copies]
    assert split["heldout_same_text"] == 9  # the drug_swap copies of the 9 samples not held out
    assert {r["perturbation_type"] for r in train} == {"original", "spacing"}


def test_a_type_held_out_whole_trains_in_no_combined_set(tmp_path):
    """The materials pack's default sets, element_substitution held out: an all_error_perturbation copy holding an
    element_substitution edit is held out too (before, 22 of 467 training items held one); one without trains."""
    recipes = tmp_path / "recipes.jsonl"
    recipes.write_text("".join((REPO / "judgetrain" / "data" / "samples" / "recipes" / f"{split}.jsonl").read_text()
                               for split in ("train", "validation")))
    path = loop_config(tmp_path, heldout={"fraction": 0.25, "types": ["element_substitution"]},
                       items={"source": str(recipes), "spec": "materials"})
    train, heldout, split, _ = split_round_1(tmp_path, path, allow_shortcuts=True)  # the pack's copies carry tells
    holding = [r for r in train if any(c["kind"] == "element_substitution" for c in r["perturbation_changes"])]
    assert holding == []
    assert split["heldout_operators"] == ["element_substitution"]
    combined = [r for r in train if r["perturbation_type"] == "all_error_perturbation"]
    assert combined and all({c["kind"] for c in r["perturbation_changes"]} <= {
        "numerical_perturbation", "equipment_substitution", "action_antonym"} for r in combined)
    assert [r for r in heldout if r["perturbation_type"] == "all_error_perturbation"
            and any(c["kind"] == "element_substitution" for c in r["perturbation_changes"])]
