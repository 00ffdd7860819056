"""`judgetrain loop`: the config checked before anything runs (an unknown key refused with the nearest one); (slow)
two rounds end to end on the tiny judge, whose files and round table agree, the table recomputed from the per-row
files of each round's evaluation (the base's scored once, as round 0) and drawn by `judgetrain report`; (slow) the
command killed during each stage and rerun: every stage done once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from helpers import REPO, read_jsonl

SPEC = {"name": "clinic", "original": True,
        "template": [{"role": "system", "content": "Judge the note. End with ```json {\"overall_score\": ...}```."},
                     {"role": "user", "content": "Patient: {{patient}}\n\nNote:\n{{text}}"}],
        "operators": {"drug_swap": {"kind": "table", "category": "error",  # each drug for another the notes use
                                    "pairs": {"aspirin": "ibuprofen", "ibuprofen": "paracetamol",
                                              "paracetamol": "aspirin"}},
                      "spacing": {"kind": "format", "category": "represent", "rewrite": "number_format"}},
        "sets": [{"name": "drug_swap"}, {"name": "spacing"}]}
DRUGS = ("aspirin", "ibuprofen", "paracetamol")
NOVEL_SPEC = {**SPEC, "operators": {**SPEC["operators"], "drug_swap": {  # each drug for one no note names: a tell
    "kind": "table", "category": "error", "pairs": {"aspirin": "warfarin", "ibuprofen": "codeine",
                                                    "paracetamol": "morphine"}}}}


def loop_config(tmp_path: Path, **over) -> Path:
    """12 notes, the clinic spec, a quarter of the samples held out, 2 DPO steps a round on the tiny judge."""
    (tmp_path / "clinic.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False), encoding="utf-8")
    notes = [{"sample_id": i, "patient": f"P{i}", "text": f"Give {DRUGS[i % 3]} {1000 + 100 * i} mg daily."}
             for i in range(12)]
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps(n) + "\n" for n in notes), encoding="utf-8")
    config = {"output_dir": str(tmp_path / "loop"), "rounds": 2, "model": "tiny-judge",
              "recipe": str(REPO / "recipes" / "quickstart.yaml"),
              "train": {"max_steps": 2, "per_device_train_batch_size": 4, "logging_steps": 1, "warmup_steps": 0,
                        "save_steps": 1, "learning_rate": 0.05},
              "items": {"source": str(tmp_path / "notes.jsonl"), "spec": str(tmp_path / "clinic.yaml")},
              "heldout": {"fraction": 0.25},
              "pairs": {"method": "known", "form": "pairwise"},  # response pairs are scored in the reading they train
              "eval": {"suites": ["pairwise"], "scoring": ["implicit" if (over.get("pairs") or {}).get("form") ==
                                                           "response" else "verdict"]}, **over}
    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def loop_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "judgetrain.cli", "loop", str(config)]


@pytest.mark.parametrize("edit, message", [
    ({"roundz": 2}, "unknown key 'roundz'; did you mean 'rounds'?"),
    ({"pairs": {"metod": "known"}}, "unknown key 'pairs.metod'; did you mean 'method'?"),
    ({"pairs": {"form": "listwise"}}, "pairs.form: 'listwise' is not one of pairwise, pointwise"),
    ({"train": {"init_adapter": "x"}}, "train.init_adapter: the loop sets it each round; remove it"),
    ({"items": {"file": "items.jsonl"}}, "the pairwise known form needs items.source and items.spec"),
    ({"pairs": {"form": "response"}}, "pairs.ties: the response form's tie pairs (a rewrite against its source) train only under a recipe's tie_model"),
    ({"pairs": {"form": "response", "ties": "drop"}, "eval": {"suites": ["pairwise"], "scoring": ["verdict"]}},
     "eval.scoring: ['verdict']: the training form log_ratio trains the implicit reading; list implicit"),
    ({"pairs": {"form": "response", "ties": "drop"}, "train": {"training_form": "mean_logprob"},
      "eval": {"suites": ["pairwise"], "scoring": ["judge"]}},
     "the training form mean_logprob trains the loglik_mean reading; list loglik_mean"),
])
def test_a_bad_config_is_refused_naming_the_key_before_anything_runs(tmp_path, edit, message, capsys):
    from judgetrain.cli import main

    config = loop_config(tmp_path, **edit)
    assert main(["loop", str(config)]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"judgetrain loop: {config}: ") and message in said[0]
    assert not (tmp_path / "loop").exists()


def test_the_response_form_is_accepted_and_its_pairs_stage_writes_the_question_and_source_over_error(tmp_path):
    """The loop's own items, split and pairs stages (each the command a user runs) on `pairs: {form: response}`."""
    from judgetrain.loop.config import load_config
    from judgetrain.loop.run import Loop, open_state

    config = load_config(loop_config(tmp_path, pairs={"method": "known", "form": "response", "ties": "drop"}))
    assert (config.pairs.form, config.needs_judge) == ("response", False)
    out = Path(config.output_dir)
    loop = Loop(config, out, open_state(config, out))
    assert loop.stages() == ["items", "split", "pairs", "train", "eval"]
    for stage in ("items", "split", "pairs"):
        loop.stage(1, stage)
    rows = pq.read_table(out / "round-1" / "pairs" / "train.parquet").to_pylist()
    held = set(json.loads((out / "round-1" / "split" / "split.json").read_text())["heldout_samples"])
    assert len(rows) == 12 - len(held) and not {str(r["sample_id"]) for r in rows} & held  # one per training note
    for r in rows:
        i = int(r["sample_id"])
        assert json.loads(r["prompt"]) == [{"role": "user", "content": f"Patient: P{i}\n\nNote:"}]
        assert json.loads(r["chosen"])[0]["content"] == f"Give {DRUGS[i % 3]} {1000 + 100 * i} mg daily."
        assert DRUGS[i % 3] not in json.loads(r["rejected"])[0]["content"]


