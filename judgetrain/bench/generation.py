"""The generation part: the batched engine (`judgetrain.eval.generate.Generator`) against a one-prompt-at-a-time
``model.generate`` loop (what judge mode's ``generate_samples`` did), on the same JudgeBias prompts, greedy, with the
same stop tokens and ``max_new_tokens``; tokens generated per second on each side and their ratio. A third side, the
engine with prefix sharing off (every prompt run whole in its batch), says what sharing the batch's prompt prefix
gains. With ``--generation-vllm`` a fourth, the vLLM backend (engine start and first prompt untimed), where vLLM can
run.

The models carry the recipe's LoRA adapter, randomly initialised (`judgetrain.bench.eval.load_eval_model`), as a
judge under training does; the engine runs it merged, the loop through PEFT's forward, as before.
"""

# Late imports: torch, judgetrain.eval, judgetrain.config, judgetrain.models (inside the functions that use them):
# each benchmark part loads only what it measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import argparse
import logging
import re
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from judgetrain.bench.common import BenchError, load_average, median, ratio, timed_sides
from judgetrain.bench.eval import _judgebias_rows, load_eval_model

logger = logging.getLogger(__name__)

GENERATION_MODELS = {"tiny-judge": "tiny_judge", "smollm2-135m-instruct": "smollm2"}


def generation_label(name: str) -> str:
    return GENERATION_MODELS.get(name) or re.sub(r"\W+", "_", name).strip("_").lower()


def one_at_a_time(generator, prompt_ids: list[list[int]]) -> list:
    """The loop the engine replaces: one prompt per ``model.generate`` call, no padding, PEFT's own forward."""
    import torch

    model = generator.model
    device = next(model.parameters()).device
    config = generator.generation_config()
    out = []
    with torch.inference_mode():
        for ids in prompt_ids:
            inp = torch.tensor([ids], device=device)
            seq = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), generation_config=config)
            out.append(generator.completion(seq[0, len(ids):].tolist(), len(ids)))
    return out


def bench_generation_model(cfg: argparse.Namespace, model, tokenizer, prompts: list) -> dict:
    from judgetrain.eval.generate import Generator

    gen = Generator(model, tokenizer, max_new_tokens=cfg.generation_max_new_tokens, max_length=cfg.eval_max_length,
                    batch_tokens=cfg.generation_batch_tokens, max_batch_size=cfg.generation_max_batch_size)
    room = gen.max_length - gen.max_new_tokens
    prompt_ids = [gen.prompt_ids(p)[-room:] for p in prompts]
    model.eval()
    # untimed: one short prompt through each path (first-call allocations, lazy imports)
    gen.replace(max_new_tokens=2).generate(prompts[:1])
    one_at_a_time(gen.replace(max_new_tokens=2, merge_lora=False), prompt_ids[:1])
    whole = gen.replace(prefix_sharing=False)
    run = {"engine": lambda: gen.generate(prompts), "engine_whole_prompts": lambda: whole.generate(prompts),
           "one_at_a_time": lambda: one_at_a_time(gen, prompt_ids)}
    vllm = _start_vllm(cfg, gen, model, prompts, run) if cfg.generation_vllm else {}
    times, outs = timed_sides(run, cfg.generation_repeats)
    e, n = outs["engine"], outs["one_at_a_time"]
    equal = _same_tokens(e, n)
    side = partial(_side_figures, times)
    engine, loop = side("engine", e), side("one_at_a_time", n)
    unshared = side("engine_whole_prompts", outs["engine_whole_prompts"])
    prompt_tokens = [g.prompt_tokens for g in e]
    dtypes = {("adapter" if "lora_" in name else "base"): str(param.dtype).replace("torch.", "")
              for name, param in model.named_parameters()}
    return {
        "architecture": type(getattr(model, "get_base_model", lambda: model)()).__name__,
        "base_dtype": dtypes.get("base"), "adapter_dtype": dtypes.get("adapter"),
        "rows": len(prompts), "max_new_tokens": gen.max_new_tokens,
        "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens), "prompt_tokens_max": max(prompt_tokens),
        "truncated": sum(g.truncated for g in e),
        "engine": engine, "one_at_a_time": loop,
        "tokens_per_s_ratio": ratio(engine["tokens_per_s"], loop["tokens_per_s"]),
        # the engine with every prompt run whole in its batch: what running the batch's shared prefix once gains
        "engine_whole_prompts": unshared,
        "prefix_sharing_speedup": ratio(engine["tokens_per_s"], unshared["tokens_per_s"]),
        "whole_prompts_texts_equal": all(a.text == b.text for a, b in zip(e, outs["engine_whole_prompts"])),
        "texts_equal": all(a.text == b.text for a, b in zip(e, n)), "token_ids_equal_rows": sum(equal),
        "engine_stats": gen.stats.as_dict(), "batch_tokens": gen.batch_tokens, "load_average": load_average(),
        **({"vllm": _vllm_side(vllm, side, outs, engine, loop)} if vllm else {}),
    }


