"""The pairwise suites (evalbiasbench, judgebench, pairwise) on the real shared rows with the tiny judge in every
scoring mode, their intervals and paired deltas (`judgetrain.eval.suites`, `judgetrain.eval.runner`,
`judgetrain.eval.evidence`); a training run made to regress: the guard's warning and `stop`; `judgetrain eval
--baseline` on its checkpoint."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from judgetrain.config.recipe import RecipeError
from judgetrain.data.pairwise import both_orders
from judgetrain.eval.evidence import headline_table
from judgetrain.eval.generate import Generator
from judgetrain.eval.runner import current_items, evaluate, evaluate_and_write
from judgetrain.eval.scoring import Request, ScoringEngine, score_sharded
from judgetrain.eval.suites import (PAIRWISE_SUITES, VERDICTS, SuiteSpec, build_requests, check_verdict_tokens,
                                   suite_specs)
from judgetrain.metrics import evalbiasbench_results, judgebench_results
from judgetrain.run.state import EXIT_REGRESSED

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def judge(tiny_judge):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32), AutoTokenizer.from_pretrained(tiny_judge)


def _specs(shared_dir, tmp_path=None):
    data = shared_dir / "data"
    specs = [SuiteSpec("evalbiasbench", source=str(data / "evalbiasbench"), max_rows=12, generate_max_rows=3),
             SuiteSpec("judgebench", source=str(data / "judgebench"), split="claude", max_rows=8, generate_max_rows=2)]
    if tmp_path is not None:  # a team's own pairs: JudgeBench's claude rows under other column names
        rows = [json.loads(line) for line in next((data / "judgebench").glob("*claude*")).read_text().splitlines()]
        own = tmp_path / "own.jsonl"
        own.write_text("".join(json.dumps({"q": r["question"], "first": r["response_A"], "second": r["response_B"],
                                           "winner": r["label"], "topic": r["source"].split("-")[0]}) + "\n"
                               for r in rows[:40]))
        specs.append(SuiteSpec("pairwise", source=str(own), max_rows=6, generate_max_rows=2,
                               columns={"prompt": "q", "response_a": "first", "response_b": "second", "label": "winner",
                                        "category": "topic"}))
    return specs


def test_every_mode_on_the_real_rows_both_orders_reach_the_model_and_every_figure_has_its_interval(judge, shared_dir,
                                                                                                  tmp_path):
    """implicit / judge: one score per response, the verdict from the two (higher wins, in both orders); verdict: the
    prompt as stored and swapped, log p([[A>B]]) and log p([[B>A]]) of each, the same numbers as the engine gives the
    swapped prompt scored on its own; generate: the verdict written in both orders, parsed (the tiny judge writes none: counted)."""
    model, tok = judge
    check_verdict_tokens(tok)
    specs = _specs(shared_dir, tmp_path)
    engine = ScoringEngine(model, tok, scoring="implicit", max_length=1024)
    generator = Generator(model, tok, max_new_tokens=6, max_length=1100)
    modes = ["implicit", "judge", "verdict", "generate"]
    results, summary = evaluate_and_write(engine, specs, tmp_path / "ev", modes=modes, generator=generator)
    flat = summary["metrics"]
    ebb, jb, own = results["evalbiasbench"], results["judgebench"], results["pairwise"]

    # implicit: the verdict from the two scores, a tie wrong, in both presentations (about what was shown: the same
    # response by construction); EvalBiasBench's picks mirrored over the two presentations
    for rec in jb.records:
        a, b = rec["scores"]
        verdict = "A>B" if a > b else "B>A" if b > a else "A=B"
        assert rec["verdicts"] == [verdict, {"A>B": "B>A", "B>A": "A>B"}.get(verdict, verdict)]
    assert flat["eval/judgebench/accuracy"] == judgebench_results(jb.records)["accuracy"]
    assert flat["eval/judgebench/inconsistent_rate"] == 0.0 and flat["eval/judgebench/first_position_rate"] == 0.5
    for rec in ebb.records:
        a, b = rec["scores"]
        assert rec["predictions"] == ([1, 2] if a > b else [2, 1]) and rec["label"] == 1
    assert flat["eval/evalbiasbench/single_acc"] == evalbiasbench_results(ebb.records)["single_acc"]
    assert flat["eval/evalbiasbench/agreement"] == 1.0  # a judge that scores each response alone cannot flip

    # verdict: both orders scored, the second with the responses swapped in the prompt
    row = dict(specs[1].rows[0])
    (ab_order, ab), (ba_order, ba) = both_orders(row)
    requests = build_requests(specs[1], row, "verdict")
    assert [r.prompt for r in requests] == [ab, ba] and list(requests[0].responses) == list(VERDICTS)

    def shown_first(messages):
        return messages[-1]["content"].split("[The Start of Assistant A's Answer]\n")[1].split(
            "\n[The End of Assistant A's Answer]")[0]

    assert (shown_first(ab), shown_first(ba)) == (row["response_a"], row["response_b"]) != (row["response_b"],) * 2
    rec = jb.modes["verdict"].records[0]
    alone = score_sharded(engine, [Request("loglik_sum", prompt=ba, responses=list(VERDICTS))], None)[0][0].scores
    assert rec["scores"][2:] == pytest.approx(alone, abs=1e-4) and rec["scores"][:2] != pytest.approx(alone, abs=1e-6)
    assert rec["verdicts"] == [("A>B" if s[0] > s[1] else "B>A") for s in (rec["scores"][:2], rec["scores"][2:])]
    assert flat["eval/judgebench/verdict/inconsistent_rate"] == judgebench_results(jb.modes["verdict"].records)[
        "inconsistent_rate"]
    assert flat["eval/judgebench/verdict/n_both_orders"] == 8

    # generate: two texts per row, verdicts parsed as written (none here: every one counted as unread)
    gen = ebb.modes["generate"]
    assert [len(r["outputs"]) for r in gen.records] == [2, 2, 2] and flat["eval/evalbiasbench/generate/n_generated"] == 6
    unread = sum(o["verdict"] is None for r in gen.records for o in r["outputs"])
    assert flat["eval/evalbiasbench/generate/parse_rate"] == pytest.approx(1 - unread / 6)

    # the keys DESIGN.md names, bias names slugged; a team's own pairs keep their category column
    assert {"eval/evalbiasbench/length_bias/single_acc", "eval/evalbiasbench/familiar_knowledge_preference_bias/pair_acc",
            "eval/evalbiasbench/empty_reference/agreement", "eval/judgebench/knowledge/accuracy",
            "eval/judgebench/verdict/inconsistent_rate", "eval/pairwise/accuracy", "eval/pairwise/verdict/accuracy"} <= set(flat)
    # implicit mode: the verdict derived from two scores, recorded for both presentations (line 77's figures); no
    # figure is logged as NaN
    assert not [k for k, v in flat.items() if isinstance(v, float) and math.isnan(v)]
    assert not [k for k in flat if " " in k]
    assert {k.split("/")[2] for k in flat if k.startswith("eval/pairwise/") and k.endswith("/accuracy")} & {
        "mmlu", "livebench", "livecodebench"}

    # every figure with an interval, which brackets it
    with_ci = [k[: -len("/ci_low")] for k in flat if k.endswith("/ci_low")]
    assert {"eval/evalbiasbench/pair_acc", "eval/judgebench/accuracy", "eval/judgebench/verdict/accuracy",
            "eval/evalbiasbench/generate/single_acc", "eval/pairwise/judge/accuracy"} <= set(with_ci)
    for key in with_ci:
        low, high, value = flat[key + "/ci_low"], flat[key + "/ci_high"], flat[key]
        assert math.isnan(value) or low - 1e-12 <= value <= high + 1e-12, (key, low, value, high)
    saved = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert saved["intervals"]["judgebench"]["verdict"]["accuracy"]["n"] == 8


def test_deltas_against_a_baseline_are_paired_and_name_what_got_worse(judge, shared_dir, tmp_path):
    """The same judge against itself: every delta 0 with p 1, nothing worse; a baseline whose verdicts were all right
    (the items of a perfect judge) makes the accuracy a significant loss, named in ``regressions``: 40 pairs, at least
    20 of them lost (the tiny judge is right on at most half), none gained: the sign test's p at most 2 / 2^20."""
    import dataclasses

    model, tok = judge
    specs = [dataclasses.replace(s, max_rows=40) for s in _specs(shared_dir)[1:]]
    engine = ScoringEngine(model, tok, scoring="judge", max_length=1024)
    results, _ = evaluate_and_write(engine, specs, tmp_path / "a", modes=["verdict"])
    base = current_items(results, ["verdict"])
    _, same = evaluate_and_write(engine, specs, tmp_path / "b", modes=["verdict"], baseline=base)
    assert same["metrics"]["eval/judgebench/verdict/delta/accuracy"] == 0.0
    assert same["metrics"]["eval/judgebench/verdict/delta/accuracy/p_value"] == 1.0 and same["regressions"] == []
    assert "no category got worse" in headline_table(same)

    perfect = {key: items for key, items in base.items()}
    items = perfect[("judgebench", "verdict")]
    items.values = {k: v if not k.endswith("accuracy") else (v * 0 + 1) for k, v in items.values.items()}
    items.values = {k: v if not k.endswith("inconsistent_rate") else v * 0 for k, v in items.values.items()}
    assert float(results["judgebench"].modes["verdict"].metrics["accuracy"]) <= 0.5  # the tiny judge: chance or worse
    _, worse = evaluate_and_write(engine, specs, tmp_path / "c", modes=["verdict"], baseline=perfect)
    d = worse["metrics"]
    assert d["eval/judgebench/verdict/delta/accuracy"] < 0 and d["eval/judgebench/verdict/delta/accuracy/delta_ci_high"] < 0
    lost = round(40 * (1 - float(results["judgebench"].modes["verdict"].metrics["accuracy"])))
    assert d["eval/judgebench/verdict/delta/accuracy/n_units"] == 40 and lost >= 20
    assert d["eval/judgebench/verdict/delta/accuracy/p_value"] == pytest.approx(2 / 2**lost)  # none gained
    assert "judgebench/verdict/accuracy" in worse["regressions"]
    # with a margin the loss must be at least that large at 95%: the whole interval below -margin
    high = d["eval/judgebench/verdict/delta/accuracy/delta_ci_high"]
    _, tolerant = evaluate_and_write(engine, specs, tmp_path / "d", modes=["verdict"], baseline=perfect,
                                     regression_margin=-high + 0.01)
    assert "judgebench/verdict/accuracy" not in tolerant["regressions"]
    _, strict = evaluate_and_write(engine, specs, tmp_path / "e", modes=["verdict"], baseline=perfect,
                                   regression_margin=-high - 0.01)
    assert "judgebench/verdict/accuracy" in strict["regressions"]


