"""The trained judge's model card on run folders laid out as training writes them (the quickstart's own card:
tests/test_train.py): base model names, no machine path, the model-index, which evaluation the weights are."""

import json
import re

import pytest
import yaml

from helpers import QUICKSTART

from judgetrain.report.card import base_model, render_card, write_model_card


def card_parts(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n")
    _, meta, body = text.split("---\n", 2)
    return yaml.safe_load(meta), body


def make_run(root, recipe_extra: dict, evals: dict[int, dict], name="judge-run"):
    run = root / name
    run.mkdir()
    recipe = {**yaml.safe_load(QUICKSTART.read_text()), **recipe_extra}
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (run / "judgetrain_run.json").write_text(json.dumps({"current": {"num_processes": 4, "revisions": {},
                                                                     "versions": {"trl": "1.16.0"}}}))
    (run / "data_audit.json").write_text(json.dumps({"datasets": {"judgebias": {"rows": 91639}}, "skipped": 3}))
    lines = [{"step": s, "epoch": s / 10, "train/loss": 0.5} for s in range(5, 45, 5)]
    lines += [{"step": s, "epoch": s / 10, **figures} for s, figures in evals.items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run


EVALS = {
    10: {"eval/rmbench/hard_acc": 0.41, "eval/rmbench/normal_acc": 0.6, "eval/rmbench/easy_acc": 0.8,
         "eval/rmbench/total_avg_acc": 0.6033, "eval/judgebias/error/accuracy": 0.7,
         "eval/judgebias/represent/accuracy": 0.75, "eval/judgebias/represent/anchor_mae": 0.9,
         "eval/judgebias/generate/parse_rate": 0.5},
    20: {"eval/rmbench/hard_acc": 0.52, "eval/rmbench/normal_acc": 0.62, "eval/rmbench/easy_acc": 0.7,
         "eval/rmbench/total_avg_acc": 0.6133, "eval/judgebias/error/accuracy": 0.8,
         "eval/judgebias/represent/accuracy": 0.9, "eval/judgebias/represent/anchor_mae": 0.4,
         "eval/judgebias/generate/parse_rate": 0.875},
    40: {"eval/rmbench/hard_acc": 0.5, "eval/rmbench/normal_acc": 0.6, "eval/rmbench/easy_acc": 0.65,
         "eval/rmbench/total_avg_acc": 0.5833, "eval/judgebias/error/accuracy": 0.85,
         "eval/judgebias/represent/accuracy": 0.8, "eval/judgebias/represent/anchor_mae": 0.6,
         "eval/judgebias/generate/parse_rate": 1.0},
}


for _figures in EVALS.values():  # RM-Bench hard accuracy logged with its interval, as training logs it
    _hard = _figures["eval/rmbench/hard_acc"]
    _figures.update({"eval/rmbench/hard_acc/ci_low": round(_hard - 0.1, 4),
                     "eval/rmbench/hard_acc/ci_high": round(_hard + 0.1, 4)})


def test_base_model_is_named_by_hub_id_or_alias_never_by_a_machine_path(tmp_path):
    assert base_model("Qwen/Qwen3-8B")[:2] == ("Qwen/Qwen3-8B", "[Qwen/Qwen3-8B](https://huggingface.co/Qwen/Qwen3-8B)")
    cached = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "0e9e39f"
    cached.mkdir(parents=True)
    assert base_model(str(cached))[0] == "meta-llama/Llama-3.1-8B-Instruct"
    folder = tmp_path / "my-base"
    folder.mkdir()
    assert base_model(str(folder)) == (None, "a local model folder (`my-base`)", "path/to/my-base")
    hub, text, cli = base_model("tiny-judge")
    assert hub is None and text.startswith("`tiny-judge` (judgetrain alias: the embedded tiny judge") and cli == "tiny-judge"


def test_a_run_on_local_folders_gets_a_card_without_machine_paths(tmp_path):
    base = tmp_path / "models" / "my-base"
    base.mkdir(parents=True)
    data = tmp_path / "data" / "judgebias.parquet"
    run = make_run(tmp_path, {"model_name_or_path": str(base), "eval_rmbench_source": str(tmp_path / "rmbench"),
                              "train_datasets": [{"dataset": "judgebias", "source": str(data), "split": "train"},
                                                 {"dataset": "ideation", "source": "tintin1027/research-ideation-arena-si-rm",
                                                  "split": "train", "mode": "pairwise"}]}, EVALS)
    path = write_model_card(run)
    text = path.read_text()
    assert path.name == "README.md" and str(tmp_path) not in text and not re.search(r"(?<![\w.:/])/(tmp|home|root)/", text)
    meta, body = card_parts(text)
    assert "base_model" not in meta and meta["datasets"] == ["tintin1027/research-ideation-arena-si-rm"]
    assert "a local model folder (`my-base`)" in body and "a local file or folder (`judgebias.parquet`)" in body
    assert "| judgebias | a local file or folder (`judgebias.parquet`) | train | - | 91639 |" in body
    assert "3 row(s) were skipped" in body
    assert "8 pairs per device x 4 process(es) x 1 accumulation step(s) = 32 pairs" in body
    assert "judgetrain judge --items items.jsonl --judge model=path/to/my-base,adapter=path/to/judge-run --output_dir" in body
    assert "**Pairwise verdicts.**" in body and "**Reading the score.**" in body


def test_model_index_holds_the_figures_of_the_evaluation_the_weights_are(tmp_path):
    # best by a lower-is-better metric_for_best_model, and load_best_model_at_end: the folder holds step 20's weights
    run = make_run(tmp_path, {"model_name_or_path": "Qwen/Qwen3-8B", "metric_for_best_model":
                              "eval/judgebias/represent/anchor_mae", "greater_is_better": False,
                              "load_best_model_at_end": True}, EVALS)
    meta, body = card_parts(render_card(run))
    assert meta["base_model"] == "Qwen/Qwen3-8B" and meta["library_name"] == "peft"
    [entry] = meta["model-index"]
    assert entry["name"] == "judge-run"
    figures = {(r["dataset"]["type"], m["name"]): m["value"] for r in entry["results"] for m in r["metrics"]}
    bare = " (implicit: log_ratio)"  # the quickstart's bare keys: its first pointwise mode, named with its reading
    assert figures == {
        ("THU-KEG/RM-Bench", f"RM-Bench hard accuracy{bare}"): 0.52,
        ("THU-KEG/RM-Bench", f"RM-Bench normal accuracy{bare}"): 0.62,
        ("THU-KEG/RM-Bench", f"RM-Bench easy accuracy{bare}"): 0.7,
        ("THU-KEG/RM-Bench", f"RM-Bench average accuracy{bare}"): 0.6133,
        ("iknow-lab/JudgeBias-DPO-RefFree", f"JudgeBias error accuracy{bare}"): 0.8,
        ("iknow-lab/JudgeBias-DPO-RefFree", f"JudgeBias represent accuracy{bare}"): 0.9,
        ("iknow-lab/JudgeBias-DPO-RefFree", "JudgeBias parse rate (written evaluations) (generate: parsed_score)"): 0.875}
    assert ("| figure | best eval (step 20, epoch 2) [95% interval] | last eval (step 40, epoch 4) [95% interval] |"
            in body)
    assert f"| RM-Bench hard accuracy{bare} | 0.5200 [0.4200, 0.6200] | 0.5000 [0.4000, 0.6000] |" in body
    assert "| JudgeBias parse rate (written evaluations) (generate: parsed_score) | 0.8750 [-, -] | 1.0000 [-, -] |" in body
    assert "where eval/judgebias/represent/anchor_mae is lowest (step 20)" in body
    assert "The weights in this folder are the best evaluation's (`load_best_model_at_end`)" in body


@pytest.mark.parametrize("evals", [{}, {10: {"eval/ideation/accuracy": 0.5}}])
def test_a_run_without_the_usual_figures_still_gets_a_card(tmp_path, evals):
    run = make_run(tmp_path, {"load_best_model_at_end": False}, evals)
    meta, body = card_parts(render_card(run))
    if evals:
        assert [m["name"] for m in meta["model-index"][0]["results"][0]["metrics"]] == ["Ideation accuracy (implicit: log_ratio)"]
        assert "| Ideation accuracy (implicit: log_ratio) | 0.5000 [-, -] | 0.5000 [-, -] |" in body
        assert "last training step, 40, came after it" in body
    else:
        assert "model-index" not in meta and "No evaluation was logged" in body