def _start_vllm(cfg: argparse.Namespace, gen, model, prompts: list, run: dict[str, Callable]) -> dict[str, Any]:
    """Untimed, the vLLM engine's start and one prompt; its timed side added to ``run``. ``{"start_seconds"}``, or
    ``{"skipped": why}`` where vLLM's own errors (head size, platform) stop it: the other sides still run."""
    vllm: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        vgen = gen.replace(backend="vllm")
        vgen.generate(prompts[:1])
        vllm["start_seconds"] = time.perf_counter() - t0
        run["vllm"] = lambda: vgen.generate(prompts)
    except Exception as e:  # noqa: BLE001 - vLLM's own errors (head size, platform): the other sides still run
        logger.warning("generation bench: the vLLM side of %s did not run: %s", type(model).__name__, e)
        vllm["skipped"] = f"{type(e).__name__}: {e}"
    return vllm


def _same_tokens(engine: list, loop: list) -> list[bool]:
    """Per prompt, whether the engine and the one-at-a-time loop wrote the same tokens (BenchError where they were
    fed different prompts)."""
    if [g.prompt_tokens for g in engine] != [g.prompt_tokens for g in loop]:
        raise BenchError("generation: the engine and the loop fed different prompts")
    equal = [a.token_ids == b.token_ids for a, b in zip(engine, loop)]
    if not all(equal):  # merged LoRA rounds differently from PEFT's forward; a near tie can flip a greedy token
        logger.warning("generation: %d of %d completions differ between the engine and the one-at-a-time loop",
                       equal.count(False), len(equal))
    return equal


def _side_figures(times: dict[str, list[float]], key: str, outputs: list) -> dict:
    """One side's median seconds (and each run's), tokens generated, tokens per second and prompts stopped."""
    tokens = sum(g.n_tokens for g in outputs)
    sec = median(times[key])
    return {"seconds": sec, "seconds_runs": times[key], "generated_tokens": tokens, "tokens_per_s": tokens / sec,
            "stopped": sum(g.stopped for g in outputs)}


def _vllm_side(vllm: dict, side, outs: dict, engine: dict, loop: dict) -> dict:
    """The vLLM backend's side (`--generation-vllm`) against the one-at-a-time loop and the engine (their sides as
    reported), or why it did not run."""
    if "skipped" in vllm:
        return vllm
    v = outs["vllm"]
    out = {**vllm, **side("vllm", v),
           "token_ids_equal_rows": sum(a.token_ids == b.token_ids for a, b in zip(v, outs["one_at_a_time"])),
           "engine_token_ids_equal_rows": sum(a.token_ids == b.token_ids for a, b in zip(v, outs["engine"]))}
    out["tokens_per_s_ratio"] = ratio(out["tokens_per_s"], loop["tokens_per_s"])
    out["vs_engine_tokens_per_s_ratio"] = ratio(out["tokens_per_s"], engine["tokens_per_s"])
    return out


def bench_generation(cfg: argparse.Namespace) -> dict:
    import torch

    prompts = [r["prompt"] for r in _judgebias_rows(cfg.generation_rows)]
    out: dict[str, Any] = {"prompts": "JudgeBias validation prompts (rubric + recipe)", "rows": len(prompts),
                           "dtype": cfg.generation_dtype, "torch_threads": torch.get_num_threads(),
                           "models": {}}
    out["models"] = bench_models(cfg.generation_models, cfg.recipe, "generation",
                                 lambda model, tokenizer: bench_generation_model(cfg, model, tokenizer, prompts),
                                 dtype=cfg.generation_dtype)
    return out


def bench_models(names: list[str], recipe: str, part: str, measure, dtype: str = "float32") -> dict:
    """{label: {"model": name, **measure(model, tokenizer)}} for each model (an alias or a path, loaded with the
    recipe's random LoRA adapter); one that cannot be had here (SmolLM2 without its package) is ``{"skipped": why}``
    and the others still run."""
    from judgetrain.config.recipe import RecipeError
    from judgetrain.models.aliases import resolve_model

    out: dict[str, Any] = {}
    for name in names:
        label = generation_label(name)
        try:
            path = resolve_model(name)
        except RecipeError as e:
            logger.warning("%s bench: %s skipped: %s", part, name, e)
            out[label] = {"skipped": str(e)}
            continue
        model, tokenizer = load_eval_model(path, recipe, dtype=dtype)
        out[label] = {"model": name, **measure(model, tokenizer)}
        del model
    return out