def test_a_regression_margin_asks_for_a_loss_at_least_that_large():
    from judgetrain.eval.compare import changes

    def changed(v, metric, margin=0.0):  # one figure judged alone: p 0.001 over 40 units
        return changes({metric: {**v, "p_value": 0.001, "n_units": 40}}, margin)[metric]

    def v(low, high):
        return {"delta_ci_low": low, "delta_ci_high": high}

    assert changed(v(-0.30, -0.01), "accuracy") == "worse"  # excludes 0
    assert changed(v(-0.30, -0.01), "accuracy", 0.02) == ""  # but not a loss of 0.02
    assert changed(v(-0.30, -0.03), "accuracy", 0.02) == "worse"
    assert changed(v(0.001, 0.006), "style_spread") == "worse"  # lower is better: a higher spread is a loss
    assert changed(v(0.001, 0.006), "style_spread", 0.02) == ""
    assert changed(v(0.001, 0.006), "accuracy", 0.02) == "better"  # a gain needs no margin
    assert changed(v(-0.01, 0.02), "accuracy") == "" and changed(v(float("nan"), 1.0), "accuracy") == ""
    from judgetrain.config.recipe import EvalArguments

    with pytest.raises(RecipeError, match="eval_regression_margin"):
        EvalArguments(eval_regression_margin=-0.1)


