"""One reading for base and trained: the likelihood readings (loglik_sum, loglik_mean) against hand computations, the
same for a base and its LoRA-initialised adapter, the implicit log-ratio marked where there is no reference, and every
comparison of two judges (eval's baseline, `judgetrain compare`) leaving out a mode the two read otherwise, said."""

from __future__ import annotations

import json

import pytest
import torch

from judgetrain.config.recipe import different_readings, mode_label
from judgetrain.eval.compare import EvaluationError, compare_evaluations
from judgetrain.eval.runner import current_items, evaluate, evaluate_and_write
from judgetrain.eval.scoring import Request, ScoringEngine
from judgetrain.eval.suites import SuiteSpec
from test_eval_scoring import SMALL, hand_logp, tiny_dir, tokenizer  # noqa: F401  (the small tiny judge, its fixtures)

PROMPT = [{"role": "user", "content": "Is water wet?"}]
RESPONSES = ["Yes.", "Water is wet because it adheres to surfaces and that is what wet means in everyday use."]
ROWS = [{"id": f"chat/{i}", "domain": "chat", "prompt": f"Question {i}?",
         "chosen": [f"Answer {i}.", f"A longer answer {i}, with more words in it.", f"**Answer** {i}."],
         "rejected": [f"Wrong {i}.", f"A longer wrong {i}.", f"**Wrong** {i}, said at length."]} for i in range(6)]


def _model(tiny_dir, adapter: str | None = None):
    """The tiny base; ``adapter``: "init" (LoRA as initialised: B = 0, the base's function) or "moved" (random B)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    if adapter is None:
        return base
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=adapter == "init")
    return get_peft_model(base, cfg)


def test_mean_per_token_is_the_sum_over_the_response_tokens_on_worked_rows(tiny_dir, tokenizer):
    """Worked rows: a 2-token-ish answer and a long one; loglik_sum = the hand sum, loglik_mean = that sum / the
    response's token count (the long answer's mean is far from its sum: the count is > 10)."""
    model = _model(tiny_dir)
    engine = ScoringEngine(model, tokenizer, batch_tokens=256)
    responses = [[{"role": "assistant", "content": r}] for r in RESPONSES]
    summed, mean = engine.score_requests([Request("loglik_sum", prompt=PROMPT, responses=responses),
                                          Request("loglik_mean", prompt=PROMPT, responses=responses)])
    for slot, text in enumerate(RESPONSES):
        total, n = hand_logp(model, tokenizer, PROMPT, text)
        assert summed.scores[slot] == pytest.approx(total, abs=2e-4)
        assert mean.scores[slot] == pytest.approx(total / n, abs=2e-5)
    assert hand_logp(model, tokenizer, PROMPT, RESPONSES[1])[1] > 10
    assert abs(summed.scores[1]) > 5 * abs(mean.scores[1])


def test_base_and_its_lora_init_read_alike_in_the_likelihood_readings(tiny_dir, tokenizer):
    """The base (no adapter) and the base + a LoRA adapter as initialised (B = 0) are one function: under loglik_sum and
    loglik_mean their scores are equal row by row. Under implicit the base has no reference: its figures are recorded
    as loglik_sum, not a log-ratio; the adapter's are a log-ratio, 0 for every response. A moved adapter (random B) is
    read with the adapter on: its likelihood differs from the base's."""
    modes = ["implicit", "loglik_sum", "loglik_mean"]

    def scored(model):
        engine = ScoringEngine(model, tokenizer, batch_tokens=512)
        res = evaluate(engine, [SuiteSpec("rmbench", rows=[dict(r) for r in ROWS])], modes=modes)["rmbench"]
        by_mode = {"implicit": res.records, **{m: sub.records for m, sub in res.modes.items()}}
        scores = {m: [x for r in recs for x in r["score_chosen"] + r["score_rejected"]] for m, recs in by_mode.items()}
        return engine, scores, {m: {r["reading"] for r in recs} for m, recs in by_mode.items()}

    base_engine, base, base_read = scored(_model(tiny_dir))
    init_engine, init, init_read = scored(_model(tiny_dir, "init"))
    _, moved, _ = scored(_model(tiny_dir, "moved"))
    for mode in ("loglik_sum", "loglik_mean"):
        assert base_read[mode] == init_read[mode] == {mode}
        assert len(base[mode]) == 36 and init[mode] == pytest.approx(base[mode], abs=1e-4)
        assert max(abs(x - y) for x, y in zip(base[mode], moved[mode])) > 1e-3
    assert base_read["implicit"] == {"loglik_sum"} and base_engine.reading("implicit") == "loglik_sum"
    assert init_read["implicit"] == {"log_ratio"} and init_engine.reading("implicit") == "log_ratio"
    assert base["implicit"] == pytest.approx(base["loglik_sum"], abs=1e-4)  # what it is, and so it is marked
    assert all(abs(x) < 1e-4 for x in init["implicit"])