def test_round_k_eval_fits_the_novel_token_rule_on_its_response_pairs(tmp_path, monkeypatch):
    """The eval stage names round k's training pairs to `judgetrain eval --rules_train_pairs` (round 0, the base,
    scored before any pairs exist: none); the rule fitted on that file marks the words of the error copies that no
    source holds: the drugs the swap brought in, which no note names (a shortcut the loop lets through only when told,
    as here)."""
    from judgetrain.eval.rules import read_training_pairs
    from judgetrain.loop import run as loop_run
    from judgetrain.loop.config import load_config
    from judgetrain.loop.run import Loop, open_state

    config = load_config(loop_config(tmp_path, pairs={"method": "known", "form": "response", "ties": "drop"}))
    (tmp_path / "clinic.yaml").write_text(yaml.safe_dump(NOVEL_SPEC, sort_keys=False), encoding="utf-8")
    out = Path(config.output_dir)
    loop = Loop(config, out, open_state(config, out), allow_shortcuts=True)
    for stage in ("items", "split", "pairs"):
        loop.stage(1, stage)
    commands = []
    monkeypatch.setattr(loop_run, "run_command", lambda argv, *launch: commands.append(argv))
    loop.stage_eval(0, loop.round_dir(0))
    loop.stage_eval(1, loop.round_dir(1))
    evals = [c for c in commands if c[0] == "eval"]
    assert "--rules_train_pairs" not in evals[0]
    pairs = evals[1][evals[1].index("--rules_train_pairs") + 1]
    assert pairs == str(out / "round-1" / "pairs" / "train.parquet")
    rows = pq.read_table(pairs).to_pylist()
    said = [{w for r in rows for w in json.loads(r[side])[0]["content"].replace(".", " ").split()}
            for side in ("chosen", "rejected")]
    marks = read_training_pairs(pairs).marks
    assert marks == said[1] - said[0] and marks and not marks & set(DRUGS)  # the drugs the swap brought in