def test_a_pairwise_suite_without_its_source_and_a_bad_prompt_template_are_refused():
    from judgetrain.config.recipe import EvalArguments

    with pytest.raises(RecipeError, match="eval_evalbiasbench_source"):
        EvalArguments(eval_suites=["evalbiasbench"])
    args = EvalArguments(eval_suites=["pairwise"], eval_pairwise_source="x.jsonl", eval_pairwise_prompt="{question}")
    with pytest.raises(RecipeError, match="response_a"):
        suite_specs(args)
    assert EvalArguments().eval_suites == ["rmbench", "judgebias", "ideation"]
    from judgetrain.cli.eval import parse_args
    from judgetrain.config.recipe import parse_recipe

    flags = ["--eval_suites", "pairwise", "--eval_pairwise_source", "x.jsonl", "--eval_pairwise_columns",
             "{prompt: question, label: winner}"]
    assert parse_recipe([str(REPO / "recipes" / "quickstart.yaml"), *flags]).script_args.eval_pairwise_columns == {
        "prompt": "question", "label": "winner"}
    assert parse_args(["--model", "tiny-judge", *flags])[0].eval_pairwise_columns == {"prompt": "question",
                                                                                       "label": "winner"}


def test_verdict_mode_names_the_suites_it_does_not_score(caplog):
    from judgetrain.eval.suites import verdict_suites

    names = ["rmbench", "evalbiasbench", "judgebias", "judgebench"]
    with caplog.at_level(logging.INFO, logger="judgetrain.eval.suites"):
        assert verdict_suites(names, ["judge"]) == [] and caplog.messages == []
        assert verdict_suites(names, ["judge", "verdict"]) == ["evalbiasbench", "judgebench"]
    assert caplog.messages == ["verdict mode: rmbench, judgebias not scored in it (not a pairwise suite: each response "
                               "is scored alone in the other modes asked for); pairwise suites: "
                               + ", ".join(PAIRWISE_SUITES)]


