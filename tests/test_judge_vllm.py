"""`judgetrain judge` on the vLLM backend, without vLLM (`judgetrain.judge.fit`): what a judge loads (no transformers
copy of the weights; an adapter as a LoRA request), the engine's memory estimate against gpu_memory_utilization x
the GPU (values of 8B judges on an 80 GiB card), the option and its judges-file key, and the refusals (exit 2)
before any model loads. Checked on CPU only: nothing here starts a vLLM engine or reads a real GPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from judgetrain.checks.memory import BUILTIN_SHAPES
from judgetrain.judge.fit import (ENGINE_ALLOWANCE, GIB, config_numbers, engine_estimate, fit_problem, gpu_share,
                                  load_plan, preflight_vllm)
from judgetrain.judge.judges import JudgeSpec, JudgeSpecError, judge_specs, parse_judge
from judgetrain.judge.options import Options

PINNED = "b" * 40
CARD = 80 * GIB
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "dtype": "bfloat16", "tie_word_embeddings": False}


def _items(path: Path) -> Path:
    path.write_text(json.dumps({"sample_id": 1, "prompt": [{"role": "user", "content": "Rate this."}]}) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ the estimate
def test_an_8b_judge_at_its_full_context_needs_more_than_a_third_of_an_80_gib_card():
    shape = BUILTIN_SHAPES["meta-llama/Llama-3.1-8B-Instruct"]
    est = engine_estimate(shape, "bfloat16", 131072)
    assert est["weights"] == shape.params() * 2 and 14.9 * GIB < est["weights"] < 15.0 * GIB
    assert est["kv_cache"] == 2 * 32 * 8 * 128 * 2 * 131072 == 16 * GIB  # keys and values, every layer, bf16
    assert est["total"] == est["weights"] + est["kv_cache"] + ENGINE_ALLOWANCE
    problem = fit_problem("llama", est, 0.3, CARD, context=131072)
    assert problem is not None and "\n" not in problem
    assert problem.startswith("judge 'llama': its vLLM engine needs about 33.0 GiB")
    assert "131072-token sequence 16.0 GiB" in problem and "0.3 x 80.0 GiB = 24.0 GiB" in problem
    assert "raise --gpu_memory_utilization" in problem and "lower --max_length" in problem
    assert fit_problem("llama", est, 0.9, CARD) is None
    # the same judge at a 4096-token context, and Qwen3-8B (whose training vLLM runs at 0.3), fit a third
    assert fit_problem("llama", engine_estimate(shape, "bfloat16", 4096), 0.3, CARD) is None
    qwen = engine_estimate(BUILTIN_SHAPES["Qwen/Qwen3-8B"], "bfloat16", 4096)
    assert 17 * GIB < qwen["total"] < 18 * GIB and fit_problem("qwen", qwen, 0.3, CARD) is None
    assert fit_problem("qwen", engine_estimate(BUILTIN_SHAPES["Qwen/Qwen3-8B"], "float32", 40960), 0.3, CARD)


def test_a_share_larger_than_the_free_memory_is_refused_as_vllm_would():
    """The reported failure: 0.9 x 80 GiB asked with 63 GiB free (a transformers copy of the judge held the rest)."""
    est = engine_estimate(BUILTIN_SHAPES["Qwen/Qwen3-8B"], "bfloat16", 4096)
    problem = fit_problem("qwen", est, 0.9, CARD, free=63 * GIB)
    assert "asks vLLM for 72.0 GiB of the GPU's 80.0 GiB, but only 63.0 GiB is free" in problem
    assert "at most 0.78" in problem
    assert fit_problem("qwen", est, 0.75, CARD, free=63 * GIB) is None


def test_config_numbers():
    assert config_numbers({"dtype": "bfloat16", "max_position_embeddings": 40960}) == ("bfloat16", 40960)
    assert config_numbers({"torch_dtype": "float16"}, max_length=2048) == ("float16", 2048)
    assert config_numbers({"dtype": "bfloat16"}, "float32") == ("float32", 4096)
    assert config_numbers({}) == ("float32", 4096)
    assert config_numbers({"text_config": {"dtype": "bfloat16", "max_position_embeddings": 8192}}) == \
        ("bfloat16", 8192)


# ------------------------------------------------------------------------------------------------ what loads
def test_on_vllm_no_transformers_weights_load_and_an_adapter_is_a_lora_request():
    spec = JudgeSpec("j", model="Qwen/Qwen3-8B")
    assert load_plan(spec, "transformers", None).transformers_weights is True
    plan = load_plan(spec, "vllm", None)
    assert (plan.transformers_weights, plan.base, plan.adapter, plan.lora_rank) == (False, "Qwen/Qwen3-8B", None, None)
    lora = {"peft_type": "LORA", "r": 12, "base_model_name_or_path": "Qwen/Qwen3-8B", "revision": PINNED}
    plan = load_plan(JudgeSpec("t", adapter="runs/x/checkpoint-5"), "vllm", lora)
    assert (plan.transformers_weights, plan.base, plan.adapter, plan.lora_rank, plan.revision) == \
        (False, "Qwen/Qwen3-8B", "runs/x/checkpoint-5", 12, PINNED)
    local = load_plan(JudgeSpec("t", model="/models/q", adapter="a"), "vllm", lora)
    assert local.revision is None  # a local folder loads as it is
    for bad, message in (({**lora, "use_dora": True}, "do not take use_dora"),
                         ({**lora, "peft_type": "IA3"}, "LoRA adapters only, got IA3")):
        with pytest.raises(ValueError, match=re.escape(message)):
            load_plan(JudgeSpec("t", adapter="a"), "vllm", bad)
    assert load_plan(JudgeSpec("t", adapter="a"), "transformers", {**lora, "use_dora": True}).transformers_weights


def test_the_vllm_judge_generator_reads_only_the_tokenizer_and_config(tiny_judge, tmp_path, monkeypatch):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    import judgetrain.eval.generate as generate
    import judgetrain.eval.vllm as vllm_backend
    import judgetrain.judge.runner as runner

    base = AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=12, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "adapter")
    monkeypatch.setattr(generate, "resolve_backend", lambda backend: "vllm")
    monkeypatch.setattr(runner, "resolve_backend", lambda backend: "vllm")

    def no_weights(*args, **kwargs):
        raise AssertionError("a transformers model of the weights was loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_weights)
    spec = JudgeSpec("t", model=tiny_judge, adapter=str(tmp_path / "adapter"), gpu_memory_utilization=0.4)
    gen, prefix = runner.local_generator(spec, Options(backend="vllm", max_new_tokens=8), device="cpu")
    assert prefix is None and gen.model is None and gen.backend == "vllm"
    assert gen.prompt_ids("Rate this.") and gen.stop_token_ids
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kwargs, peft = vllm_backend.vllm_engine_kwargs(gen, gen._vllm_kwargs)
    assert peft is True
    assert kwargs["model"] == kwargs["tokenizer"] == str(tiny_judge) and "revision" not in kwargs
    assert (kwargs["enable_lora"], kwargs["max_lora_rank"], kwargs["gpu_memory_utilization"]) == (True, 16, 0.4)
    assert kwargs["max_model_len"] == gen.max_length == base.config.max_position_embeddings
    assert kwargs["dtype"] == config_numbers(base.config.to_dict())[0]


# ------------------------------------------------------------------------------------------------ the command
def test_the_option_and_the_judges_file_key(tmp_path):
    from judgetrain.cli.judge import build_parser, options

    base = ["--items", "i.jsonl", "--judge", "tiny-judge", "--output_dir", "o"]
    assert options(build_parser().parse_args(base)).gpu_memory_utilization == 0.85
    opts = options(build_parser().parse_args(base + ["--gpu_memory_utilization", "0.5"]))
    assert opts.gpu_memory_utilization == 0.5 and "gpu_memory_utilization" not in opts.identity()
    with pytest.raises(ValueError, match=re.escape("--gpu_memory_utilization must be in (0, 1], got 1.5")):
        options(build_parser().parse_args(base + ["--gpu_memory_utilization", "1.5"]))
    path = tmp_path / "judges.yaml"
    path.write_text("- model: tiny-judge\n  name: a\n  gpu_memory_utilization: 0.4\n- model: tiny-judge\n  name: b\n")
    a, b = judge_specs(None, str(path))
    assert (a.gpu_memory_utilization, b.gpu_memory_utilization) == (0.4, None)
    assert (gpu_share(a, opts), gpu_share(b, opts)) == (0.4, 0.5)
    assert a.identity(resolve=False) == b.identity(resolve=False) | {"name": "a"}  # the share writes nothing else
    assert parse_judge("model=m,gpu_memory_utilization=0.3").gpu_memory_utilization == 0.3
    for bad, message in (("model=m,gpu_memory_utilization=0", "gpu_memory_utilization must be in (0, 1]"),
                         ("model=m,gpu_memory_utilization=half", "'half' is not a number"),
                         ("endpoint=http://h/v1,model=m,gpu_memory_utilization=0.5", "takes no adapter or gpu_memory")):
        with pytest.raises(JudgeSpecError, match=re.escape(message)):
            parse_judge(bad)


def test_a_judge_that_does_not_fit_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    import judgetrain.eval.vllm as vllm_backend

    folder = tmp_path / "llama8b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))  # no weights: only the config is read
    monkeypatch.setattr(vllm_backend, "resolve_backend", lambda backend: "vllm")
    specs = [JudgeSpec("big", model=str(folder)), JudgeSpec("api", endpoint="http://h/v1", model="m")]
    with pytest.raises(JudgeSpecError, match=r"judge 'big': its vLLM engine needs about 33\.0 GiB .* = 24\.0 GiB"):
        preflight_vllm(specs, Options(backend="vllm", gpu_memory_utilization=0.3), memory=(CARD, CARD))
    preflight_vllm(specs, Options(backend="vllm", gpu_memory_utilization=0.9), memory=(CARD, CARD))
    preflight_vllm(specs, Options(backend="vllm", gpu_memory_utilization=0.3, max_length=4096), memory=(CARD, CARD))
    roomy = [JudgeSpec("big", model=str(folder), gpu_memory_utilization=0.9)]  # the judge's own key
    preflight_vllm(roomy, Options(backend="vllm", gpu_memory_utilization=0.3), memory=(CARD, CARD))
    preflight_vllm(specs, Options(backend="vllm", gpu_memory_utilization=0.3), memory=None)  # no CUDA: no check


def test_backend_vllm_without_vllm_is_refused_with_exit_2(tmp_path, capsys):
    from judgetrain.cli import main
    from judgetrain.eval.vllm import vllm_available

    if vllm_available():
        pytest.skip("vLLM can run here")
    out = tmp_path / "out"
    code = main(["judge", "--items", str(_items(tmp_path / "items.jsonl")), "--judge", "model=tiny-judge",
                 "--output_dir", str(out), "--backend", "vllm"])
    err = capsys.readouterr().err
    assert code == 2
    assert "judgetrain judge: --backend vllm: generation backend 'vllm':" in err and "use backend 'transformers'" in err
    assert not (out / "judge_run.json").exists()


# ------------------------------------------------------------------------------------------ --batch_tokens auto
def test_auto_batch_tokens_come_from_the_free_memory_and_the_key_value_cache_per_token():
    from transformers import LlamaConfig

    from judgetrain.checks.memory import shape_from_config
    from judgetrain.judge.fit import AUTO_BATCH_TOKENS, CPU_BATCH_TOKENS, budget_tokens, kv_bytes_per_token

    # the loaded model's config as auto_batch_tokens reads it, bf16's 2 bytes
    per_token = kv_bytes_per_token(shape_from_config(LlamaConfig(**LLAMA_8B).to_dict()), 2)
    assert per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024  # keys and values, 32 layers, 8 kv heads of 128, bf16
    # an 8B judge loaded on a 24 GiB card leaves ~6.5 GiB: half of it is 26624 tokens of cache
    tokens, how = budget_tokens(per_token, int(6.5 * GIB), on_gpu=True)
    assert tokens == 26624
    assert how == "0.5 x 6.5 GiB free on the GPU after the load / 128 KiB of key/value cache per token"
    assert budget_tokens(per_token, 62 * GIB, on_gpu=True)[0] == AUTO_BATCH_TOKENS[1]  # an 80 GiB card: the cap
    assert budget_tokens(per_token, GIB // 8, on_gpu=True)[0] == AUTO_BATCH_TOKENS[0]  # nearly full: the floor
    assert budget_tokens(46 * 1024, 20 * GIB, on_gpu=False)[0] == CPU_BATCH_TOKENS  # SmolLM2 on a laptop
    tokens, how = budget_tokens(per_token, 8 * GIB, on_gpu=False)  # 8B on a CPU with 8 GiB free: a quarter of it
    assert tokens == 16384 and how.startswith("CPU: 32768 or a quarter of 8.0 GiB")


def test_batch_tokens_is_auto_by_default_and_the_choice_is_logged(tiny_judge, caplog):
    import logging

    from judgetrain.cli.judge import build_parser, options
    from judgetrain.cli.perturb import build_parser as perturb_parser
    from judgetrain.judge.runner import local_generator

    base = ["--items", "i.jsonl", "--judge", "tiny-judge", "--output_dir", "o"]
    assert options(build_parser().parse_args(base)).batch_tokens is None
    assert options(build_parser().parse_args(base + ["--batch_tokens", "auto"])).batch_tokens is None
    assert options(build_parser().parse_args(base + ["--batch_tokens", "4096"])).batch_tokens == 4096
    with pytest.raises(ValueError, match="--batch_tokens must be at least 1"):
        options(build_parser().parse_args(base + ["--batch_tokens", "0"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--batch_tokens", "lots"])
    assert "--batch_tokens" in perturb_parser().format_help()
    with caplog.at_level(logging.INFO, logger="judgetrain.judge.runner"):
        gen, _ = local_generator(parse_judge("tiny-judge"), Options(max_new_tokens=4), None)
    assert gen.batch_tokens == 32768
    assert "judge tiny-judge: batch_tokens auto: 32768 (CPU: 32768 or a quarter of" in caplog.text
    gen, _ = local_generator(parse_judge("tiny-judge"), Options(max_new_tokens=4, batch_tokens=4096), None)
    assert gen.batch_tokens == 4096