def test_a_training_set_a_rule_separates_is_refused_before_any_training_unless_allowed(tmp_path, capsys):
    """The clinic spec swapping each drug for one no note names (warfarin, codeine, morphine): the novel-token rule,
    fitted on other training samples, tells every training copy from its source (1.0 > 0.9), so the loop stops at
    the split, exit 2, one line naming the type, the rule and the flag; nothing is paired or trained. With
    --allow_shortcuts the split passes, the figure let through is recorded and the report shows it."""
    from judgetrain.cli import main
    from judgetrain.report.loop import heldout_lines, read_loop

    novel = NOVEL_SPEC
    config = loop_config(tmp_path, pairs={"method": "known", "form": "response", "ties": "drop"})
    (tmp_path / "clinic.yaml").write_text(yaml.safe_dump(novel, sort_keys=False), encoding="utf-8")
    assert main(["loop", str(config)]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert "round 1: a rule with no judge separates the training error copies from their sources above 0.9: " \
           "novel_token 1.000 on drug_swap" in said[-1] and "--allow_shortcuts" in said[-1]
    out = tmp_path / "loop"
    state = json.loads((out / "loop_state.json").read_text())
    assert sorted(state["done"]) == ["1/items"] and not (out / "round-1" / "pairs").exists()
    # the same config with the flag: the split passes, its record counts the figure let through
    assert main(["loop", str(config), "--allow_shortcuts", "--data_only"]) == 0
    printed = capsys.readouterr().out
    split = json.loads((out / "round-1" / "split" / "split.json").read_text())
    trained = [i for i in range(12) if str(i) not in split["heldout_samples"]]
    longer = sum(i % 3 == 0 for i in trained) / len(trained)  # only warfarin is longer than its source's drug
    assert f"| training | drug_swap | 9 | 1.00 | +0.00 | {longer:.3f} | {1 - longer:.3f} | 1.000 |" in printed
    shortcuts = split["shortcuts"]
    assert shortcuts["allowed"] == [{"type": "drug_swap", "rule": "novel_token", "accuracy": 1.0}]
    assert shortcuts["heldout"]["drug_swap"]["rules"]["novel_token"] == 1.0  # fitted on training, read on held-out
    assert sorted(json.loads((out / "loop_state.json").read_text())["done"]) == ["1/items", "1/pairs", "1/split"]
    line = next(x for x in heldout_lines(read_loop(out)) if "rule with no judge" in x)
    assert "1 figure(s) above the limit trained anyway (--allow_shortcuts): novel_token 1.000 on drug_swap." in line


def test_drugs_swapped_among_the_notes_pass_the_rules(tmp_path):
    """The loop's clinic spec swaps each drug for another the notes name: no rule is above 0.9 on its copies, so the
    split passes without the flag (the figures recorded: novel-token all ties, 0.5)."""
    from judgetrain.loop.config import load_config
    from judgetrain.loop.run import Loop, open_state

    config = load_config(loop_config(tmp_path, pairs={"method": "known", "form": "response", "ties": "drop"}))
    loop = Loop(config, Path(config.output_dir), open_state(config, Path(config.output_dir)))
    for stage in ("items", "split"):
        loop.stage(1, stage)
    shortcuts = json.loads((Path(config.output_dir) / "round-1" / "split" / "split.json").read_text())["shortcuts"]
    assert shortcuts["allowed"] == [] and shortcuts["types"]["drug_swap"]["rules"]["novel_token"] == 0.5
    assert max(shortcuts["types"]["drug_swap"]["rules"].values()) <= 0.9


def test_the_packaged_loop_configs_load_and_the_pointwise_proof_states_its_design(tmp_path):
    from judgetrain.loop.config import load_config

    # the pointwise proof reads generated recipes (its header's make_samples line): made here, small, and named
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_samples.py"), "--only", "recipes", "synthesis",
                    "cooking", "--judgebias-samples", "20", "0", "--samples", "20", "0", "--out",
                    str(tmp_path / "pointwise")], check=True, cwd=REPO)
    judgebench = tmp_path / "judgebench.jsonl"  # the grid's replay source: two pairs in the authors' schema
    judgebench.write_text("".join(json.dumps({"pair_id": f"p{i}", "original_id": str(i), "source": "mmlu-pro-x",
                                              "question": "2 + 2?", "response_model": "m", "response_A": "4",
                                              "response_B": "5", "label": "A>B" if i else "B>A"}) + "\n"
                                  for i in range(2)), encoding="utf-8")
    configs = {}
    for p in sorted((REPO / "recipes" / "loops").glob("*.yaml")):
        text = p.read_text(encoding="utf-8").replace("source: data/judgebench", f"source: {judgebench}")
        text = text.replace("source: judgetrain/", f"source: {REPO / 'judgetrain'}/")  # bundled: the repository's
        for kind in ("recipes", "synthesis", "cooking"):
            text = text.replace(f"source: data/pointwise/{kind}", f"source: {tmp_path / 'pointwise' / kind}")
            text = text.replace(f"source: data/grid/{kind}", f"source: {tmp_path / 'pointwise' / kind}")
        (tmp_path / p.name).write_text(text, encoding="utf-8")
        configs[p.name] = load_config(tmp_path / p.name)
    assert {"smollm2_verdicts.yaml", "smollm2_pointwise.yaml", "quickstart.yaml"} <= set(configs)
    quick = configs["quickstart.yaml"]  # the README's first command: a real judge, the bundled recipes, one reading
    assert (quick.model, quick.items.spec, quick.eval.scoring) == ("smollm2-135m-instruct", "cooking", ["loglik_mean"])
    assert quick.train["training_form"] == "mean_logprob" and quick.heldout.fraction >= 0.2
    assert {"markdown_to_plain", "plain_to_markdown"} <= set(quick.items.sets) and quick.pairs.ties == "tie"
    assert "10 minutes" in quick.goal
    grid = {name[len("grid_"):-len(".yaml")]: c for name, c in configs.items() if name.startswith("grid_")}
    assert sorted(grid) == ["a_log_ratio", "b_ties", "c_mean_ties", "c_mean_ties_reseed", "d_replay"]
    for name, config in grid.items():  # one data, one held-out set and one eval for the whole grid (round 0 cached)
        assert [d.name for d in config.domains] == ["synthesis", "cooking"] and config.eval.base_cache
        assert (config.heldout, config.eval, config.domains) == (grid["a_log_ratio"].heldout,
                                                                 grid["a_log_ratio"].eval, grid["a_log_ratio"].domains)
        assert config.heldout.fraction >= 0.2 and len(config.heldout.types) == 2 and ">= 0.70" in config.goal
    assert [grid[n].pairs.ties for n in sorted(grid)] == ["drop", "tie", "tie", "tie", "tie"]
    assert [grid[n].train.get("training_form", "log_ratio") for n in sorted(grid)] == \
        ["log_ratio", "log_ratio", "mean_logprob", "mean_logprob", "mean_logprob"]
    assert [grid[n].replay.share for n in sorted(grid)] == [0, 0, 0, 0, 0.1]
    first, again = grid["c_mean_ties"], grid["c_mean_ties_reseed"]  # the reseed: (c) with another training seed
    assert (first.train["seed"], again.train["seed"]) == (42, 43) and again.output_dir != first.output_dir
    assert {**again.train, "seed": 42} == {**first.train, "cpu_allocator": "keep"}  # keep: the same figures, faster
    assert (again.pairs, again.model, again.recipe) == (first.pairs, first.model, first.recipe)
    assert "within the 95% interval of (c)'s first run" in again.goal
    proof = configs["smollm2_pointwise.yaml"]
    assert (proof.pairs.form, proof.pairs.ties, proof.heldout.types) == ("response", "drop", ["element_substitution"])
    assert proof.heldout.fraction >= 0.2  # and three error types trained
    assert {"numerical_perturbation", "equipment_substitution", "action_antonym", "step_order", "unit_swap",
            "precursor_substitution"} <= set(proof.items.sets) and proof.items.spec == "synthesis"
    assert proof.eval.options["eval_regression_margin"] == 0.05 and ">= 0.65" in proof.goal and "2 hours" in proof.goal


