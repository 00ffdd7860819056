"""The eval lifecycle around training: the untrained policy as the reference of a model without one (scored once,
kept, read back), eval token ids kept across evals, a stop request honoured between two scoring batches, and eval
rows read, validated and held as Arrow at the start of a run (tiny Qwen2 in-process; no training launch here)."""

from __future__ import annotations

import json
import logging
import math

import datasets
import pytest
import torch
from accelerate import PartialState

from judgetrain.config.recipe import RecipeError
from judgetrain.data import DataValidationError
from judgetrain.eval import reference
from judgetrain.eval.rows import prepare_eval_rows, suite_dataset
from judgetrain.eval.runner import evaluate
from judgetrain.eval.scoring import EvalStopped, ScoringEngine
from judgetrain.eval.suites import SuiteSpec
from test_eval_scoring import tiny_dir, tokenizer  # noqa: F401  (the tiny Qwen2 and its tokenizer)


@pytest.fixture()
def model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)


def _scores(results, suite):
    def listed(v):
        return [] if v is None else list(v) if isinstance(v, list) else [v]

    return [x for r in results[suite].records for x in listed(r["score_chosen"]) + listed(r["score_rejected"])]


def test_policy_reference_is_zero_before_training_nonzero_after_and_read_back_on_resume(model, tokenizer, tmp_path):
    specs = [SuiteSpec("ideation", max_rows=4)]
    engine = ScoringEngine(model, tokenizer, max_length=512, batch_tokens=2048)
    assert reference.needs_policy_reference(engine)
    n = reference.score_reference(engine, specs, PartialState())
    assert n == 4 * 2 and 0 < len(engine._ref_cache) <= n and engine.policy_reference == "frozen"
    reference.save_reference(engine, tmp_path)
    primed = engine.stats.ref_batches
    before = evaluate(engine, specs)
    assert before["ideation"].metrics["n_rows"] == 4
    zeros = _scores(before, "ideation")
    assert len(zeros) == 8 and max(abs(x) for x in zeros) < 1e-4  # policy = reference, up to float rounding
    assert primed > 0 and engine.stats.ref_batches == primed  # the eval read the reference, it ran none

    with torch.no_grad():  # "training": the policy moves, the reference stays
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    after = evaluate(engine, specs)
    moved = _scores(after, "ideation")
    assert all(math.isfinite(x) for x in moved) and min(abs(x) for x in moved) > 1e-3

    resumed = ScoringEngine(model, tokenizer, max_length=512, batch_tokens=2048)
    reference.load_reference(resumed, tmp_path, PartialState(), "checkpoint-2")
    again = evaluate(resumed, specs)
    assert _scores(again, "ideation") == pytest.approx(moved, abs=1e-6)
    assert json.loads((tmp_path / reference.EVAL_REFERENCE_FILE).read_text())["values"] == pytest.approx(engine._ref_cache)

    # a row the start never scored has no reference: unscored and counted, never scored against 0
    from judgetrain.eval.suites import load_suite_rows

    first = {json.dumps(r, sort_keys=True) for r in load_suite_rows(SuiteSpec("ideation", max_rows=4))}
    wider = load_suite_rows(SuiteSpec("ideation", max_rows=8))
    changed = evaluate(resumed, [SuiteSpec("ideation", max_rows=8)])["ideation"]
    unscored = [r for r in changed.records if r.get("no_reference")]
    assert changed.metrics["n_no_reference"] == len(unscored) > 0 and changed.metrics["n_rows"] >= 4
    assert changed.metrics["n_rows"] + len(unscored) == len(wider)
    for r in unscored:  # rows the start did not score, left without a score
        assert r["score_chosen"] is None and json.dumps(wider[r["row_index"]], sort_keys=True) not in first


def test_a_resume_without_the_reference_file_is_refused_naming_the_fix(model, tokenizer, tmp_path):
    engine = ScoringEngine(model, tokenizer, max_length=512)
    with pytest.raises(RecipeError, match=r"eval_reference.json is missing.*checkpoint-4.*eval_scoring: judge"):
        reference.load_reference(engine, tmp_path, PartialState(), "checkpoint-4")


