"""Torn caches are rebuilt, never trusted: every file judgetrain writes for its own later use (the training rows
folder, the eval rows folders and their length audit, the eval reference, the model cache) is written whole or not
at all and checked when read back. One cut to half its size or zero-filled (what a crash during its write, or a full disk, leaves) is
named in one warning and prepared again, and the start goes on with the same result as from an untorn cache."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest

from helpers import QUICKSTART

TEARS = ("truncated", "zero_filled")


def tear(path: Path, how: str) -> None:
    size = path.stat().st_size
    if how == "truncated":
        with path.open("r+b") as f:
            f.truncate(size // 2)
    else:
        path.write_bytes(bytes(size))


def _warnings(caplog, phrase: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and phrase in r.getMessage()]


def _recipe(tmp_path, *extra):
    from judgetrain.config.recipe import parse_recipe
    from judgetrain.models.aliases import resolve_model
    from judgetrain.models.loading import load_recipe_tokenizer

    recipe = tmp_path / "small.yaml"  # the quickstart on 12 + 12 rows
    recipe.write_text(QUICKSTART.read_text().replace("split: train}", "split: train, rows: 12}")
                      .replace("split: train, mode: pairwise}", "split: train, mode: pairwise, rows: 12}"))
    recipe = parse_recipe(
        [str(recipe), "--output_dir", str(tmp_path / "run"), "--report_to", "none", *extra])
    (tmp_path / "run").mkdir()
    model_args = recipe.model_args
    tokenizer = load_recipe_tokenizer(resolve_model(model_args.model_name_or_path), recipe.training_args, model_args)
    return recipe, tokenizer


def _rows(dataset) -> list:
    return [dataset[i] for i in range(len(dataset))]


@pytest.mark.parametrize("how", TEARS)
@pytest.mark.parametrize("torn", ["data-00000-of-00001.arrow", "judgetrain_rows.json"])
def test_a_torn_training_rows_folder_is_prepared_again(tmp_path, caplog, how, torn):
    from judgetrain.data.prepare import load_audited_dataset

    recipe, tokenizer = _recipe(tmp_path)
    first, audit = load_audited_dataset(recipe, tokenizer)
    expected, fingerprint = _rows(first), audit["rows_fingerprint"]
    folder = tmp_path / "run" / "train_rows" / "node-0"
    del first
    tear(folder / torn, how)
    with caplog.at_level(logging.INFO, logger="judgetrain"):
        again, audit = load_audited_dataset(recipe, tokenizer)  # a resume's start
    [line] = _warnings(caplog, "is torn")
    assert str(folder) in line and "preparing it again" in line
    assert audit["rows_fingerprint"] == fingerprint and _rows(again) == expected
    assert not audit["rows_reused"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="judgetrain"):
        third, audit = load_audited_dataset(recipe, tokenizer)  # the rebuilt folder is trusted
    assert not _warnings(caplog, "is torn") and _rows(third) == expected


@pytest.mark.parametrize("how", TEARS)
def test_torn_eval_rows_and_their_audit_are_prepared_again(tmp_path, caplog, how):
    from judgetrain.eval.rows import AUDIT_FILE, recipe_eval_suites

    recipe, tokenizer = _recipe(tmp_path, "--eval_suites", "judgebias", "--eval_max_rows", "6")
    [spec] = recipe_eval_suites(recipe, tokenizer)
    expected = _rows(spec.rows)
    out = tmp_path / "run"
    audit = (out / AUDIT_FILE).read_text()
    tear(out / "eval_rows" / "judgebias" / "node-0" / "data-00000-of-00001.arrow", how)
    tear(out / AUDIT_FILE, how)
    with caplog.at_level(logging.INFO, logger="judgetrain"):
        [again] = recipe_eval_suites(recipe, tokenizer)
    [rows_line] = _warnings(caplog, "Rows folder")
    assert "eval_rows/judgebias" in rows_line and "is torn" in rows_line and "preparing it again" in rows_line
    [audit_line] = _warnings(caplog, AUDIT_FILE)
    assert "is torn" in audit_line and "counted again" in audit_line
    assert _rows(again.rows) == expected
    assert (out / AUDIT_FILE).read_text() == audit  # the same counts, written whole again


@pytest.mark.parametrize("how", TEARS)
def test_a_torn_model_cache_entry_is_built_again_to_the_same_bytes(tmp_path, monkeypatch, caplog, how):
    from judgetrain.models.tiny import ensure_tiny_judge

    monkeypatch.setenv("JUDGETRAIN_CACHE", str(tmp_path / "cache"))
    weights = Path(ensure_tiny_judge()) / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    tear(weights, how)
    with caplog.at_level(logging.WARNING, logger="judgetrain"):
        assert Path(ensure_tiny_judge()) / "model.safetensors" == weights
    [line] = _warnings(caplog, "incomplete or corrupt")
    assert weights.parent.name in line and "rebuilding" in line
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == digest



def _break_reference(path: Path, how: str) -> None:
    import json

    if how == "not_json":
        path.write_text('{"namespace": "base:x", "values": {"a": 1.5,')
    elif how == "wrong_shape":
        path.write_text(json.dumps({"namespace": "base:x", "values": [1.0, 2.0]}))
    else:
        tear(path, how)


def test_a_torn_eval_reference_is_scored_again_from_the_base_weights(tmp_path, caplog):
    """A resumed full fine-tune's eval reference (the weights before step 1, scored at the start): cut short,
    zero-filled, not JSON or the wrong shape, it is named in one warning and scored again with the base model loaded
    again; the eval scores are the untorn resume's and the file is written whole again."""
    import json

    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from judgetrain.config.recipe import RecipeError
    from judgetrain.eval import reference
    from judgetrain.eval.runner import evaluate
    from judgetrain.eval.scoring import ScoringEngine
    from judgetrain.eval.suites import SuiteSpec
    from judgetrain.models.tiny import build_tiny_judge
    from test_eval_scoring import SMALL

    tiny = build_tiny_judge(tmp_path / "tiny", seed=0, config=SMALL)  # the eval tests' small tiny Qwen2
    state, tokenizer = PartialState(), AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    specs = [SuiteSpec("ideation", max_rows=2)]

    def engine():
        return ScoringEngine(model, tokenizer, max_length=512, batch_tokens=2048)

    def scores(e):
        return [r[k] for r in evaluate(e, specs)["ideation"].records for k in ("score_chosen", "score_rejected")]

    start = engine()
    reference.score_reference(start, specs, state)
    path = reference.save_reference(start, tmp_path)
    written = json.loads(path.read_text())["values"]
    with torch.no_grad():  # "training": the policy moves, the reference must not
        torch.manual_seed(1)
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    untorn = engine()
    reference.load_reference(untorn, tmp_path, state, "checkpoint-2")
    expected = scores(untorn)
    assert min(abs(x) for x in expected) > 1e-3

    for how in TEARS + ("not_json", "wrong_shape"):
        _break_reference(path, how)
        with pytest.raises(RecipeError, match=r"eval_reference.json is torn .*checkpoint-2"):  # nothing to rebuild with
            reference.load_reference(engine(), tmp_path, state, "checkpoint-2")
        resumed = engine()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="judgetrain"):
            reference.load_reference(resumed, tmp_path, state, "checkpoint-2", rebuild=lambda: (
                reference.rescore_initial_weights(resumed, specs, state, {})))
        [line] = _warnings(caplog, reference.EVAL_REFERENCE_FILE)
        assert str(path) in line and "is torn" in line and "scoring the weights before step 1 again" in line, how
        assert resumed.model is model and resumed.policy_reference == "frozen"  # the trained policy back in place
        if how == TEARS[0]:  # the eval on the rebuilt reference (the others rebuild the same values)
            assert scores(resumed) == pytest.approx(expected, abs=1e-5)
        assert json.loads(path.read_text())["values"] == pytest.approx(written, abs=1e-5), how  # whole again