def test_a_rerun_continues_only_the_loop_its_config_started_and_may_add_rounds(tmp_path):
    from judgetrain.loop.config import LoopConfigError, load_config
    from judgetrain.loop.run import open_state

    config = load_config(loop_config(tmp_path))
    state = open_state(config, tmp_path / "loop")
    # the config's settings and each round's stages are recorded from the start (`judgetrain report` reads them)
    assert state["settings"]["rounds"] == 2 and state["settings"]["heldout"]["fraction"] == 0.25
    assert state["stages"] == ["items", "split", "pairs", "train", "eval"]
    state["done"]["1/items"] = {"wall_s": 1.0, "cpu_s": 0.5}
    (tmp_path / "loop" / "loop_state.json").write_text(json.dumps(state))
    more = load_config(loop_config(tmp_path, rounds=5, goal="held-out verdicts right in both orders"))
    grown = open_state(more, tmp_path / "loop")  # more rounds, the goal reworded: the same loop
    assert grown["done"] == {"1/items": {"wall_s": 1.0, "cpu_s": 0.5}}
    assert grown["settings"]["rounds"] == 5 and grown["settings"]["goal"] == "held-out verdicts right in both orders"
    other = load_config(loop_config(tmp_path, model="smollm2-135m-instruct"))
    with pytest.raises(LoopConfigError, match="holds a loop started with another config"):
        open_state(other, tmp_path / "loop")


def recomputed_accuracy(rows: list[dict]) -> tuple[float, float]:
    """Verdict mode's accuracy (right in both orders) and inconsistent rate, from a suite's per-row file: the BA
    verdict names the row's B as A."""
    swap = {"A>B": "B>A", "B>A": "A>B"}
    right = [r["verdicts"][0] == r["label"] and swap.get(r["verdicts"][1]) == r["label"] for r in rows]
    flips = [swap.get(r["verdicts"][1]) != r["verdicts"][0] for r in rows]
    return sum(right) / len(rows), sum(flips) / len(rows)


def evaluation_of(out: Path, k: int) -> Path:
    """Round k's one evaluation folder (round 0: the base's, scored once)."""
    (folder,) = [p for p in (out / f"round-{k}" / "eval").iterdir() if p.is_dir()]
    return folder


def assert_table_matches_per_row_files(out: Path, rounds: int, n_heldout: int) -> list[dict]:
    """rounds.json against each round's per-row files (judge and verdict mode of the held-out pairs): every
    figure, its round and its difference against the base (round 0's files, scored once) recomputed. Returns the
    table's rows."""
    table = json.loads((out / "rounds.json").read_text())
    keys, rows = table["keys"], table["rows"]
    assert {r["round"] for r in rows} == set(range(rounds + 1))
    for k in range(rounds + 1):
        per_row = read_jsonl(evaluation_of(out, k) / "pairwise.verdict.jsonl")
        assert len(per_row) == n_heldout
        accuracy, inconsistent = recomputed_accuracy(per_row)
        assert keys[f"round/{k}/eval/pairwise/verdict/accuracy"] == pytest.approx(accuracy)
        assert keys[f"round/{k}/eval/pairwise/verdict/inconsistent_rate"] == pytest.approx(inconsistent)
        judge_rows = read_jsonl(evaluation_of(out, k) / "pairwise.jsonl")  # judge mode: one verdict from the two scores
        judge_accuracy = sum(r["verdicts"][0] == r["label"] for r in judge_rows) / len(judge_rows)
        assert keys[f"round/{k}/eval/pairwise/accuracy"] == pytest.approx(judge_accuracy)
        assert all((r["scores"][0] > r["scores"][1]) == (r["verdicts"][0] == "A>B") for r in judge_rows)
        row = next(r for r in rows if r["round"] == k and r["figure"] == "pairwise/verdict/accuracy")
        assert row["value"] == pytest.approx(accuracy) and row["n"] == n_heldout
        if k:
            base = recomputed_accuracy(read_jsonl(evaluation_of(out, 0) / "pairwise.verdict.jsonl"))
            assert keys[f"round/{k}/eval/pairwise/verdict/delta/accuracy"] == pytest.approx(accuracy - base[0])
            assert row["delta"] == pytest.approx(accuracy - base[0])
            assert f"round/{k}/eval/pairwise/verdict/delta/accuracy/p_value" in keys
            base_rows = read_jsonl(evaluation_of(out, 0) / "pairwise.jsonl")
            base_judge = sum(r["verdicts"][0] == r["label"] for r in base_rows) / len(base_rows)
            assert keys[f"round/{k}/eval/pairwise/delta/accuracy"] == pytest.approx(judge_accuracy - base_judge)
    return rows


