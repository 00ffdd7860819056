"""`judgetrain compare A B` on two evaluations the real runner wrote (`judgetrain eval` of a tiny base judge and of a
LoRA adapter on it, on real RM-Bench rows and the bundled JudgeBias and Ideation samples), without scoring again."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from judgetrain.cli import main as cli_main
from judgetrain.cli.compare import main as compare_main
from judgetrain.eval.compare import compare_evaluations, evaluation_folder
from judgetrain.metrics import judgebench_results, mcnemar_p

from helpers import read_jsonl

SMALL = dict(vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def evaluations(tmp_path_factory, rmbench_real_dir):
    """(A, B): the base judge's and the adapter's evaluation folders, judge mode, 8 rows of each suite."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from judgetrain.cli.eval import main as eval_main
    from judgetrain.models.tiny import build_tiny_judge

    root = tmp_path_factory.mktemp("compare")
    base = build_tiny_judge(root / "base", seed=0, config=SMALL)
    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(root / "adapter")
    args = ["--eval_suites", "rmbench", "judgebias", "ideation", "--eval_rmbench_source", str(rmbench_real_dir),
            "--eval_max_rows", "8", "--max-length", "384", "--eval_batch_tokens", "2048", "--eval_scoring", "judge",
            "--ideation-mode", "pairwise"]
    for name, model_dir in (("a", base), ("b", root / "adapter")):
        assert eval_main(["--model", str(model_dir), *args, "--output-dir", str(root / name)]) == 0
    return evaluation_folder(root / "a"), evaluation_folder(root / "b")


def _results(folder):
    return json.loads((folder / "results.json").read_text())["metrics"]