def test_the_likelihood_modes_of_one_evaluation_read_one_policy_forward(tiny_dir, tokenizer):
    """implicit, loglik_sum and loglik_mean scored together (a moved adapter: a real log-ratio) give each mode the
    scores it gets scored alone, with the policy forwards of one mode: the 36 responses' summed log-probs are
    computed once and read by the two other modes (``policy_shared`` 72); the reference runs once, for implicit.
    Outside an evaluation nothing is kept: the next call runs its forwards again."""
    modes = ["implicit", "loglik_sum", "loglik_mean"]
    model = _model(tiny_dir, "moved")

    def run(ms):
        engine = ScoringEngine(model, tokenizer, batch_tokens=512)
        res = evaluate(engine, [SuiteSpec("rmbench", rows=[dict(r) for r in ROWS])], modes=ms)["rmbench"]
        by_mode = {ms[0]: res.records, **{m: sub.records for m, sub in res.modes.items()}}
        return engine.stats, {m: [x for r in recs for x in r["score_chosen"] + r["score_rejected"]]
                              for m, recs in by_mode.items()}

    together, scores = run(modes)
    for mode in modes:
        alone, own = run([mode])
        assert scores[mode] == pytest.approx(own[mode], abs=1e-5), mode
        assert alone.policy_shared == 0
    single, _ = run(["loglik_sum"])
    assert together.policy_shared == 72 and together.policy_batches == single.policy_batches
    assert together.ref_sequences_computed == 36
    engine = ScoringEngine(model, tokenizer, batch_tokens=512)
    responses = [[{"role": "assistant", "content": r}] for r in RESPONSES]
    engine.score_requests([Request("loglik_sum", prompt=PROMPT, responses=responses)])
    engine.score_requests([Request("loglik_mean", prompt=PROMPT, responses=responses)])
    assert engine.stats.policy_shared == 0  # no evaluation around them: both calls ran their forwards


def test_against_a_base_baseline_a_mode_read_two_ways_is_left_out_and_said(tiny_dir, tokenizer, tmp_path):
    """`judgetrain eval --baseline BASE` scores the base first, then the trained judge (an adapter): implicit is the
    base's log-likelihood and the judge's log-ratio, so it gets no difference (``not_compared`` names both readings);
    loglik_mean reads both alike and is differenced. results.json and every per-row record name their reading;
    `judgetrain compare` of the two folders says the same, and refuses a pair with no mode read alike."""
    modes = ["implicit", "loglik_mean"]
    specs = [SuiteSpec("rmbench", rows=[dict(r) for r in ROWS])]
    base_engine = ScoringEngine(_model(tiny_dir), tokenizer, batch_tokens=512)
    base_results, base_doc = evaluate_and_write(base_engine, specs, tmp_path / "baseline", modes=modes)
    judge_engine = ScoringEngine(_model(tiny_dir, "moved"), tokenizer, batch_tokens=512)
    _, doc = evaluate_and_write(judge_engine, specs, tmp_path / "judge", modes=modes,
                                baseline=current_items(base_results, modes), baseline_readings=base_doc["readings"])
    assert base_doc["readings"] == {"implicit": "loglik_sum", "loglik_mean": "loglik_mean"}
    assert doc["readings"] == {"implicit": "log_ratio", "loglik_mean": "loglik_mean"}
    assert doc["not_compared"] == ["rmbench (implicit): two readings, not differenced: this judge reads log_ratio, "
                                   "the baseline reads loglik_sum"]
    assert set(doc["deltas"]["rmbench"]) == {"loglik_mean"}
    assert "eval/rmbench/loglik_mean/delta/hard_acc" in doc["metrics"]
    assert not any(k.startswith("eval/rmbench/delta/") for k in doc["metrics"])
    saved = json.loads((tmp_path / "judge" / "results.json").read_text())
    assert saved["readings"] == doc["readings"] and saved["not_compared"] == doc["not_compared"]
    for name, reading in (("rmbench.jsonl", "log_ratio"), ("rmbench.loglik_mean.jsonl", "loglik_mean")):
        lines = (tmp_path / "judge" / name).read_text().splitlines()
        assert {json.loads(line)["reading"] for line in lines} == {reading}

    compared = compare_evaluations(tmp_path / "baseline", tmp_path / "judge", n_resamples=200)
    assert set(compared["suites"]["rmbench"]) == {"loglik_mean"}
    assert compared["skipped"] == ["rmbench (implicit): two readings, not differenced: A reads loglik_sum, "
                                   "B reads log_ratio"]
    assert compared["readings"]["a"]["implicit"] == "loglik_sum"
    assert not any(k.startswith("eval/rmbench/delta/") for k in compared["metrics"])
    with pytest.raises(EvaluationError, match="nothing to compare.*A reads loglik_sum, B reads log_ratio"):
        _only_implicit(tmp_path)