def test_token_ids_are_kept_across_evals_and_dropped_when_max_length_changes(model, tokenizer):
    specs = [SuiteSpec("ideation", max_rows=4)]
    engine = ScoringEngine(model, tokenizer, max_length=512, batch_tokens=2048)
    calls = []  # one per row tokenised (a batch at once, each prompt once; or whole, one row at a time)
    real, real_batch = engine.sequences.pair_ids, engine.sequences.chat_pairs
    engine.sequences.pair_ids = lambda *a: calls.append(1) or real(*a)

    def batch(requests):
        got = real_batch(requests)
        calls.extend([1] * len(got))
        return got

    engine.sequences.chat_pairs = batch
    first = evaluate(engine, specs)
    assert len(calls) == 4
    second = evaluate(engine, specs)
    assert len(calls) == 4 and _scores(second, "ideation") == _scores(first, "ideation")
    engine.max_length = 128  # another length rule: the kept ids are not these rows' ids any more
    third = evaluate(engine, specs)
    assert len(calls) == 8 and third["ideation"].metrics["n_truncated"] == 4


def test_a_stop_request_abandons_the_eval_before_the_next_forward(model, tokenizer):
    engine = ScoringEngine(model, tokenizer, max_length=512, batch_tokens=600, prefix_sharing=False)
    asked = []
    engine.stop_check = lambda: asked.append(1) or len(asked) >= 3
    with pytest.raises(EvalStopped, match="after 3 scoring batches"):
        evaluate(engine, [SuiteSpec("ideation", max_rows=4)])
    assert engine.stats.policy_batches == 0 and len(asked) == 3  # two forwards ran, the third never started
    engine.stop_check = lambda: False
    ok = evaluate(engine, [SuiteSpec("ideation", max_rows=4)])  # the next eval scores everything
    assert ok["ideation"].metrics["n_rows"] == 4


def test_eval_rows_are_read_validated_and_memory_mapped_at_start(tokenizer, tmp_path, caplog):
    specs = [SuiteSpec("judgebias", max_rows=5), SuiteSpec("rmbench", max_rows=3)]
    audit = prepare_eval_rows(specs, tmp_path, tokenizer=tokenizer, max_length=512)
    for spec in specs:
        assert isinstance(spec.rows, datasets.Dataset) and spec.max_rows is None
        assert all(f["filename"].startswith(str(tmp_path / "eval_rows" / spec.name)) for f in spec.rows.cache_files)
    assert len(specs[0].rows) == 5 and len(specs[1].rows) == 3
    assert audit["judgebias"]["rows"] == 5 and audit["judgebias"]["longest"] > 0
    assert json.loads((tmp_path / "eval_audit.json").read_text())["suites"]["rmbench"]["rows"] == 3
    # a later start of the same rows, tokenizer and settings (a resume) reads the counts instead of tokenising again;
    # another max_length counts again
    again = [SuiteSpec("judgebias", max_rows=5), SuiteSpec("rmbench", max_rows=3)]
    with caplog.at_level(logging.INFO, logger="judgetrain.eval.rows"):
        assert prepare_eval_rows(again, tmp_path, tokenizer=tokenizer, max_length=512) == audit
    assert caplog.text.count("counted at an earlier start of the same rows and tokenizer: not tokenised again") == 2
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="judgetrain.eval.rows"):
        shorter = prepare_eval_rows([SuiteSpec("rmbench", max_rows=3)], tmp_path, tokenizer=tokenizer, max_length=64)
    assert "not tokenised again" not in caplog.text and shorter["rmbench"]["too_long"] > 0
    # the same rows as the lazy path draws (cap, seed)
    lazy = SuiteSpec("judgebias", max_rows=5)
    from judgetrain.eval.suites import load_suite_rows

    assert [r["sample_id"] for r in load_suite_rows(lazy)] == specs[0].rows["sample_id"]
    # eval_scoring as a recipe gives it (a list of modes): the audit covers each mode's sequences, generate's through
    # its judge prompts (RM-Bench's rubric prompts are longer than its implicit sequences)
    from judgetrain.eval.rows import audit_eval_lengths

    implicit = audit_eval_lengths(specs[1], tokenizer, 512, scoring=["implicit"])
    both = audit_eval_lengths(specs[1], tokenizer, 512, scoring=["implicit", "generate"])
    assert implicit["rows"] == both["rows"] == 3 and both["longest"] > implicit["longest"]
    assert both == audit_eval_lengths(specs[1], tokenizer, 512, scoring=["judge", "implicit"])