@pytest.mark.slow
def test_two_rounds_end_to_end_files_and_table_agree(tmp_path, tiny_judge):
    config = loop_config(tmp_path, heldout={"fraction": 0.25, "types": ["spacing"]},
                         eval={"suites": ["pairwise", "rewrites"], "scoring": ["judge", "verdict"]})
    proc = subprocess.run(loop_command(config), cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = tmp_path / "loop"
    assert "| figure (mode: reading) | base | round 1 | round 2 |" in proc.stdout
    heldout = read_jsonl(out / "heldout" / "pairwise.jsonl")
    split = json.loads((out / "round-1" / "split" / "split.json").read_text())
    assert len(heldout) == 3 and {r["id"].split("|")[0] for r in heldout} == set(split["heldout_samples"])
    for k in (1, 2):
        rd = out / f"round-{k}"
        train_items = read_jsonl(rd / "split" / "train.jsonl")
        assert {r["sample_id"] for r in train_items}.isdisjoint(int(s) for s in split["heldout_samples"])
        assert {r["perturbation_type"] for r in train_items} == {"original", "drug_swap"}  # spacing held out whole
        recipe = yaml.safe_load((rd / "recipe.yaml").read_text())
        assert recipe["train_datasets"] == [{"dataset": "preference", "source": str(rd / "pairs"), "split": "train"}]
        assert recipe.get("init_adapter") == (str(out / "round-1" / "train") if k == 2 else None)
        assert (rd / "train" / "adapter_model.safetensors").is_file()
        assert len([m for m in read_jsonl(rd / "train" / "metrics.jsonl") if "train/loss" in m]) == 2
    rows = assert_table_matches_per_row_files(out, rounds=2, n_heldout=len(heldout))
    # the held-out rewrites (spacing held out whole: every note's against its source; against an error copy, the
    # held-out notes' alone) scored by the rewrites suite, each round against the base
    rewrites = read_jsonl(out / "heldout" / "rewrites.jsonl")
    assert sorted(Counter(r["category"] for r in rewrites).items()) == [("rewrite_vs_error", 3),
                                                                         ("source_vs_rewrite", 12)]
    keys = json.loads((out / "rounds.json").read_text())["keys"]
    for k in (0, 1, 2):
        assert 0 <= keys[f"round/{k}/eval/rewrites/rewrite_over_error"] <= 1
        assert f"round/{k}/eval/rewrites/rewrite_gap" in keys
    assert all(f"round/{k}/eval/rewrites/delta/rewrite_below_source_rate" in keys for k in (1, 2))
    csv_lines = (out / "rounds.csv").read_text().splitlines()
    assert csv_lines[0].startswith("round,figure,mode,reading,value,ci_low,ci_high,delta") and len(csv_lines) == len(rows) + 1
    state = json.loads((out / "loop_state.json").read_text())
    assert sorted(state["done"]) == sorted(["0/eval"] + [f"{k}/{s}" for k in (1, 2) for s in ("items", "split", "pairs",
                                                                                                "train", "eval")])
    # the base is scored once: round 0 alone holds its evaluation, each round one evaluation and its comparison
    assert all(len([p for p in (out / f"round-{k}" / "eval").iterdir() if p.is_dir()]) == 1 for k in (0, 1, 2))
    assert all((out / f"round-{k}" / "eval" / "compare.json").is_file() for k in (1, 2))
    assert all(v["wall_s"] > 0 and v["cpu_s"] >= 0 for v in state["done"].values())

    from judgetrain.report.build import make_report

    paths = make_report([out], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "rounds.png" in paths and "rounds.png" in md
    # the loop's report: finished, the headline round table first, each round's training report beside it
    assert md.splitlines()[2] == "**Status: finished: every stage of the 2 rounds done.**"
    assert ("| figure (mode: reading) | base (round 0) | round 1 | round 2 |" in md
            and "\n| pairwise/verdict/accuracy (verdict: verdict_logprob) | " in md)
    assert all((tmp_path / "report" / f"round-{k}" / "report.html").is_file() for k in (1, 2))
    assert "no recipe.yaml" not in md and "no metrics.jsonl" not in md
    # a rerun of a finished loop runs nothing again
    again = subprocess.run(loop_command(config), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "train done earlier, skipped" in again.stderr
    assert len([e for e in read_jsonl(out / "stages.jsonl") if e["event"] == "start"]) == 11


# where each stage has begun its work (the kill waits for it, so that it lands inside the stage)
INSIDE = {"items": "round-1/items", "split": None, "judge": "round-1/judge/round0-s1", "pairs": "round-1/pairs",
          "train": "round-1/train", "eval": "round-1/eval"}


@pytest.mark.slow
def test_killed_during_each_stage_then_rerun_every_stage_is_done_once(tmp_path, tiny_judge):
    config = loop_config(tmp_path, rounds=1, pairs={"method": "known", "form": "pointwise"},
                         judge={"samples": 2, "force_score_prefix": True, "max_new_tokens": 8})
    out = tmp_path / "loop"
    stopped_inside = []
    for stage, inside in INSIDE.items():
        proc = subprocess.Popen(loop_command(config), cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        while proc.poll() is None:
            started = any(e["stage"] == stage and e["event"] == "start" for e in read_jsonl(out / "stages.jsonl")) \
                if (out / "stages.jsonl").is_file() else False
            if started and (inside is None or (out / inside).exists()):
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"the loop ended before {stage} began"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        done = json.loads((out / "loop_state.json").read_text())["done"]
        if f"1/{stage}" not in done:
            stopped_inside.append(stage)
    assert set(stopped_inside) >= {"items", "judge", "pairs", "train", "eval"}, stopped_inside
    final = subprocess.run(loop_command(config), cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert final.returncode == 0, final.stderr[-4000:]
    events = read_jsonl(out / "stages.jsonl")
    done = Counter((e["round"], e["stage"]) for e in events if e["event"] == "done")
    assert done == Counter({(1, s): 1 for s in INSIDE} | {(0, "eval"): 1}), done
    starts = Counter(e["stage"] for e in events if e["event"] == "start" and e["round"] == 1)
    # each stage killed inside was begun again (a kill aimed at a stage as short as the split can land in the next
    # one, which is then begun a third time); what counts is that each ended done once, above
    assert all(starts[s] >= 2 for s in stopped_inside), starts
    assert json.loads((out / "rounds.json").read_text())["keys"]["round/1/eval/pairwise/verdict/n"] == 3
    assert len(read_jsonl(out / "round-1" / "judge" / "evaluations.jsonl")) == 2 * len(
        read_jsonl(out / "round-1" / "split" / "train.jsonl"))


def test_verdict_pairs_on_a_reference_relative_loss_are_warned_about(caplog):
    """Verdict pairs in both orders ask a reference-relative loss for opposite changes of the base's position
    preference: the loop says so, naming the likelihood term that trains the verdicts; an sft term, pointwise pairs
    or anchor pairs are not warned about."""
    from judgetrain.loop.config import Pairs
    from judgetrain.loop.run import warn_reference_relative

    caplog.set_level("WARNING", logger="judgetrain.loop.run")
    assert warn_reference_relative({"loss_type": ["sigmoid"]}, Pairs(method="known", form="pairwise"))
    assert warn_reference_relative({}, Pairs(method="known", form="pairwise"))  # TRL's default: sigmoid alone
    assert "loss_type: [sigmoid, sft]" in caplog.text
    assert not warn_reference_relative({"loss_type": ["sigmoid", "sft"]}, Pairs(method="known", form="pairwise"))
    assert not warn_reference_relative({"loss_type": "sigmoid"}, Pairs(method="known", form="pointwise"))
    assert not warn_reference_relative({"loss_type": "sigmoid"}, Pairs(method="anchor"))

    from judgetrain.loop.run import warn_orders_apart

    caplog.clear()
    assert warn_orders_apart({"loss_type": ["sigmoid", "sft"]}, Pairs(method="known", form="pairwise"))
    assert "set train: {batch_groups: true}" in caplog.text
    assert not warn_orders_apart({"batch_groups": True}, Pairs(method="known", form="pairwise"))
    assert not warn_orders_apart({}, Pairs(method="known", form="pointwise"))


def _judgebench_rows(path: Path, n: int, long: int = 0) -> Path:
    """``n`` JudgeBench-schema pairs (the better response second in odd rows), then ``long`` more whose worse response
    is 3,000 words (longer than any recipe's max_length here)."""
    worse = ["none"] * n + [" ".join(["none"] * 3000)] * long
    rows = [{"pair_id": f"jb{i}", "original_id": str(i), "source": "mmlu-pro-math", "question": f"What is {i} + {i}?",
             "response_model": "m", "response_A": f"{2 * i}" if i % 2 == 0 else worse[i],
             "response_B": worse[i] if i % 2 == 0 else f"{2 * i}", "label": "A>B" if i % 2 == 0 else "B>A"}
            for i in range(n + long)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_replay_share_mixes_general_pairs_into_the_rounds_training_rows_and_counts_them(tmp_path, capsys):
    """9 training notes make 9 response pairs; a replay share of 0.25 asks 0.25 / 0.75 x 9 = 3 JudgeBench pairs beside
    them (drawn from the 6 that fit max_length, 3 longer rows left out and counted), written beside the pairs, counted
    in stats.json and trained on by the round's recipe.
    Replaying a benchmark the run scores, or a source with a bad row, is refused before anything runs, naming the key
    (and the row); the response form's rewrites train as ties once the training recipe names a tie model."""
    from judgetrain.cli import main
    from judgetrain.data.preference import load_preference
    from judgetrain.loop.config import load_config, round_recipe
    from judgetrain.loop.run import Loop, open_state

    source = _judgebench_rows(tmp_path / "judgebench.jsonl", 6)
    replay = {"suite": "judgebench", "source": str(source), "share": 0.25, "seed": 0}
    scored = loop_config(tmp_path, replay=replay, eval={"suites": ["pairwise", "judgebench"], "scoring": ["verdict"]})
    assert main(["loop", str(scored)]) == 2
    assert "replay.suite: judgebench is scored by eval.suites" in capsys.readouterr().err
    with open(source, "a", encoding="utf-8") as f:
        f.write(json.dumps({**read_jsonl(source)[0], "pair_id": "tie", "label": "A=B"}) + "\n")
    assert main(["loop", str(loop_config(tmp_path, replay=replay))]) == 2
    assert "replay.source: " in (said := capsys.readouterr().err) and "row 6, field 'label'" in said
    _judgebench_rows(source, 6, long=3)  # 3 rows that training would skip: left out of the draw, counted
    config = load_config(loop_config(tmp_path, replay=replay, train={"max_steps": 2, "tie_model": "rao_kupper"},
                                     pairs={"method": "known", "form": "response", "ties": "tie"}))
    out = Path(config.output_dir)
    loop = Loop(config, out, open_state(config, out))
    for stage in ("items", "split", "pairs"):
        loop.stage(1, stage)
    pairs = out / "round-1" / "pairs"
    counts = json.loads((pairs / "stats.json").read_text())["replay"]
    n_pairs = counts["training_pairs"]
    assert n_pairs == pq.read_metadata(pairs / "train.parquet").num_rows and n_pairs > 0
    assert counts["rows_wanted"] == round(0.25 * n_pairs / 0.75) and counts["available"] == 6
    assert (counts["source_rows"], counts["too_long"], counts["max_length"]) == (9, 3, 1024)
    rejects = read_jsonl(pairs / "rejects" / "replay_long_rows.jsonl")
    assert sorted(r["data"]["replay_row"] for r in rejects) == [6, 7, 8]
    assert counts["rows"] == min(6, counts["rows_wanted"])
    replayed = load_preference(str(pairs / "replay.jsonl"))
    assert len(replayed) == counts["rows"]
    for row in replayed:  # the better response chosen, whichever side the file showed it on; none of the long rows
        i = int(row["sample_id"].removeprefix("replay:jb"))
        assert row["chosen"][0]["content"] == str(2 * i) and row["rejected"][0]["content"] == "none"
    trained_on = round_recipe(config, {}, out / "round-1", None)["train_datasets"]
    assert [c["source"] for c in trained_on] == [str(pairs), str(pairs / "replay.jsonl")]
    assert any(pq.read_table(pairs / "train.parquet").column("tie").to_pylist())  # rewrites against their source
    from judgetrain.report.loop import goal_lines, read_loop

    assert "Trained form: log_ratio, which trains the implicit reading (log_ratio)" in " ".join(goal_lines(read_loop(out)))


def test_the_base_is_scored_once_for_every_config_that_scores_it_alike(tmp_path, monkeypatch):
    """Two loop configs with other output folders but the same base, held-out rows and modes (``eval.base_cache``):
    the first scores the base (a real `judgetrain eval` of the tiny judge), the second reads that evaluation from
    the judgetrain cache and runs no command; a third that scores another mode gets another key."""
    from judgetrain.loop import run as loop_run
    from judgetrain.loop.basecache import base_eval_key
    from judgetrain.loop.config import load_config
    from judgetrain.loop.run import Loop, open_state

    monkeypatch.setenv("JUDGETRAIN_CACHE", str(tmp_path / "cache"))
    loops = []
    for name, scoring in (("a", ["implicit"]), ("b", ["implicit"]), ("c", ["judge"])):
        (tmp_path / name).mkdir()
        config = load_config(loop_config(tmp_path / name, output_dir=str(tmp_path / name / "loop"),
                                         eval={"suites": ["pairwise"], "scoring": scoring, "base_cache": True}))
        out = Path(config.output_dir)
        loops.append(Loop(config, out, open_state(config, out)))
        for stage in ("items", "split"):
            loops[-1].stage(1, stage)
    loops[0].stage_eval(0, loops[0].round_dir(0))
    commands = []
    monkeypatch.setattr(loop_run, "run_command", lambda argv, *launch: commands.append(argv))
    loops[1].stage_eval(0, loops[1].round_dir(0))
    assert commands == []  # read from the cache
    (first,), (second,) = (sorted((loop.round_dir(0) / "eval").glob("*/results.json")) for loop in loops[:2])
    assert json.loads(first.read_text())["metrics"] == json.loads(second.read_text())["metrics"]
    assert first.parent.name == second.parent.name
    # the base's log-probs came with it: round 1's implicit scoring subtracts them instead of scoring the base again
    reference = second.parent / "eval_reference.json"
    assert len(json.loads(reference.read_text())["values"]) > 0
    loops[1].stage_eval(1, loops[1].round_dir(1))
    assert commands[0][commands[0].index("--reference_logprobs") + 1] == str(reference)
    commands.clear()
    loops[2].stage_eval(0, loops[2].round_dir(0))
    assert len(commands) == 1 and "judge" in commands[0]  # another mode: another key, scored
    key = base_eval_key(commands[0])
    assert key == base_eval_key([*commands[0][:-1], commands[0][-1]]) and key != base_eval_key(
        [("implicit" if a == "judge" else a) for a in commands[0]])


WARD_SPEC = {"name": "ward", "original": False,
             "template": [{"role": "system", "content": "Judge the order. End with ```json {\"overall_score\": ...}```."},
                          {"role": "user", "content": "Ward: {{ward}}\n\nOrder:\n{{text}}"}],
             "operators": {"route_swap": {"kind": "table", "category": "error",  # each route for another the orders use
                                          "pairs": {"oral": "rectal", "rectal": "topical", "topical": "oral"}}},
             "sets": [{"name": "route_swap"}]}
ROUTES = ("oral", "rectal", "topical")


def two_domain_config(tmp_path: Path) -> Path:
    """The clinic notes and a second domain, ward orders numbered alike (sample ids 0-11 in both): drug_swap held
    out whole in the clinic domain (whose training pairs are then its rewrites against their sources, as ties), a
    quarter of each domain's samples held out."""
    path = loop_config(tmp_path, pairs={"method": "known", "form": "response", "ties": "tie"},
                       heldout={"fraction": 0.25, "types": ["drug_swap"]})
    (tmp_path / "ward.yaml").write_text(yaml.safe_dump(WARD_SPEC, sort_keys=False), encoding="utf-8")
    orders = [{"sample_id": i, "ward": f"W{i}", "text": f"Give {DRUGS[i % 3]} by the {ROUTES[(i // 3) % 3]} route "
               f"every {4 + i} hours."} for i in range(12)]
    (tmp_path / "orders.jsonl").write_text("".join(json.dumps(o) + "\n" for o in orders), encoding="utf-8")
    config = yaml.safe_load(path.read_text())
    config["train"]["tie_model"] = "rao_kupper"
    items = config.pop("items")
    config["domains"] = [{"name": "clinic", **items},
                         {"name": "ward", "source": str(tmp_path / "orders.jsonl"), "spec": str(tmp_path / "ward.yaml")}]
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def test_an_edit_of_a_domains_spec_between_runs_refuses_to_resume_naming_the_domain_and_file(tmp_path):
    from judgetrain.loop.config import LoopConfigError, load_config
    from judgetrain.loop.run import open_state

    config = two_domain_config(tmp_path)
    open_state(load_config(config), tmp_path / "loop")
    spec = yaml.safe_load((tmp_path / "ward.yaml").read_text())
    spec["name"] = "ward, edited"
    (tmp_path / "ward.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    with pytest.raises(LoopConfigError, match=r"other contents of domains\.ward\.spec \(.*ward\.yaml\): the file"):
        open_state(load_config(config), tmp_path / "loop")


def test_two_domains_split_and_pair_apart_and_pool_their_pairs_and_held_out_rows(tmp_path):
    """A loop over two domains whose samples are numbered alike: each domain's items, split and pairs in its own
    folder; the held-out rows pooled with each sample id named by its domain (no clinic sample shares a unit with
    the ward sample of the same number); the training pairs pooled, their count the domains' sum; drug_swap, held
    out whole, trains in neither domain."""
    from judgetrain.cli import main

    config = two_domain_config(tmp_path)
    assert main(["loop", str(config), "--data_only"]) == 0
    rd = tmp_path / "loop" / "round-1"
    per = {name: pq.read_table(rd / "domains" / name / "pairs" / "train.parquet").to_pylist()
           for name in ("clinic", "ward")}
    pooled = pq.read_table(rd / "pairs" / "train.parquet").to_pylist()
    assert per["ward"] and per["clinic"] and all(r["tie"] for r in per["clinic"])  # clinic: its rewrites as ties
    assert not any(r["tie"] for r in per["ward"])
    assert len(pooled) == len(per["clinic"]) + len(per["ward"])
    assert pooled == per["clinic"] + per["ward"]  # each with its own domain's question
    stats = json.loads((rd / "pairs" / "stats.json").read_text())
    assert stats["train_pairs"] == len(pooled) and sorted(stats["domains"]) == ["clinic", "ward"]
    split = json.loads((rd / "split" / "split.json").read_text())
    clinic = json.loads((rd / "domains" / "clinic" / "split" / "split.json").read_text())
    ward = json.loads((rd / "domains" / "ward" / "split" / "split.json").read_text())
    assert split["train_items"] == clinic["train_items"] + ward["train_items"]
    assert sorted(split["heldout_samples"]) == sorted([f"clinic/{s}" for s in clinic["heldout_samples"]]
                                                      + [f"ward/{s}" for s in ward["heldout_samples"]])
    trained = read_jsonl(rd / "domains" / "clinic" / "split" / "train.jsonl")
    assert not any(r["perturbation_type"] == "drug_swap" for r in trained)
    held = read_jsonl(tmp_path / "loop" / "heldout" / "pairwise.jsonl")
    assert {r["domain"] for r in held} == {"clinic", "ward"}
    assert all(r["sample_id"].startswith(r["domain"] + "/") and r["id"].startswith(r["domain"] + "/") for r in held)
    drug = [r for r in held if r["category"] == "drug_swap"]
    assert len({r["sample_id"] for r in drug}) == 12  # every clinic sample: the type is held out whole
    assert {r["sample_id"] for r in held if r["category"] == "route_swap"} == {f"ward/{s}"
                                                                                for s in ward["heldout_samples"]}


@pytest.mark.parametrize("edit, message", [
    ({"items": {"source": "x.jsonl", "spec": "y.yaml"}}, "items and domains: name the factories in one of them"),
    ({"domains": [{"source": "x", "spec": "y"}]}, "domains[0].name: '': each domain needs a name of its own"),
    ({"domains": "clinic"}, "domains: a list of mappings"),
    ({"domains": [{"name": "a", "sorce": "x"}]}, "unknown key 'domains[0].sorce'; did you mean 'source'?"),
])
def test_a_bad_domains_section_is_refused_naming_the_key(tmp_path, capsys, edit, message):
    from judgetrain.cli import main

    config = yaml.safe_load(two_domain_config(tmp_path).read_text())
    config.update(edit)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    assert main(["loop", str(path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_the_quickstart_smoke_run_takes_every_stage_on_the_tiny_judge(tmp_path):
    """`judgetrain loop recipes/loops/quickstart.yaml --smoke`: the README's smoke line, the quickstart's stages on
    the embedded tiny judge, a few steps and rows, into <output_dir>-smoke, said to be a smoke run."""
    text = (REPO / "recipes" / "loops" / "quickstart.yaml").read_text(encoding="utf-8")
    config = tmp_path / "quickstart.yaml"
    config.write_text(text.replace("output_dir: loops/quickstart", f"output_dir: {tmp_path / 'quick'}"),
                      encoding="utf-8")
    proc = subprocess.run([*loop_command(config), "--smoke"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "smoke run: tiny-judge (random weights) in place of the config's judge" in proc.stderr
    out = tmp_path / "quick-smoke"
    assert not (tmp_path / "quick").exists() and (out / "rounds.json").is_file()
    assert "| figure (mode: reading) | base | round 1 |" in proc.stdout and "(loglik_mean)" in proc.stdout
    recipe = yaml.safe_load((out / "round-1" / "recipe.yaml").read_text())
    assert (recipe["model_name_or_path"], recipe["max_steps"]) == ("tiny-judge", 2)
    assert len([m for m in read_jsonl(out / "round-1" / "train" / "metrics.jsonl") if "train/loss" in m]) == 2
    status = read_jsonl(out / "round-1" / "train" / "judgetrain_status.jsonl")[-1]  # the quickstart trains under keep
    assert status["status"] == "finished" and status["cpu_allocator"] == "keep"
    assert isinstance(status["heap_trims"], int) and status["heap_trims"] >= 0
    scored = read_jsonl(next((out / "round-1" / "eval").glob("*/pairwise.jsonl")))
    assert 0 < len(scored) <= 8
