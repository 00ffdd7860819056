"""The pre-training length audit: what TRL would drop or cut is counted, and each long_rows action does what it says."""

import json

import pytest
from transformers import AutoTokenizer

from judgetrain.data import load_judgebias
from judgetrain.config.recipe import RecipeError
from judgetrain.data.lengths import _lengths_batched, audit_lengths


@pytest.fixture(scope="module")
def rows_and_tokenizer(tiny_judge):
    tok = AutoTokenizer.from_pretrained(tiny_judge)
    ds = load_judgebias("bundled", split="validation").select(range(24))
    return ds.add_column("dataset", ["judgebias"] * len(ds)), tok


def _full_lengths(ds, tok):
    return _lengths_batched({k: list(ds[k]) for k in ("prompt", "chosen", "rejected")}, tok)


def test_audit_counts_rows_that_would_be_cut_and_errors_by_default(rows_and_tokenizer):
    ds, tok = rows_and_tokenizer
    lengths = _full_lengths(ds, tok)
    limit = sorted(lengths["_full_len"])[len(ds) // 2]  # half the rows are longer
    too_long = sum(n > limit for n in lengths["_full_len"])
    assert too_long > 0
    with pytest.raises(RecipeError, match=f"{too_long} training rows do not fit max_length={limit}"):
        audit_lengths(ds, tok, limit, "error", None)
    kept, report = audit_lengths(ds, tok, limit, "truncate", None)
    assert len(kept) == len(ds) and report["datasets"]["judgebias"]["completion_cut"] == too_long


def test_skip_drops_and_writes_every_long_row_to_the_rejects_file(rows_and_tokenizer, tmp_path):
    ds, tok = rows_and_tokenizer
    limit = sorted(_full_lengths(ds, tok)["_full_len"])[len(ds) // 2]
    kept, report = audit_lengths(ds, tok, limit, "skip", str(tmp_path / "rejects.jsonl"))
    rejects = [json.loads(l) for l in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert len(kept) + len(rejects) == len(ds) == len(kept) + report["skipped"]
    assert {r["reason"] for r in rejects} <= {"completion_cut", "prompt_fills_max_length"}
    assert max(_full_lengths(kept, tok)["_full_len"]) <= limit


def test_shorten_prompt_keeps_the_whole_evaluation_and_fits_max_length(rows_and_tokenizer):
    ds, tok = rows_and_tokenizer
    limit = sorted(_full_lengths(ds, tok)["_full_len"])[len(ds) // 2]
    kept, report = audit_lengths(ds, tok, limit, "shorten_prompt", None)
    assert len(kept) == len(ds) and report["shortened"] > 0 and report["skipped"] == 0
    assert max(_full_lengths(kept, tok)["_full_len"]) <= limit
    for before, after in zip(ds, kept):
        # the judge's evaluation, with its closing JSON score, is untouched; only the user message may be cut
        assert after["chosen"] == before["chosen"] and after["rejected"] == before["rejected"]
        assert after["prompt"][0] == before["prompt"][0]
        if after["prompt"][1] != before["prompt"][1]:
            assert "[... shortened to fit max_length ...]" in after["prompt"][1]["content"]


def test_the_trainer_reuses_the_audits_ids_and_still_drops_what_trl_would(rows_and_tokenizer, tiny_judge, tmp_path,
                                                                          caplog):
    """JudgeDPOTrainer on audited rows holds exactly the rows and ids TRL's DPOTrainer prepares from the text, without
    tokenising again; TRL's keep_start drop of rows whose prompt fills max_length still happens (long_rows: truncate)."""
    import logging

    import torch
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    from judgetrain.trainer.dpo import JudgeDPOTrainer

    ds, tok = rows_and_tokenizer
    prompts = sorted(_full_lengths(ds, tok)["_prompt_len"])
    limit = prompts[len(ds) // 3]  # a third of the rows have a prompt that fills it
    audited, report = audit_lengths(ds, tok, limit, "truncate", None)
    fills = report["datasets"]["judgebias"]["prompt_fills_max_length"]
    assert fills >= len(ds) // 2
    text = audited.select_columns(["prompt", "chosen", "rejected"])
    model = AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)
    args = DPOConfig(output_dir=str(tmp_path), max_length=limit, report_to="none", use_cpu=True, bf16=False,
                     activation_checkpointing=False, dataloader_num_workers=0)
    trl_rows = DPOTrainer(model=model, args=args, train_dataset=text, processing_class=tok).train_dataset
    with caplog.at_level(logging.INFO, logger="judgetrain.compat.trl"):
        ours = JudgeDPOTrainer(model=model, args=args, train_dataset=audited, processing_class=tok,
                               prefix_sharing=False).train_dataset
    assert f"{len(ds)} rows' token ids from the length audit reused" in caplog.text
    assert len(ours) == len(trl_rows) == len(ds) - fills
    for column in ("prompt", "prompt_ids", "chosen_ids", "rejected_ids"):
        assert ours[column] == trl_rows[column], column