def test_compare_prints_and_writes_each_headline_figure_from_the_row_files(evaluations, tmp_path, capsys):
    a, b = evaluations
    out = tmp_path / "compare.json"
    assert compare_main([str(a.parent), str(b.parent), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "rmbench (judge: expected_score)" in printed and "total_avg_acc" in printed and "B - A" in printed
    doc = json.loads(out.read_text())
    assert doc["a"] == str(a) and doc["b"] == str(b) and doc["skipped"] == []
    ra, rb = _results(a), _results(b)
    # A and B as the evaluations logged them, B - A, from the per-row files alone
    for suite, metric in (("rmbench", "total_avg_acc"), ("rmbench", "hard_acc"), ("judgebias", "error/accuracy"),
                          ("ideation", "accuracy"), ("ideation", "position_consistency")):
        fig = doc["suites"][suite]["judge"][metric]
        assert fig["a"] == pytest.approx(ra[f"eval/{suite}/{metric}"])
        assert fig["b"] == pytest.approx(rb[f"eval/{suite}/{metric}"])
        assert fig["delta"] == pytest.approx(fig["b"] - fig["a"])
        assert fig["delta_ci_low"] <= fig["delta"] <= fig["delta_ci_high"]
        assert doc["metrics"][f"eval/{suite}/delta/{metric}"] == pytest.approx(fig["delta"])
        assert f"eval/{suite}/delta/{metric}/p_value" in doc["metrics"]
    assert doc["suites"]["rmbench"]["judge"]["style_spread"]["n"] == 8
    # each judge beside the best rule that needs no judge on the same rows, from each side's results.json
    for side, folder in (("a", a), ("b", b)):
        saved = json.loads((folder / "results.json").read_text())["rules"]["rmbench"]["learned"]["judge"]
        assert doc["rules"][side]["rmbench"]["judge"] == saved
        hard = saved["hard_acc"]
        assert hard["rule"] in ("shorter", "longer")
        assert hard["rule_value"] == max(_results(folder)[f"eval/rmbench/rule/{r}/hard_acc"] for r in ("shorter",
                                                                                                         "longer"))
    assert "best rule (" in printed and "B beside the rules" in printed
    # the exact sign test over the ideation pairs (both orders one unit) whose count of right orders changed
    gained = lost = 0
    recs = [read_jsonl(f / "ideation.jsonl") for f in (a, b)]
    by_pair: dict = {}
    for ra_, rb_ in zip(*recs):
        d = int(rb_["score_chosen"] > rb_["score_rejected"]) - int(ra_["score_chosen"] > ra_["score_rejected"])
        by_pair[ra_["pair_id"]] = by_pair.get(ra_["pair_id"], 0) + d
    gained, lost = sum(v > 0 for v in by_pair.values()), sum(v < 0 for v in by_pair.values())
    units = [1] * gained + [0] * lost
    fig = doc["suites"]["ideation"]["judge"]["accuracy"]
    assert fig["p_value"] == mcnemar_p(units, [1 - u for u in units]) and fig["p_method"] == "sign_test"
    assert fig["n_units"] == len(by_pair) < fig["n"]
    total = doc["suites"]["rmbench"]["judge"]["total_avg_acc"]  # shares of 9 comparisons per prompt
    assert total["p_method"] == "sign_flip" and 1 / 1001 <= total["p_value"] <= 1
    # --regression_margin: "worse" only for a loss at least that large; "better" as before
    from judgetrain.cli.compare import _rows

    assert compare_main([str(a.parent), str(b.parent), "--out", str(out), "--regression_margin", "10"]) == 0
    plain, wide = _rows(doc, True), _rows(json.loads(out.read_text()), True)
    assert len(plain) == len(wide) > 10
    assert [r[-1] for r in wide] == [r[-1] if r[-1] != "worse" else "" for r in plain]
    # 8 prompts and 8 JudgeBias rows: a category with 2 units cannot reach p < 0.05 (smallest p 0.5): said so
    assert all(r[-1] in ("", "better", "worse") or r[-1].endswith(": too few to tell") for r in plain)


def test_an_evaluation_against_itself_differs_by_nothing(evaluations):
    a, _ = evaluations
    doc = compare_evaluations(a, a)
    for modes in doc["suites"].values():
        for fig in modes["judge"].values():
            assert (fig["delta"], fig["delta_ci_low"], fig["delta_ci_high"]) == (0, 0, 0)
            assert fig["p_value"] == 1.0


def test_a_run_folder_means_its_latest_evaluation_and_pairwise_verdicts_are_compared(evaluations, tmp_path):
    """Two steps of a run; the later one also holds JudgeBench records with verdicts (as shown), the earlier one the
    same rows judged otherwise: compare reads JudgeBench's rule (judgebench_results) on both."""
    a, b = evaluations
    run = tmp_path / "run"
    shutil.copytree(a, run / "eval" / "5")
    shutil.copytree(b, run / "eval" / "40")
    rows = [{"id": "p1", "label": "A>B", "source": "mmlu-pro-law"}, {"id": "p2", "label": "B>A", "source":
            "livebench-math"}, {"id": "p3", "label": "A>B", "source": "livecodebench"}]
    # read back to the rows' order: [A>B, B>A] 0, [A>B, B>A] 0, [None, A>B] +1: 1 of 3 right, 3 of 3 inconsistent
    before = [["A>B", "A>B"], ["A>B", "A>B"], [None, "B>A"]]
    # [A>B, A>B] +2, [B>A, B>A] +2, [A=B, A>B] +1: 3 of 3 right, the last one inconsistent
    after = [["A>B", "B>A"], ["B>A", "A>B"], ["A=B", "B>A"]]
    for step, verdicts in (("5", before), ("40", after)):
        with (run / "eval" / step / "judgebench.jsonl").open("w") as f:
            for row, v in zip(rows, verdicts):
                f.write(json.dumps({**row, "verdicts": v}) + "\n")
    (run / "eval" / "40" / "pairwise.jsonl").write_text(json.dumps({"id": "x", "label": "A>B"}) + "\n")
    (run / "eval" / "5" / "pairwise.jsonl").write_text(json.dumps({"id": "x", "label": "A>B"}) + "\n")
    doc = compare_evaluations(run / "eval" / "5", run, n_resamples=1000)
    assert doc["b"] == str(run / "eval" / "40")
    fig = doc["suites"]["judgebench"]["judge"]
    want_a = judgebench_results([{**r, "verdicts": v} for r, v in zip(rows, before)])
    want_b = judgebench_results([{**r, "verdicts": v} for r, v in zip(rows, after)])
    assert (fig["accuracy"]["a"], fig["accuracy"]["b"]) == (want_a["accuracy"], want_b["accuracy"]) == (1 / 3, 1.0)
    assert fig["inconsistent_rate"]["a"] == want_a["inconsistent_rate"] == 1.0
    assert fig["inconsistent_rate"]["b"] == want_b["inconsistent_rate"] == pytest.approx(1 / 3)
    # 2 rows gained, none lost: 2 x (1/2)^2
    assert fig["accuracy"]["p_value"] == mcnemar_p([1, 1, 1], [0, 0, 1]) == 0.5
    assert "pairwise (judge): its records carry no verdicts" in doc["skipped"]


def test_a_path_that_is_no_evaluation_is_named(tmp_path, evaluations, capsys):
    assert cli_main(["compare", str(tmp_path), str(evaluations[1]), "--out", str(tmp_path / "c.json")]) == 2
    assert f"judgetrain compare: {tmp_path} is not a saved evaluation: no results.json" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_an_unknown_suite_is_named_with_the_nearest_one_and_what_each_side_holds(tmp_path, evaluations, capsys):
    """--suites judgebnech (a typo): not "no per-row files", though the files exist, but the suite, the nearest known
    one and the suites each side holds; a known suite neither evaluation holds is named with what they hold."""
    a, b = evaluations
    out = tmp_path / "c.json"
    assert cli_main(["compare", str(a), str(b), "--suites", "judgebnech", "--out", str(out)]) == 2
    assert ("--suites: unknown suite 'judgebnech'; did you mean 'judgebench'? (known: rmbench, judgebias, ideation, "
            "judgebench, pairwise, rewrites, evalbiasbench; A holds ideation, judgebias, rmbench; B holds ideation, judgebias, "
            "rmbench)") in capsys.readouterr().err
    assert cli_main(["compare", str(a), str(b), "--suites", "judgebench", "--out", str(out)]) == 2
    assert "--suites: judgebench is not in A: A holds ideation, judgebias, rmbench; B holds" in capsys.readouterr().err
    assert not out.exists()
