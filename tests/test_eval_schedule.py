"""The eval schedule and checkpoint selection through TrainingArguments' own keys (eval_strategy, eval_steps,
eval_on_start, metric_for_best_model, load_best_model_at_end, save_strategy: best) on the quickstart with the tiny
judge; judgetrain's old schedule keys refused; one set of eval option names for recipes and `judgetrain eval`."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import QUICKSTART, read_jsonl
from judgetrain.config.recipe import EvalArguments, RecipeError, parse_recipe, valid_keys

METRIC = "eval/judgebias/error/accuracy"


def _recipe(tmp_path: Path, extra: str) -> str:
    path = tmp_path / "r.yaml"
    text = QUICKSTART.read_text().replace("eval_suites: [rmbench, judgebias, ideation]", "eval_suites: [judgebias]")
    text += "\nmax_steps: 6\nlogging_steps: 1\neval_max_rows: 8\neval_scoring: implicit\neval_on_start: false\n"
    path.write_text(text + extra)
    return str(path)


# ------------------------------------------------------------------------------------------ schedule keys
def test_eval_strategy_defaults_to_epoch_with_suites_to_steps_with_eval_steps_and_to_no_without_suites():
    recipe = parse_recipe([str(QUICKSTART)])
    t, resolved = recipe.training_args, recipe.resolved
    assert t.eval_strategy == "epoch" and "eval_strategy" not in resolved  # the recipe as written is what is saved
    t = parse_recipe([str(QUICKSTART), "--eval_steps", "3"]).training_args
    assert t.eval_strategy == "steps" and t.eval_steps == 3
    t = parse_recipe([str(QUICKSTART), "--eval_steps", "3", "--eval_strategy", "epoch"]).training_args
    assert t.eval_strategy == "epoch"  # an explicit strategy is the recipe's, as in TrainingArguments
    recipe = parse_recipe([str(QUICKSTART), "--eval_suites", "none"])
    s, t = recipe.script_args, recipe.training_args
    assert s.eval_suites == [] and t.eval_strategy == "no"
    t = parse_recipe([str(QUICKSTART), "--eval_strategy", "no"]).training_args
    assert t.eval_strategy == "no"


@pytest.mark.parametrize("old, new", [("eval_every_n_steps", "eval_steps"), ("eval_suites_on_start", "eval_on_start")])
def test_old_schedule_keys_are_refused_naming_the_new_key(tmp_path, old, new):
    path = tmp_path / "old.yaml"
    path.write_text(QUICKSTART.read_text() + f"\n{old}: 2\n")
    with pytest.raises(RecipeError, match=rf"unknown key '{old}'; did you mean '{new}'\?"):
        parse_recipe([str(path)])
    with pytest.raises(RecipeError, match=rf"unknown option --{old}; did you mean --{new}\?"):
        parse_recipe([str(QUICKSTART), f"--{old}", "2"])


def test_an_eval_schedule_without_suites_is_refused_naming_the_key():
    for flags, key in ((["--eval_strategy", "steps"], "eval_strategy: steps"),
                       (["--save_strategy", "best", "--metric_for_best_model", METRIC], "save_strategy: best")):
        with pytest.raises(RecipeError, match=rf"{key} asks for evaluations, but eval_suites is empty"):
            parse_recipe([str(QUICKSTART), "--eval_suites", "none", *flags])
    # eval_suites: none turns the evaluation off, the quickstart's baseline before the first step with it
    assert parse_recipe([str(QUICKSTART)]).training_args.eval_on_start is True
    recipe = parse_recipe([str(QUICKSTART), "--eval_suites", "none", "--eval_on_start", "true"])
    assert recipe.training_args.eval_on_start is False and recipe.training_args.eval_strategy == "no"


def test_metric_for_best_model_is_taken_as_metrics_jsonl_spells_it_or_as_trainer_does_and_checked():
    for spelling in ("eval/rmbench/total_avg_acc", "eval_rmbench/total_avg_acc", "rmbench/total_avg_acc"):
        t = parse_recipe([str(QUICKSTART), "--metric_for_best_model", spelling, "--load_best_model_at_end",
                                   "--save_strategy", "best"]).training_args
        assert t.metric_for_best_model == "eval_rmbench/total_avg_acc" and t.greater_is_better is True
    with pytest.raises(RecipeError, match=r"metric_for_best_model: 'loss' \(TrainingArguments' default with "
                                          r"load_best_model_at_end\) is not a figure of the eval suites"):
        parse_recipe([str(QUICKSTART), "--load_best_model_at_end", "--save_strategy", "best"])
    with pytest.raises(RecipeError, match=r"'eval/rmbench/hard_acc' is not a figure of the eval suites \(judgebias\)"):
        parse_recipe([str(QUICKSTART), "--eval_suites", "judgebias",
                      "--metric_for_best_model", "eval/rmbench/hard_acc"])



def test_greater_is_better_follows_the_figure_s_direction():
    """style_spread is lower-is-better (`judgetrain.config.directions`): Trainer's own default (higher unless the name
    ends in "loss") would keep the checkpoint whose style moves the judge most."""
    t = parse_recipe([str(QUICKSTART), "--metric_for_best_model", "eval/rmbench/style_spread"]).training_args
    assert t.metric_for_best_model == "eval_rmbench/style_spread" and t.greater_is_better is False
    with pytest.raises(RecipeError, match=r"greater_is_better: True, but rmbench/style_spread is lower-is-better"):
        parse_recipe([str(QUICKSTART), "--metric_for_best_model", "eval/rmbench/style_spread",
                      "--greater_is_better", "true"])
    with pytest.raises(RecipeError, match=r"metric_for_best_model: rmbench/hard_acc/ci_low: not a figure to rank"):
        parse_recipe([str(QUICKSTART), "--metric_for_best_model", "eval/rmbench/hard_acc/ci_low"])


def test_choice_keys_name_the_key_and_the_valid_values(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(QUICKSTART.read_text().replace("long_rows: error ", "long_rows: cut "))
    with pytest.raises(RecipeError, match=r"long_rows: 'cut' is not one of \['error', 'skip', 'truncate', "
                                          r"'shorten_prompt'\]"):
        parse_recipe([str(path)])
    with pytest.raises(RecipeError, match=r"--eval_scoring.*invalid choice: 'jugde' "
                                          r"\(choose from 'implicit', 'loglik_sum', 'loglik_mean', 'judge', 'verdict', 'generate'\)"):
        parse_recipe([str(QUICKSTART), "--eval_scoring", "jugde"])
    with pytest.raises(RecipeError, match=r"unknown option --num_train_epoc; did you mean --num_train_epochs"):
        parse_recipe([str(QUICKSTART), "--num_train_epoc", "3"])  # no abbreviation of an option is taken for it


# ------------------------------------------------------------------------------------------ eval option names
def test_eval_options_are_recipe_keys_and_judgetrain_eval_flags_by_the_same_names():
    from judgetrain.cli.eval import build_parser, parse_args

    flags = {o for action in build_parser()._actions for o in action.option_strings}
    for f in fields(EvalArguments):
        assert f.name in valid_keys() and f"--{f.name}" in flags, f.name
    eval_args, args = parse_args(["--model", "x", "--eval_suites", "rmbench,judgebias", "--eval_max_rows", "7",
                                  "--no_eval_prefix_sharing", "--eval-batch-tokens", "512", "--max-length", "64"])
    assert eval_args.eval_suites == ["rmbench", "judgebias"] and eval_args.eval_max_rows == 7
    assert eval_args.eval_prefix_sharing is False and eval_args.eval_batch_tokens == 512 and args.max_length == 64
    s = parse_recipe([str(QUICKSTART), "--eval_suites", "rmbench", "judgebias", "--eval_max_rows", "7"]).script_args
    assert s.eval_suites == ["rmbench", "judgebias"] and s.eval_max_rows == 7


@pytest.mark.parametrize("old, new", [("--suites", "--eval_suites"), ("--max-rows", "--eval_max_rows"),
                                      ("--rmbench-source", "--eval_rmbench_source"),
                                      ("--no-prefix-sharing", "--no_eval_prefix_sharing")])
def test_judgetrain_eval_old_flag_spellings_are_refused_naming_the_new_flag(old, new, capsys):
    from judgetrain.cli.eval import main

    with pytest.raises(SystemExit) as stop:
        main(["--model", "tiny-judge", old, "2"])
    assert stop.value.code == 2 and f"unknown option {old}; did you mean {new}?" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ a real run
@pytest.mark.slow
def test_best_checkpoint_is_the_best_eval_in_metrics_jsonl_and_only_improving_ones_are_saved(tmp_path, tiny_judge):
    from judgetrain.train import run

    out = tmp_path / "run"
    recipe = _recipe(tmp_path, "eval_strategy: steps\neval_steps: 2\neval_on_start: true\n"
                     f"metric_for_best_model: {METRIC}\nload_best_model_at_end: true\nsave_strategy: best\n")
    summary = run([recipe, "--output_dir", str(out)])
    assert summary["exit_code"] == 0 and summary["global_step"] == 6

    evals = [(r["step"], r[METRIC]) for r in read_jsonl(out / "metrics.jsonl") if METRIC in r]
    assert [step for step, _ in evals] == [0, 2, 4, 6]  # eval_on_start, then every eval_steps: once each
    # the baseline: before the first step the LoRA adapter is the identity, policy == reference, every margin 0
    before = read_jsonl(out / "eval" / "0" / "judgebias.jsonl")
    assert len(before) == 8 and max(abs(r["score_chosen"] - r["score_rejected"]) for r in before) < 1e-4
    improving, best = [], None
    for step, value in evals[1:]:  # the eval_on_start baseline has no checkpoint and does not compete
        if best is None or value > best[1]:
            improving.append(step)
            best = (step, value)
    assert summary["best_model_checkpoint"] == str(out / f"checkpoint-{best[0]}")
    assert summary["best_metric"] == pytest.approx(best[1])
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert saved == improving and len(saved) < 3, evals  # save_strategy best: no save for an eval that did not improve
    for step in saved:  # judgetrain's completion marker on each
        assert (out / f"checkpoint-{step}" / "judgetrain_complete.json").is_file(), step
    final = load_file(out / "adapter_model.safetensors")
    kept = load_file(out / f"checkpoint-{best[0]}" / "adapter_model.safetensors")
    assert final.keys() == kept.keys() and all(torch.equal(final[k], kept[k]) for k in final)  # load_best_model_at_end


@pytest.mark.slow
def test_a_metric_for_best_model_the_suites_do_not_log_stops_at_the_first_eval_with_a_hint(tmp_path, tiny_judge):
    from judgetrain.train import run

    out = tmp_path / "run"
    recipe = _recipe(tmp_path, "eval_on_start: true\nmetric_for_best_model: eval/judgebias/error/acuracy\n")
    with pytest.raises(ValueError, match=r"metric_for_best_model: 'eval_judgebias/error/acuracy' is not among the "
                                         r"figures the eval suites logged; "
                                         r"did you mean 'eval_judgebias/error/accuracy'\?"):
        run([recipe, "--output_dir", str(out)])
    assert not [r for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]  # before the first step
