"""The generate scoring mode: its metrics (by hand), the pairwise verdict parser, the recipe's modes, and
`judgetrain eval --eval_scoring implicit generate` end to end on the tiny judge."""

from __future__ import annotations

import json
import logging
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from judgetrain.config.recipe import EvalArguments, RecipeError, scoring_modes
from judgetrain.data.scoreparse import parse_verdict
from judgetrain.eval import metrics as M

from helpers import parser_work, unbounded_repeats


# ------------------------------------------------------------------------------------------------- metrics
def test_spearman_averages_ties_and_drops_missing_pairs():
    # x ranks [1, 2.5, 2.5, 4, 5], y ranks [2, 1, 3.5, 3.5, 5] once the None pair is dropped: 7.25 / 9.5
    assert M.spearman([1, 2, 2, 3, None, 5], [2, 1, 3, 3, 4, 9]) == pytest.approx(7.25 / 9.5)
    assert M.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert M.spearman([1, 2, 3], [3, 2, float("nan")]) == pytest.approx(-1.0)  # the NaN pair dropped
    assert M.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert math.isnan(M.spearman([1, 1, 1], [1, 2, 3]))  # one side constant: nothing to agree on
    assert math.isnan(M.spearman([1, None], [1, 2]))  # fewer than 2 pairs


def test_judgebias_generated_figures_per_category_and_type():
    rows = [
        dict(perturbation_category="represent", perturbation_type="units", anchor_score=4.0, score=4.5),
        dict(perturbation_category="represent", perturbation_type="units", anchor_score=4.0, score=3.0),
        dict(perturbation_category="represent", perturbation_type="order", anchor_score=3.0, score=None),
        dict(perturbation_category="error", perturbation_type="swap", anchor_score=4.0, score=2.5),
        dict(perturbation_category="error", perturbation_type="swap", anchor_score=4.0, score=4.0),
        dict(perturbation_category="error", perturbation_type="drop", anchor_score=3.5, score=None),
    ]
    out = M.judgebias_generated(rows)
    rep, err = out["represent"], out["error"]
    assert rep["n"] == 3 and rep["parse_rate"] == pytest.approx(2 / 3)
    assert rep["anchor_mae"] == pytest.approx((0.5 + 1.0) / 2)  # read scores only
    assert rep["within_half_rate"] == pytest.approx(1 / 3)  # 4.5 is within 0.5; 3.0 is not; unread is not
    assert err["detect_rate"] == pytest.approx(1 / 3) and err["mean_drop"] == pytest.approx((1.5 + 0.0) / 2)
    assert out["type"]["swap"] == {"n": 2, "parse_rate": 1.0, "detect_rate": 0.5, "mean_drop": 0.75}
    assert math.isnan(out["type"]["drop"]["mean_drop"]) and out["type"]["drop"]["detect_rate"] == 0.0
    assert "anchor_mae" in out["type"]["order"] and out["n_rows"] == 6


def test_ideation_generated_accuracy_consistency_and_first_position_rate():
    verdicts = [
        dict(pair_id=1, order="AB", preferred="A", choice="A"),  # right both ways: consistent
        dict(pair_id=1, order="BA", preferred="B", choice="B"),
        dict(pair_id=2, order="AB", preferred="A", choice="A"),  # always the first: inconsistent
        dict(pair_id=2, order="BA", preferred="B", choice="A"),
        dict(pair_id=3, order="AB", preferred="A", choice=None),  # unread: wrong, inconsistent
        dict(pair_id=3, order="BA", preferred="B", choice="B"),
    ]
    out = M.ideation_generated(verdicts)
    assert out["accuracy"] == pytest.approx(4 / 6)
    assert out["position_consistency"] == pytest.approx(1 / 3)
    assert out["first_position_rate"] == pytest.approx(3 / 5)  # of the 5 read verdicts, 3 pick A
    assert out["n_verdicts"] == 6 and out["n_pairs_both_orders"] == 3