def test_the_bench_times_intervals_and_deltas_against_the_eval(judge):
    """`judgetrain bench --only evidence` at its smallest size: both suites timed, the shares of the eval computed from
    what was measured (timings under load: only their presence and consistency are checked)."""
    import argparse

    from judgetrain.bench.evidence import bench_evidence

    model, tok = judge
    cfg = argparse.Namespace(evidence_rows=40, rmbench_source="bundled", eval_rows=2, eval_batch_tokens=8192,
                             eval_max_length=1024, repeats=1)
    out = bench_evidence(cfg, model, tok)
    assert out["rows"] == 40 and out["eval_seconds"] == pytest.approx(out["eval_seconds_per_row"] * 40)
    for suite in ("rmbench", "judgebench"):
        fig = out[suite]
        assert fig["seconds"] == pytest.approx(fig["intervals_seconds"] + fig["deltas_seconds"]) and fig["seconds"] > 0
        assert fig["share_of_eval"] == pytest.approx(fig["seconds"] / out["eval_seconds"])
    assert out["share_of_eval"] == pytest.approx(out["rmbench"]["share_of_eval"] + out["judgebench"]["share_of_eval"])
    from judgetrain.bench.report import summarize

    summary = summarize({"evidence": out})  # the bench's summary line carries the figure against its 2% target
    assert summary["evidence_share_of_eval"] == out["share_of_eval"]
    assert ("evidence_share_of_eval" in summary["targets_missed"]) == (out["share_of_eval"] > 0.02)


