"""The batched generation engine (judgetrain.eval.generate) on tiny random Qwen2 (the tiny judge), Qwen3 and Llama 3.1
models with their real chat templates: batched, left-padded greedy output equals one-prompt-at-a-time output token
for token; per-row stops, max_new_tokens, truncation, seeded sampling, merged LoRA, and 2 gloo processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from families import build_family_model
from helpers import REPO, free_port

SYSTEM = ("You are an expert judge of laboratory synthesis recipes. Evaluate the recipe for materials, equipment, "
          "procedure completeness, feasibility and characterization, then give a JSON block with overall_score.")
RECIPE = "Dissolve 5 g of NaCl in 100 mL of water, heat to 80 C for 10 min, filter and dry at 120 C. "
PROMPTS = [
    "Hi",  # a few tokens: left padded by ~200 in the batch of the long one
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Recipe:\n" + RECIPE * 5}],
    "Evaluate this proposal: heat the sample.",
    [{"role": "user", "content": "Compare proposal A and proposal B. " * 12}],
]
NEW = 16


def spread(model):
    """Matrices redrawn with std 0.2: at the models' own init (std 0.02) greedy decoding repeats one token forever,
    which would compare nothing. Measured on these prompts: the smallest top-2 logit gap along the greedy paths is
    2e-3, the largest logit difference between a left-padded batch and a prompt alone 1.3e-5 (fp32), so an argmax
    flip from padding is out of reach and the comparison is exact."""
    torch.manual_seed(0)
    with torch.no_grad():
        for w in model.parameters():
            if w.dim() >= 2:
                w.normal_(0, 0.2)
    return model.eval()


@pytest.fixture(scope="module")
def models(tiny_judge, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("gen-families")
    paths = {"tiny": tiny_judge, **{f: build_family_model(f, tiny_judge, root / f) for f in ("qwen3", "llama31")}}
    return {name: (spread(AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)),
                   AutoTokenizer.from_pretrained(p)) for name, p in paths.items()}


def _generator(model, tokenizer, **kw):
    from judgetrain.eval.generate import Generator

    return Generator(model, tokenizer, **{"max_new_tokens": NEW, **kw})


@pytest.mark.parametrize("family,eot", [("tiny", "<|im_end|>"), ("qwen3", "<|im_end|>"), ("llama31", "<|eot_id|>")])
def test_batched_greedy_equals_one_prompt_at_a_time_token_for_token(models, family, eot):
    from judgetrain.models.templates import assistant_prefix

    model, tok = models[family]
    gen = _generator(model, tok)
    assert tok.convert_tokens_to_ids(eot) in gen.stop_token_ids  # read from the template, not a table
    batched = gen.generate(PROMPTS)
    assert gen.stats.batches == 1 and gen.stats.prompts == 4  # one left-padded batch of all four
    lengths = [g.prompt_tokens for g in batched]
    assert max(lengths) > 5 * min(lengths)
    # the prompt as training renders the assistant turn (Qwen3: after the empty think block), no special tokens added
    messages = PROMPTS[1]
    assert gen.prompt_ids(messages) == tok(text=assistant_prefix(tok, messages), add_special_tokens=False)["input_ids"]
    assert lengths[1] == len(gen.prompt_ids(messages))
    for i, prompt in enumerate(PROMPTS):
        alone = _generator(model, tok).generate([prompt])[0]
        assert batched[i].token_ids == alone.token_ids, (family, i)  # exact: no tolerance was needed
        assert batched[i].text == alone.text and batched[i].n_tokens == alone.n_tokens
        assert batched[i].stopped == alone.stopped and batched[i].n_tokens == (len(alone.token_ids) + alone.stopped)
        assert batched[i].n_tokens == NEW or batched[i].stopped
    assert len({t for g in batched for t in g.token_ids}) > 20  # varied text, not one token repeated
    assert gen.stats.generated_tokens == sum(g.n_tokens for g in batched)
    assert model.training is False


RUBRIC = [{"role": "system", "content": SYSTEM * 3}]
SHARED = [RUBRIC + [{"role": "user", "content": "Recipe:\n" + RECIPE * n + ask}]
          for n, ask in ((1, "Score it."), (4, "Is it feasible?"), (2, "Check the equipment."))]


@pytest.mark.parametrize("family", ["tiny", "qwen3", "llama31"])
def test_a_shared_rubric_runs_once_per_batch_and_changes_no_token(models, family):
    model, tok = models[family]
    gen = _generator(model, tok)
    shared = gen.generate(SHARED)
    ids = [gen.prompt_ids(p) for p in SHARED]
    n = min(len(ids[0]), len(ids[1]), len(ids[2])) - 1
    for other in ids[1:]:
        n = min(n, next(j for j, (a, b) in enumerate(zip(ids[0], other)) if a != b))
    assert n > 100  # the chat template's opening and the rubric, as a JudgeBias eval's prompts share them
    assert gen.stats.batches == 1 and gen.stats.shared_prefix_batches == 1 and gen.stats.prefix_sharing_off == ""
    assert gen.stats.shared_prefix_tokens == 2 * n  # two of the three rows did not run it again
    assert gen.stats.padded_prompt_tokens == n + 3 * (max(map(len, ids)) - n)
    whole = _generator(model, tok, prefix_sharing=False)
    unshared = whole.generate(SHARED)
    assert whole.stats.shared_prefix_batches == 0 and whole.stats.padded_prompt_tokens == 3 * max(map(len, ids))
    for i, prompt in enumerate(SHARED):
        alone = _generator(model, tok).generate([prompt])[0]
        assert shared[i].token_ids == alone.token_ids == unshared[i].token_ids, (family, i)
        assert shared[i].prompt_tokens == len(ids[i]) and shared[i].n_tokens == alone.n_tokens
    assert len({t for g in shared for t in g.token_ids}) > 10


def test_prefix_sharing_says_why_it_is_off_and_still_generates_the_same(models):
    model, tok = models["tiny"]
    attn = model.config._attn_implementation
    model.config._attn_implementation = "flash_attention_2"  # what sharing_problem refuses, never run here
    try:
        gen = _generator(model, tok)
        assert gen._can_share(model) is False
        assert "flash_attention_2" in gen.stats.prefix_sharing_off
    finally:
        model.config._attn_implementation = attn
    out = _generator(model, tok, prefix_sharing=False).generate(SHARED[:2])
    assert [g.token_ids for g in out] == [g.token_ids for g in _generator(model, tok).generate(SHARED[:2])]


def test_replace_keeps_every_other_option_and_gives_fresh_stats(models):
    model, tok = models["tiny"]
    gen = _generator(model, tok, max_new_tokens=7, batch_tokens=999, max_batch_size=3, do_sample=True, seed=5,
                     stop_token_ids=[11])
    gen.generate(SHARED[:1])
    other = gen.replace(prefix_sharing=False, max_new_tokens=4)
    assert (other.model, other.tokenizer) == (gen.model, gen.tokenizer)
    assert (other.max_new_tokens, other.prefix_sharing, gen.max_new_tokens, gen.prefix_sharing) == (4, False, 7, True)
    for name in ("max_length", "batch_tokens", "max_batch_size", "do_sample", "seed", "merge_lora", "stop_token_ids"):
        assert getattr(other, name) == getattr(gen, name), name
    assert gen.stats.prompts == 1 and other.stats.prompts == 0
    with pytest.raises(TypeError, match="unknown Generator options: \\['max_tokens'\\]"):
        gen.replace(max_tokens=3)


def test_zero3_gather_is_an_option_kept_by_replace_and_checked(models):
    """eval_generate_zero3_gather reaches the generator (the recipe's generator_kwargs) and survives replace; an
    unknown value is refused; the stats count layer-by-layer ZeRO-3 calls (none without ZeRO-3)."""
    from judgetrain.config.recipe import EvalArguments

    model, tok = models["tiny"]
    gen = _generator(model, tok, **{k: v for k, v in EvalArguments(eval_generate_zero3_gather="never")
                                    .generator_kwargs().items() if k == "zero3_gather"})
    assert gen.zero3_gather == "never" and gen.replace(max_new_tokens=4).zero3_gather == "never"
    gen.generate(SHARED[:1])
    assert gen.stats.as_dict()["zero3_layerwise_calls"] == 0 and gen.stats.gathered_calls == 0  # no ZeRO-3 here
    with pytest.raises(ValueError, match="zero3_gather must be one of"):
        _generator(model, tok, zero3_gather="sometimes")


def test_each_row_stops_on_its_own_and_max_new_tokens_and_truncation_hold(models):
    model, tok = models["tiny"]
    free = _generator(model, tok).generate(PROMPTS)
    # a stop token that row 1 writes early and row 3 never writes: row 1 ends there, row 3 runs on in the same batch
    stop = next(t for t in free[1].token_ids[2:] if t not in free[3].token_ids)
    at = free[1].token_ids.index(stop)
    gen = _generator(model, tok, stop_token_ids=[stop])
    out = gen.generate([PROMPTS[1], PROMPTS[3]])
    assert gen.stats.batches == 1
    assert out[0].stopped and out[0].token_ids == free[1].token_ids[:at] and out[0].n_tokens == at + 1
    assert out[0].text == tok.decode(free[1].token_ids[:at], skip_special_tokens=True)
    assert not out[1].stopped and out[1].token_ids == free[3].token_ids and out[1].n_tokens == NEW
    assert gen.stats.stopped == 1 and gen.stats.generated_tokens == at + 1 + NEW

    short = _generator(model, tok, max_new_tokens=5).generate(PROMPTS)
    assert [g.n_tokens for g in short] == [5] * 4 and [g.token_ids for g in short] == [f.token_ids[:5] for f in free]

    cut = _generator(model, tok, max_length=64, max_new_tokens=8)
    out = cut.generate(PROMPTS)
    full = _generator(model, tok).prompt_ids(PROMPTS[1])
    assert [g.truncated for g in out] == [False, True, False, True] and cut.stats.truncated == 2
    assert out[1].prompt_tokens == 56 and out[0].prompt_tokens == len(cut.prompt_ids(PROMPTS[0]))
    assert len(full) > 56
    with pytest.raises(ValueError, match=r"max_length \(8\) must exceed max_new_tokens \(8\)"):
        _generator(model, tok, max_length=8, max_new_tokens=8)


def test_sampling_is_reproducible_from_its_seed_and_leaves_the_global_rng_alone(models):
    model, tok = models["tiny"]
    kw = dict(do_sample=True, temperature=1.0, top_p=0.95)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = _generator(model, tok, seed=7, **kw).generate(PROMPTS[:2])
    after = torch.rand(1)
    assert torch.equal(before, after)  # sampling ran in a forked random state
    b = _generator(model, tok, seed=7, **kw).generate(PROMPTS[:2])
    c = _generator(model, tok, seed=8, **kw).generate(PROMPTS[:2])
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_lora_runs_merged_in_generate_and_batched_equals_one_at_a_time(models):
    from peft import LoraConfig, get_peft_model

    model, tok = models["tiny"]
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                  init_lora_weights=False, task_type="CAUSAL_LM"))
    try:
        peft_model.train()
        gen = _generator(peft_model, tok)
        batched = gen.generate(PROMPTS)
        assert gen.stats.merged_lora_layers > 0 and peft_model.training  # training mode restored
        plain = _generator(model, tok, merge_lora=False)
        with peft_model.disable_adapter():
            base = plain.generate(PROMPTS[:1])
        assert base[0].token_ids != batched[0].token_ids  # the adapter changes what is written
        for i in (0, 1):  # the shortest and the longest prompt
            assert _generator(peft_model, tok).generate([PROMPTS[i]])[0].token_ids == batched[i].token_ids, i
        unmerged = _generator(peft_model, tok, merge_lora=False).generate(PROMPTS)
        assert [g.token_ids for g in unmerged] == [g.token_ids for g in batched]
    finally:
        peft_model.unload()
        model.eval()


def test_vllm_backend_asked_for_without_vllm_or_a_gpu_fails_clearly(models):
    from judgetrain.eval.generate import Generator
    from judgetrain.eval.vllm import vllm_available

    if vllm_available():
        pytest.skip("vLLM and a GPU are present")
    model, tok = models["tiny"]
    with pytest.raises(RuntimeError, match="generation backend 'vllm': (the vllm package is not installed|no CUDA)"):
        Generator(model, tok, backend="vllm")
    assert Generator(model, tok, backend="auto").backend == "transformers"


SHARDED = """
import json, os, sys, torch
sys.path.insert(0, "tests")
from test_generate import spread
from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer
from judgetrain.eval.generate import Generator, generate_sharded
state = PartialState(cpu=True)
path, prompts = sys.argv[1], json.loads(sys.argv[2])
model = spread(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
gen = Generator(model, AutoTokenizer.from_pretrained(path), max_new_tokens=int(sys.argv[3]), max_batch_size=1)
out = generate_sharded(gen, prompts, state)
print("RESULT " + json.dumps({"rank": state.process_index, "world": state.num_processes, "stats": gen.stats.as_dict(),
                              "out": [[g.token_ids, g.text, g.prompt_tokens] for g in out]}), flush=True)
torch.distributed.destroy_process_group()  # gloo's threads ended before exit (else, rarely: abort at exit)
"""


def test_two_gloo_processes_generate_every_prompt_once_with_the_texts_of_one(models, tiny_judge):
    model, tok = models["tiny"]
    prompts = PROMPTS + ["One more judge prompt, of middling length, to make the count odd."]
    one = _generator(model, tok).generate(prompts)
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", SHARDED, tiny_judge, json.dumps(prompts), str(NEW)],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-4000:]
        results.append(json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:]))
    assert sorted(r["rank"] for r in results) == [0, 1] and {r["world"] for r in results} == {2}
    by_rank = {r["rank"]: r for r in results}
    # 5 prompts strided over 2 ranks: 3 and 2, one generate call each (max_batch_size 1); rank 1 pads one call
    assert [by_rank[r]["stats"]["prompts"] for r in (0, 1)] == [3, 2]
    assert [by_rank[r]["stats"]["padding_batches"] for r in (0, 1)] == [0, 1]
    expected = [[g.token_ids, g.text, g.prompt_tokens] for g in one]
    for r in results:
        assert r["out"] == expected  # every process holds every prompt's completion, in input order


def test_a_stop_request_abandons_generation_before_its_next_generate_call(models):
    from judgetrain.eval.scoring import EvalStopped

    model, tok = models["tiny"]
    gen = _generator(model, tok, max_batch_size=1, max_new_tokens=2)  # one prompt per generate call: 4 calls
    asked = []
    gen.stop_check = lambda: asked.append(1) or len(asked) == 3  # the stop arrives while the 2nd call runs
    with pytest.raises(EvalStopped, match="after 3"):
        gen.generate(PROMPTS)
    assert gen.stats.batches == 2 and model.training is False
    gen.stop_check = None
    assert len(gen.generate(PROMPTS)) == 4  # the next eval runs whole


@pytest.mark.parametrize("family", ["tiny", "qwen3", "llama31"])
def test_the_preallocated_cache_writes_the_tokens_of_the_dynamic_one(models, family):
    model, tok = models[family]
    for prompts in (PROMPTS, SHARED):  # left padding (the tiny judge's template opening shared), then a rubric
        static = _generator(model, tok)
        dynamic = _generator(model, tok, static_cache=False)
        a, b = static.generate(prompts), dynamic.generate(prompts)
        assert static.stats.static_cache_batches == static.stats.batches == 1
        assert dynamic.stats.static_cache_batches == 0
        assert static.stats.shared_prefix_batches == dynamic.stats.shared_prefix_batches >= int(prompts is SHARED)
        assert [g.token_ids for g in a] == [g.token_ids for g in b], family
        assert sum(g.n_tokens for g in a) > 2 * NEW


@pytest.mark.parametrize("family", ["tiny", "qwen3", "llama31"])
def test_in_bf16_the_preallocated_cache_gives_the_dynamic_caches_logits_within_rounding(models, family):
    # bf16 greedy paths part at near ties whenever a sum is reordered (a longer, masked key range), so this compares
    # what decides them: the logits of a prompt's last 6 tokens fed one at a time on each cache, teacher forced
    from transformers.cache_utils import DynamicCache

    from judgetrain.compat.transformers import cache_keyword, static_cache

    model, tok = models[family]
    model = model.to(torch.bfloat16)
    try:
        ids = torch.tensor([_generator(model, tok).prompt_ids(SHARED[1])])
        n, key = ids.size(1), cache_keyword(model)
        logits = []
        for cache in (DynamicCache(), static_cache(model, n + 8, 1)):
            with torch.no_grad():
                model(input_ids=ids[:, : n - 6], use_cache=True, **{key: cache})
                logits.append(torch.cat([model(input_ids=ids[:, t : t + 1], use_cache=True, **{key: cache}).logits
                                         for t in range(n - 6, n)]).float())
        scale = logits[0].abs().max().item()
        assert scale > 1
        assert (logits[1] - logits[0]).abs().max().item() <= 4 * 2**-8 * scale  # a few bf16 roundings of the scale
        assert torch.equal(logits[1].argmax(-1), logits[0].argmax(-1))
    finally:
        model.to(torch.float32)


def test_a_model_without_static_cache_support_decodes_on_the_dynamic_cache(models, monkeypatch):
    model, tok = models["tiny"]
    monkeypatch.setattr(type(model), "_can_compile_fullgraph", False)
    gen = _generator(model, tok)
    out = gen.generate(SHARED)
    assert gen.stats.batches == 1 and gen.stats.static_cache_batches == 0 and gen.stats.shared_prefix_batches == 1
    monkeypatch.undo()
    assert [g.token_ids for g in out] == [g.token_ids for g in _generator(model, tok).generate(SHARED)]