def test_generation_summary_counts_reasons_tokens_stops_and_truncations():
    outputs = [dict(reason="ok", n_tokens=10, stopped=True, truncated=False),
               dict(reason="unparseable", n_tokens=32, stopped=False, truncated=True),
               dict(reason="out_of_range", n_tokens=6, stopped=True, truncated=False),
               dict(reason="unparseable", n_tokens=32, stopped=False, truncated=False)]
    out = M.generation_summary(outputs)
    assert out == {"n_generated": 4, "parse_rate": 0.25, "parse_fail": {"out_of_range": 1, "unparseable": 2},
                   "tokens_generated": 80, "mean_tokens": 20.0, "stopped_rate": 0.5, "n_truncated_prompts": 1}
    flat = M.flatten_mode_metrics("judgebias", "generate", {**out, "represent": {"anchor_mae": 0.5}})
    assert flat["eval/judgebias/generate/parse_fail/unparseable"] == 2.0
    assert flat["eval/judgebias/generate/represent/anchor_mae"] == 0.5 and flat["eval/judgebias/generate/parse_rate"] == 0.25
    # a second proxy mode keeps the bare keys' names under its own segment
    judge = M.flatten_mode_metrics("ideation", "judge", {"accuracy": 0.75, "n_rows": 4})
    assert judge == {"eval/ideation/judge/accuracy": 0.75, "eval/ideation/judge/n_rows": 4.0}


def test_rmbench_generated_scores_fill_the_matrix_and_unread_counts_wrong():
    from types import SimpleNamespace

    from judgetrain.eval.scoring import RowScore
    from judgetrain.eval.suites import build_generate_record, generate_metrics, generate_prompts

    row = {"id": "chat/1", "domain": "chat", "prompt": "Q?", "chosen": ["a", "b", "c"], "rejected": ["x", "y", "z"]}
    assert len(generate_prompts("rmbench", row)) == 6
    texts = ['{"overall_score": 5}', '{"overall_score": 4}', "no score", '{"overall_score": 3}',
             '{"overall_score": 4}', '{"overall_score": 2}']
    generated = [SimpleNamespace(text=t, n_tokens=5, prompt_tokens=20, stopped=True, truncated=False) for t in texts]
    rec = build_generate_record("rmbench", 0, row, generated, RowScore([4.0, 3.5, 3.0, 2.0, 2.5, 1.5]))
    assert [o["score"] for o in rec["outputs"]] == [5.0, 4.0, None, 3.0, 4.0, 2.0]
    assert rec["outputs"][2]["reason"] == "unparseable" and rec["outputs"][0]["expected"] == 4.0
    out = generate_metrics("rmbench", [rec])
    # chosen [5, 4, NaN] vs rejected [3, 4, 2]: 4 > 4 is a tie (wrong), NaN is wrong
    assert out["chat"]["matrix"] == [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert out["parse_rate"] == pytest.approx(5 / 6) and out["parse_fail"] == {"unparseable": 1}
    assert out["agreement"] == pytest.approx(M.spearman([5, 4, 3, 4, 2], [4.0, 3.5, 2.0, 2.5, 1.5]))


def test_a_plain_ideation_row_is_asked_for_a_verdict_in_both_orders():
    from types import SimpleNamespace

    from judgetrain.eval.scoring import RowScore
    from judgetrain.eval.suites import build_generate_record, generate_prompts

    row = {"prompt": [{"role": "user", "content": "Task T"}], "chosen": [{"role": "assistant", "content": "GOOD"}],
           "rejected": [{"role": "assistant", "content": "BAD"}], "sample_id": "s1", "pair_id": "s1"}
    ab, ba = generate_prompts("ideation", row)
    assert ab[-1]["content"].index("GOOD") < ab[-1]["content"].index("BAD") and "Task T" in ab[-1]["content"]
    assert ba[-1]["content"].index("BAD") < ba[-1]["content"].index("GOOD")
    generated = [SimpleNamespace(text=t, n_tokens=3, prompt_tokens=9, stopped=True, truncated=False)
                 for t in ("Proposal A is better.", "Proposal A is better.")]
    rec = build_generate_record("ideation", 0, row, generated, RowScore([3.0, 2.0]))
    assert [(o["order"], o["preferred"], o["choice"], o["expected"]) for o in rec["outputs"]] == [
        ("AB", "A", "A", 1.0), ("BA", "B", "A", 1.0)]


# ------------------------------------------------------------------------------------------------- verdicts
@pytest.mark.parametrize("text, choice, reason", [
    ("Proposal A is better.", "A", "ok"),
    ("After weighing both, **Proposal B** is the better one.", "B", "ok"),
    ("proposal b is better", "B", "ok"),
    ("Proposal A is better. To restate: Proposal A is better.", "A", "ok"),
    ("Proposal A is better. No wait, Proposal B is better.", None, "conflicting"),
    ("B", "B", "ok"),
    ("**A**", "A", "ok"),
    ("Proposal B.", "B", "ok"),
    ("Both have merit.", None, "no_verdict"),
    ("A proposal is better when it is specific.", None, "no_verdict"),
    ("Proposal AB is better", None, "no_verdict"),
    ("", None, "unparseable"),
    ("   \n", None, "unparseable"),
])
def test_parse_verdict_reads_the_pick_or_says_why_not(text, choice, reason):
    result = parse_verdict(text)
    assert (result.choice, result.reason) == (choice, reason)


def test_parse_verdict_refuses_non_text():
    assert parse_verdict(None).reason == "unparseable" and parse_verdict(3).choice is None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("Proposal AB is the better .*_'\"\n\t:)")), max_size=300))