def _only_implicit(tmp_path):
    """The two folders with their loglik_mean files taken away: implicit alone, read two ways."""
    for side in ("baseline", "judge"):
        (tmp_path / side / "rmbench.loglik_mean.jsonl").unlink()
    return compare_evaluations(tmp_path / "baseline", tmp_path / "judge", n_resamples=200)


def test_an_implicit_figure_whose_reading_was_not_recorded_is_left_out():
    """An evaluation written before readings were recorded may hold a base's log-likelihood under implicit: its
    implicit figures are set against nothing; a mode whose reading never changed (judge) is still compared."""
    assert different_readings("implicit", None, "log_ratio") == ("two readings, not differenced: A recorded no reading "
                                                                 "(written before readings were), B reads log_ratio")
    assert different_readings("judge", None, "expected_score") is None
    assert different_readings("loglik_mean", "loglik_mean", "loglik_sum") is not None
    assert mode_label("implicit") == "implicit: log_ratio" and mode_label("loglik_mean") == "loglik_mean"
    assert mode_label("implicit", "loglik_sum") == "implicit: loglik_sum"


def test_the_loop_scores_round_0_in_every_reading_its_rounds_use_and_the_round_table_keeps_readings_apart(
        tiny_dir, tokenizer, tmp_path):
    """A loop whose eval lists implicit scores every round, the base (round 0) included, also in loglik_sum and
    loglik_mean (`Eval.modes`). Its round table, from a real base evaluation and a real round 1 (an adapter) compared
    by `judgetrain compare`: each row names its mode and reading; the base's implicit figure (its log-likelihood) and
    round 1's (a log-ratio) are on lines of their own, with no difference; loglik_mean's base and round 1 share a line
    and round 1 carries the difference."""
    from judgetrain.cli.compare import main as compare_main
    from judgetrain.loop.config import Eval
    from judgetrain.loop.table import write_round_table

    assert Eval(scoring=["implicit"]).modes == ["implicit", "loglik_sum", "loglik_mean"]
    assert Eval(scoring=["loglik_mean", "implicit"]).modes == ["loglik_mean", "implicit", "loglik_sum"]
    assert Eval(scoring=["verdict"]).modes == ["verdict"]
    modes = Eval(scoring=["implicit"]).modes
    loop = tmp_path / "loop"
    for k, model in ((0, _model(tiny_dir)), (1, _model(tiny_dir, "moved"))):
        engine = ScoringEngine(model, tokenizer, batch_tokens=512)
        evaluate_and_write(engine, [SuiteSpec("rmbench", rows=[dict(r) for r in ROWS])],
                           loop / f"round-{k}" / "eval" / ("tiny-judge" if k == 0 else "adapter"), modes=modes)
    assert compare_main([str(loop / "round-0" / "eval"), str(loop / "round-1" / "eval"), "--resamples", "200",
                         "--output", str(loop / "round-1" / "eval" / "compare.json")]) == 0
    write_round_table(loop, rounds=1)
    rows = json.loads((loop / "rounds.json").read_text())["rows"]
    hard = {(r["round"], r["mode"], r["reading"]): r for r in rows if r["figure"].endswith("hard_acc")}
    assert set(hard) == {(k, m, r) for k in (0, 1) for m, r in (("loglik_sum", "loglik_sum"),
                                                                 ("loglik_mean", "loglik_mean"))} | {
        (0, "implicit", "loglik_sum"), (1, "implicit", "log_ratio")}
    assert hard[(1, "implicit", "log_ratio")]["delta"] is None
    assert hard[(1, "loglik_mean", "loglik_mean")]["delta"] is not None
    md = (loop / "rounds.md").read_text()
    lines = {line.split(" | ")[0].strip("| "): line for line in md.splitlines()}
    assert lines["rmbench/hard_acc (implicit: loglik_sum)"].rstrip(" |").endswith("]")  # the base alone: no round 1
    assert lines["rmbench/hard_acc (implicit: log_ratio)"].split(" | ")[1] == ""  # round 1 alone: no base
    assert "Δ" in lines["rmbench/loglik_mean/hard_acc (loglik_mean)"]