# ------------------------------------------------------------------------------------------ a run made to regress
def _made_to_regress(folder: Path) -> tuple[Path, Path]:
    """(the eval folder, the train folder) of a run that loses by construction, on any CPU: JudgeBias rows (the
    bundled validation prompts) whose training pairs all say the same thing, chosen ``"overall_score": 5`` against
    rejected ``1`` after judge mode's prefix: a shift of the score that needs no reading of the prompt (every pair
    pushes the same way, none cancels another). The eval rows are 24 represent rows anchored at 1.0: the judge's
    expected score moves up on every one of them, so ``represent/anchor_mae`` (lower is better) gets worse on all 24
    units at once, whatever the size of each step. Two error rows make a category of 2 units: too few to tell."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from judgetrain.eval.scoring import DEFAULT_JUDGE_PREFIX

    bundled = pq.read_table(REPO / "judgetrain" / "data" / "samples" / "judgebias" / "validation.parquet").to_pylist()
    represent = [r for r in bundled if r["perturbation_category"] == "represent"][:24]
    error = [r for r in bundled if r["perturbation_category"] == "error"][:2]

    def answer(score: int) -> str:
        return json.dumps([{"role": "assistant", "content": f"{DEFAULT_JUDGE_PREFIX}{score}\n}}\n```"}])

    evals, train = [], []
    for i, row in enumerate(represent + error):
        # the recorded scores tie (the accuracy cannot move); the anchor at 1.0 is what a score of 5 is far from
        evals.append({**row, "sample_id": 5000 + i, "score_chosen": 3.0, "score_rejected": 3.0, "score_delta": 0.0,
                      "anchor_score": 1.0})
        train.append({**row, "sample_id": 5000 + i, "chosen": answer(5), "rejected": answer(1), "score_chosen": 5.0,
                      "score_rejected": 1.0, "score_delta": 4.0})
    for split, rows in (("validation", evals), ("train", train)):
        (folder / split).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), folder / split / f"{split}.parquet")
    return folder / "validation", folder / "train"


@pytest.mark.slow
def test_a_run_against_its_start_logs_paired_deltas_and_eval_baseline_gives_the_same(tmp_path):
    """A real run (LoRA) taught to push every score up: eval_on_start is the baseline, the evals after it log each
    figure's paired delta with its interval, p-value and units (none at step 0), and with eval_regression_action:
    stop the run ends at the first eval where the guard can show the loss (exit 5), with its checkpoint: the anchor
    error of all 24 represent units grew at once (the sign-flip test's p at its floor, 1 / 1001, under Holm's
    0.05 / 2). The 2-unit error category is too few to tell, never named. `judgetrain eval --baseline tiny-judge` on
    that checkpoint gives the delta the run logged (the adapter at step 0 is the base judge)."""
    evals_dir, data = _made_to_regress(tmp_path / "made")
    recipe = (REPO / "recipes" / "quickstart.yaml").read_text()
    recipe = recipe.replace("  - {dataset: judgebias, source: bundled, split: train}\n"
                            "  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n",
                            f"  - {{dataset: judgebias, source: {data}, split: train}}\n")
    recipe = recipe.replace("eval_suites: [rmbench, judgebias, ideation]", "eval_suites: [judgebias]")
    recipe = recipe.replace("eval_scoring: [implicit, judge]", "eval_scoring: [judge]")
    recipe = recipe.replace("learning_rate: 2.0e-3", "learning_rate: 1.0e-2").replace("warmup_steps: 5", "warmup_steps: 0")
    recipe = recipe.replace("per_device_train_batch_size: 8", "per_device_train_batch_size: 4")
    recipe = recipe.replace("lr_scheduler_type: cosine", "lr_scheduler_type: constant").replace("save_steps: 25",
                                                                                              "save_steps: 8")
    recipe += (f"eval_judgebias_source: {evals_dir}\neval_on_start: true\neval_strategy: steps\neval_steps: 8\n"
               "max_steps: 24\neval_regression_action: stop\n")
    (tmp_path / "r.yaml").write_text(recipe)
    run, log = tmp_path / "run", tmp_path / "train.log"
    with log.open("wb") as f:
        rc = subprocess.run([sys.executable, "-m", "judgetrain.train", str(tmp_path / "r.yaml"), "--output_dir",
                             str(run)], cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=1500).returncode
    text = log.read_text(errors="replace")
    assert rc == EXIT_REGRESSED, text[-5000:]  # the guard stopped the run at the eval that showed the loss
    status = [json.loads(line) for line in (run / "judgetrain_status.jsonl").read_text().splitlines()][-1]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    key = "eval/judgebias/represent/anchor_mae"
    evals = {r["step"]: r for r in logged if key in r}
    step = max(evals)
    assert 0 in evals and step in (8, 16, 24) and not any("/delta/" in k for k in evals[0])  # the baseline has none
    warnings = [line for line in text.splitlines() if "worse than the baseline (the eval before the first step" in line]
    assert status["status"] == "regressed" and status["step"] == step and status["regressions"] == 1, status
    assert len(warnings) == 1 and f"eval at step {step}: 1 category worse" in warnings[0]
    assert warnings[0].endswith("judgebias/represent/anchor_mae; stopping (eval_regression_action: stop)")
    assert (run / f"checkpoint-{step}" / "judgetrain_complete.json").is_file()
    d, at = "eval/judgebias/delta/represent/anchor_mae", evals[step]
    assert at[f"{d}/n_units"] == 24 and at[f"{d}/p_value"] == pytest.approx(1 / 1001) and at[f"{d}/delta_ci_low"] > 0
    assert at[d] == pytest.approx(at[key] - evals[0][key])
    for fig in ("error/accuracy", "error/detect_rate"):  # 2 units: the smallest p is 0.5, never worse
        assert at[f"eval/judgebias/delta/{fig}/n_units"] == 2
    assert at["eval/judgebias/delta/represent/accuracy/p_value"] == 1.0  # tied recorded scores: cannot move

    out = tmp_path / "eval"
    proc = subprocess.run([sys.executable, "-m", "judgetrain.cli.eval", "--model", str(run / f"checkpoint-{step}"),
                           "--baseline", "tiny-judge", "--eval_suites", "judgebias", "--eval_judgebias_source",
                           str(evals_dir), "--eval_scoring", "judge", "--output-dir", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / f"checkpoint-{step}" / "results.json").read_text())
    for fig in ("represent/anchor_mae", "represent/accuracy", "error/accuracy"):
        k = f"eval/judgebias/delta/{fig}"
        assert doc["metrics"][k] == pytest.approx(evals[step][k]), fig
    assert (out / "baseline" / "judgebias.jsonl").is_file()
    assert doc["regressions"] == ["judgebias/represent/anchor_mae"]