def test_a_bad_eval_row_is_named_or_skipped_and_written_as_rejects(tmp_path):
    import pyarrow.parquet as pq
    from judgetrain import data

    rows = pq.read_table(f"{data.sample_source('judgebias')}/validation.parquet").to_pylist()[:4]
    rows[2]["chosen"] = json.dumps([{"role": "assistant", "content": "  "}])
    path = tmp_path / "validation.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataValidationError) as err:
        suite_dataset(SuiteSpec("judgebias", source=str(path)))
    assert (err.value.source, err.value.split, err.value.row, err.value.field) == (str(path), "validation", 2, "chosen")
    kept = suite_dataset(SuiteSpec("judgebias", source=str(path)), on_bad_row="skip",
                         rejects_path=str(tmp_path / "rejects" / "eval_judgebias.jsonl"))
    assert len(kept) == 3
    rejected = [json.loads(line) for line in (tmp_path / "rejects" / "eval_judgebias.jsonl").read_text().splitlines()]
    assert [(r["row"], r["field"]) for r in rejected] == [(2, "chosen")]

    # the dry run reads every eval row with the recipe's on_bad_row, as the run's start does
    from helpers import QUICKSTART
    from judgetrain.train import run as train_run

    args = [str(QUICKSTART), "--dry_run", "--output_dir", str(tmp_path / "dry"), "--audit_rows", "4",
            "--eval_suites", "judgebias", "--eval_judgebias_source", str(path)]
    with pytest.raises(DataValidationError, match=r"validation\.jsonl \[split=validation\] row 2, field 'chosen'"):
        train_run(args)


# ----------------------------------------------------------------------------------------------- one training run


@pytest.mark.slow
def test_full_fine_tune_eval_is_zero_at_start_a_sigterm_in_an_eval_stops_at_once_and_the_resume_reads_the_reference(
        tmp_path):
    """Full fine-tune with precompute_ref_log_probs (no reference model, no adapter): eval_on_start scores 0, a
    SIGTERM during the step-2 eval abandons it and saves checkpoint-2 at once (exit 143), the resume reads the
    reference the start wrote and scores the trained policy against it."""
    import re
    import signal
    from pathlib import Path

    from test_reliability import _wait_exit, records, small_recipe, start, wait_for

    recipe = Path(small_recipe(tmp_path / "r.yaml", extra="use_peft: false\nprecompute_ref_log_probs: true\n"
                               "eval_on_start: true\neval_batch_tokens: 512\nlearning_rate: 1.0e-4\n"))
    text = recipe.read_text().replace("split: train}", "split: train, max_rows: 8}")
    recipe.write_text(text.replace("max_steps: 6", "max_steps: 4").replace("eval_steps: 4", "eval_steps: 2")
                      .replace("eval_max_rows: 32", "eval_max_rows: 8"))
    run, log1, log2 = tmp_path / "run", tmp_path / "1.log", tmp_path / "2.log"
    proc = start([str(recipe), "--output_dir", str(run)], log1)
    assert wait_for(lambda: "Evaluating judgebias at step 2" in log1.read_text(errors="replace"), proc), \
        log1.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    assert _wait_exit(proc, 120) == 143
    text1 = log1.read_text(errors="replace")
    assert "the eval at step 2 abandoned" in text1 and "no metrics logged for it" in text1, text1[-3000:]
    assert (run / "checkpoint-2" / "judgetrain_complete.json").is_file() and not (run / "checkpoint-3").exists()
    assert not (run / "eval" / "2" / "results.json").exists()
    start_scores = [json.loads(line) for line in (run / "eval" / "0" / "judgebias.jsonl").read_text().splitlines()]
    assert len(start_scores) == 8
    # exactly 0: the policy before the first step is the reference just scored, so its log-probs are not run again
    assert max(abs(r[k]) for r in start_scores for k in ("score_chosen", "score_rejected")) == 0.0
    stats = json.loads((run / "eval" / "0" / "results.json").read_text())["stats"]["judgebias"]
    assert (stats["policy_from_reference"], stats["policy_batches"], stats["ref_batches"]) == (16, 0, 0), stats
    assert (run / reference.EVAL_REFERENCE_FILE).is_file()

    proc = start([str(recipe), "--output_dir", str(run), "--resume", "auto"], log2)
    assert _wait_exit(proc, 600) == 0, log2.read_text()[-3000:]
    text2 = log2.read_text(errors="replace")
    assert "log-probs of the weights before step 1 read from" in text2 and "sequences scored with" not in text2
    after = [json.loads(line) for line in (run / "eval" / "4" / "judgebias.jsonl").read_text().splitlines()]
    assert min(abs(r["score_chosen"]) for r in after) > 1e-3 and not any(r.get("no_reference") for r in after)
    assert [r["step"] for r in records(run) if "eval/judgebias/n_rows" in r] == [0, 4]
    # "at once": the stopped eval ran fewer scoring batches than a whole eval of the same rows (step 4's)
    stopped_after = int(re.search(r"eval abandoned after (\d+) scoring batches", text1).group(1))
    whole = json.loads((run / "eval" / "4" / "results.json").read_text())["stats"]["judgebias"]["policy_batches"]
    assert stopped_after < whole, (stopped_after, whole)