def test_parse_verdict_never_raises_and_only_ever_answers_a_or_b(text):
    result = parse_verdict(text)
    assert result.choice in (None, "A", "B") and (result.choice is not None) == (result.reason == "ok")


def test_the_verdict_patterns_bound_every_quantifier():
    """Linear time by construction (judgetrain.data.scoreparse): no quantifier of the verdict patterns is unbounded,
    so a match attempt at a position costs a bounded number of characters."""
    import judgetrain.data.scoreparse as scoreparse

    assert unbounded_repeats(scoreparse._VERDICT) == [] and unbounded_repeats(scoreparse._BARE_LETTER) == []
    assert unbounded_repeats(re.compile(r"proposal[ *]*([ab])")) == ["MAX_REPEAT 0.."]  # the check sees one


@pytest.mark.parametrize("unit", ["proposal ", "Proposal  *", " " * 7, "Proposal A is  ", "*" * 9])
def test_parse_verdict_is_linear_on_long_repetitive_text(unit):
    """Counted, not timed (helpers.parser_work): four times the text is at most ~4x the work."""
    import judgetrain.data.scoreparse as scoreparse

    small, big = (parser_work(scoreparse, parse_verdict, unit * (n // len(unit))) for n in (50_000, 200_000))
    assert big <= 4.4 * small, (small, big)


# ------------------------------------------------------------------------------------------------- recipe
def test_eval_scoring_takes_a_string_a_comma_list_or_a_list_and_names_the_key_when_wrong():
    assert scoring_modes("implicit") == ["implicit"]
    assert scoring_modes("implicit,generate") == ["implicit", "generate"]
    assert scoring_modes(["judge", "implicit", "judge"]) == ["judge", "implicit"]
    with pytest.raises(RecipeError, match=r"eval_scoring: unknown mode 'generat'; did you mean 'generate'\?"):
        scoring_modes(["implicit", "generat"])
    with pytest.raises(RecipeError, match=r"eval_scoring: name at least one mode"):
        scoring_modes([])
    only_generate = EvalArguments(eval_scoring="generate")
    assert only_generate.engine_kwargs()["scoring"] == "judge"  # the generate rows' expected scores
    assert EvalArguments(eval_scoring=["judge", "implicit"]).engine_kwargs()["scoring"] == "judge"


def test_eval_generate_samples_is_a_deprecated_alias_of_generate_mode(caplog):
    with caplog.at_level(logging.WARNING, logger="judgetrain.config.recipe"):
        args = EvalArguments(eval_scoring="judge", eval_generate_samples=3)
    assert args.eval_scoring == ["judge", "generate"] and args.eval_generate_max_rows == 3
    assert "eval_generate_samples is deprecated" in caplog.text and "eval_generate_max_rows: 3" in caplog.text


def test_a_recipe_with_an_unknown_mode_is_refused_naming_the_key(tmp_path):
    from judgetrain.config.recipe import parse_recipe

    from test_eval_schedule import QUICKSTART

    path = tmp_path / "r.yaml"
    path.write_text(QUICKSTART.read_text().replace("eval_scoring: [implicit, judge]", "eval_scoring: [implicit, generat]"))
    with pytest.raises(RecipeError, match=r"eval_scoring: 'generat' is not one of \['implicit', 'loglik_sum', 'loglik_mean', 'judge', 'verdict', 'generate'\]"):
        parse_recipe([str(path)])
    path.write_text(QUICKSTART.read_text().replace("eval_scoring: [implicit, judge]", "eval_scoring: implicit,generate"))
    assert parse_recipe([str(path)]).script_args.eval_scoring == ["implicit", "generate"]


# ------------------------------------------------------------------------------------------------- end to end
def test_generation_gets_the_scoring_max_length_for_its_prompt_and_max_new_tokens_on_top(tiny_judge):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from judgetrain.eval.session import Evaluation

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_judge), AutoTokenizer.from_pretrained(tiny_judge)
    evaluation = Evaluation(EvalArguments(eval_scoring=["implicit", "generate"], eval_generate_max_new_tokens=384),
                            max_length=768)
    assert evaluation.engine(model, tokenizer).max_length == 768
    assert evaluation.generator(model, tokenizer).max_length == 768 + 384
    assert Evaluation(EvalArguments(eval_scoring=["implicit"]), max_length=768).generator(model, tokenizer) is None


def test_judgetrain_eval_implicit_and_generate_on_the_tiny_judge(tmp_path):
    from judgetrain.cli.eval import main

    from helpers import tiny_judge_and_adapter

    tiny_judge_and_adapter(tmp_path)
    out = tmp_path / "out"
    assert main(["--model", str(tmp_path / "adapter"), "--eval_scoring", "implicit", "generate", "--eval_max_rows", "2",
                 "--eval_generate_max_rows", "1", "--eval_generate_max_new_tokens", "4", "--max-length", "384",
                 "--ideation-mode", "pairwise", "--output-dir", str(out)]) == 0
    res = json.loads((out / "adapter" / "results.json").read_text())
    assert res["scoring"] == "implicit" and res["scoring_modes"] == ["implicit", "generate"]
    metrics = res["metrics"]
    assert "eval/rmbench/total_avg_acc" in metrics and "eval/judgebias/error/accuracy" in metrics  # bare: implicit
    assert not any("/implicit/" in k for k in metrics)
    expected_texts = {"rmbench": 6, "judgebias": 1, "ideation": 2}  # ideation: one pair, both orders
    for suite, n in expected_texts.items():
        records = [json.loads(line) for line in (out / "adapter" / f"{suite}.generate.jsonl").read_text().splitlines()]
        outputs = [o for r in records for o in r["outputs"]]
        assert len(outputs) == n == metrics[f"eval/{suite}/generate/n_generated"]
        assert all(isinstance(o["text"], str) and 0 < o["n_tokens"] <= 4 for o in outputs)
        assert metrics[f"eval/{suite}/generate/tokens_generated"] == sum(o["n_tokens"] for o in outputs)
        fails = {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith(f"eval/{suite}/generate/parse_fail/")}
        assert sum(fails.values()) == sum(o["reason"] != "ok" for o in outputs)
        assert metrics[f"eval/{suite}/generate/parse_rate"] == pytest.approx(sum(o["reason"] == "ok" for o in outputs) / n)
        assert all(o["expected"] is not None for o in outputs)  # judge mode scored the same responses
        assert res["mode_results"][suite]["generate"]["n_rows"] == len(records)
    assert res["generator"]["prompts"] == sum(expected_texts.values())
    assert (out / "adapter" / "rmbench.jsonl").is_file()


# ------------------------------------------------------------------------------------------------- report
def test_report_sets_the_generated_figures_beside_the_proxies(tmp_path):
    import yaml
    from PIL import Image

    from judgetrain.report.build import build_report, summary_rows

    from test_report import make_run

    run, events = make_run(tmp_path, "gen")
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    (run / "recipe.yaml").write_text(yaml.safe_dump({**recipe, "eval_scoring": ["implicit", "judge", "generate"]}))
    logged = {}
    with (run / "metrics.jsonl").open("a") as f:
        for step, parse in ((6, 0.5), (12, 0.75)):  # what the callback logs beside the bare keys at each eval
            generated = {"represent": {"n": 4, "parse_rate": parse, "anchor_mae": 0.8, "within_half_rate": 0.5},
                         "error": {"n": 4, "parse_rate": parse, "detect_rate": 0.25, "mean_drop": 0.3},
                         **M.generation_summary([{"reason": "ok" if i < 8 * parse else "unparseable", "n_tokens": 20,
                                                  "stopped": True} for i in range(8)]),
                         "agreement": step / 20}
            judge = {"represent": {"accuracy": 0.6, "margin": 0.1, "anchor_mae": 0.9}, "type": {}, "n_rows": 8}
            ideation = {"accuracy": 0.5, "position_consistency": 0.5, "first_position_rate": 0.9, "parse_rate": 1.0}
            event = {"step": step, "epoch": step / 6, **M.flatten_mode_metrics("judgebias", "generate", generated),
                     **M.flatten_mode_metrics("judgebias", "judge", judge),
                     **M.flatten_mode_metrics("ideation", "generate", ideation)}
            logged[step] = event
            f.write(json.dumps(event) + "\n")
            (run / "eval" / str(step) / "judgebias.generate.jsonl").write_text(
                json.dumps({"row_index": 0, "perturbation_type": "llm_to_name", "outputs": []}) + "\n")
    report = build_report([run], tmp_path / "out")
    out = tmp_path / "out"
    with Image.open(out / "generate.png") as im:
        assert im.size == (800, 300)  # parse rate, agreement
    with Image.open(out / "judgebias_categories.png") as im:
        assert im.size == (1600, 300)  # still the 4 bare figures: the other modes' keys are not drawn there
    with Image.open(out / "rmbench_curves.png") as im:
        assert im.size == (1600, 300)
    summary = json.loads((out / "summary.json").read_text())
    tables = {t["suite"]: t for t in summary["generated"]["gen"]}
    assert set(tables) == {"judgebias", "ideation"} and tables["judgebias"]["step"] == 12
    jb = tables["judgebias"]
    assert jb["modes"] == ["implicit (bare keys)", "judge", "generate"]
    rows = {r["metric"]: r["values"] for r in jb["rows"]}
    bare = [e for e in events if e["step"] == 12 and "eval/judgebias/represent/accuracy" in e][0]
    assert rows["represent/accuracy"] == [bare["eval/judgebias/represent/accuracy"], 0.6, None]
    assert rows["represent/anchor_mae"] == [None, 0.9, 0.8]
    assert rows["parse_rate"] == [None, None, 0.75] and rows["parse_fail/unparseable"] == [None, None, 2.0]
    assert rows["agreement"] == [None, None, 0.6]
    assert tables["ideation"]["modes"] == ["implicit (bare keys)", "generate"]
    html = (out / "report.html").read_text()
    table = re.search(r'<table class="generated" id="generated-gen-judgebias">(.*?)</table>', html, re.S).group(1)
    assert re.search(r'data-metric="represent/anchor_mae"><td class="metric">represent/anchor_mae</td><td>-</td>'
                     r'<td>0.9000</td><td>0.8000</td>', table)
    assert "Proxies beside what the judge writes: gen" in (out / "report.md").read_text()
    by_key = {r["metric"]: r for r in summary_rows(report["runs"][0])}
    assert by_key["eval/judgebias/generate/parse_rate"]["best"] == 0.75
    assert by_key["eval/judgebias/generate/parse_rate"]["best_step"] == 12
    assert by_key["eval/ideation/generate/first_position_rate"]["better"] == "closer to 0.5"
    assert not any("/parse_fail/" in k or k.endswith("/n") for k in by_key)  # counts are not figures
