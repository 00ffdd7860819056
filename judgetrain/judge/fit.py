"""What a local judge loads, and whether its vLLM engine fits the GPU (`judgetrain judge --backend vllm`).

- `load_plan`: on the vLLM backend no transformers copy of the weights is made: the engine reads the base model from
  its folder or hub id, and an adapter as a LoRA request; the generator gets the tokenizer and the numbers of the
  config (context, dtype) from the model's files. On the transformers backend the model loads as before.
- `engine_estimate` / `fit_problem` (`preflight_vllm`, before any model loads): the engine's weights (the parameters
  of config.json, `judgetrain.checks.memory.model_shape`, times the dtype's bytes), a key/value cache of one
  full-context sequence (the least vLLM starts with) and `ENGINE_ALLOWANCE` for its profiling forward and CUDA
  graphs, against ``gpu_memory_utilization`` x the GPU's memory; and that share against the memory free now (vLLM
  refuses to start when less is free than it asks). A judge that does not fit is refused, exit 2, with one line.

- `auto_batch_tokens` (``--batch_tokens auto``, the default, on the transformers backend): the generate calls'
  budget of batch size x (prompt + max_new_tokens) from the memory left once the model is loaded and the model's
  key/value cache per token: `AUTO_KV_SHARE` of the GPU's free memory (the rest for the prefill's activations), on a
  CPU `CPU_BATCH_TOKENS` or a quarter of the available RAM, whichever is less; within `AUTO_BATCH_TOKENS`.

Checked by unit tests on CPU; not yet run against a GPU vLLM.
"""

# Late imports: torch, psutil, judgetrain.eval, judgetrain.checks (inside the functions that use them): the specs are
# checked with the standard library; the preflight reads the GPU and the model's config only when a judge runs on vLLM.

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from judgetrain.judge.judges import JudgeSpec, JudgeSpecError
from judgetrain.utils.hub import is_hub_id

logger = logging.getLogger(__name__)

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ENGINE_ALLOWANCE = 2 * GIB  # vLLM's profiling forward (activations of one batch of scheduled tokens) and CUDA graphs
DEFAULT_CONTEXT = 4096  # a config without max_position_embeddings (as `judgetrain.eval.generate.Generator`)


AUTO_KV_SHARE = 0.5  # of the GPU memory free after the load, for the key/value cache of one generate call
AUTO_BATCH_TOKENS = (2048, 131072)  # the auto budget's bounds: 131072 tokens keep an 8B model's prefill under ~4 GiB
# On a CPU the decode steps are bound by the weights read per step up to a few dozen rows: with SmolLM2, 64 JudgeBias
# items x 128 new tokens took 85 s of generate calls at 32768 tokens (two batches of 32) against 126 s at 8192 (five)
CPU_BATCH_TOKENS = 32768


@dataclass(frozen=True)
class LoadPlan:
    """What a local judge loads: ``transformers_weights`` (a transformers model of the weights, on the device) or
    only the tokenizer and config, the engine reading ``base`` (at ``revision``) and ``adapter`` (LoRA rank
    ``lora_rank``) from disk."""

    engine: str  # "transformers" | "vllm"
    transformers_weights: bool
    base: str
    adapter: str | None = None
    lora_rank: int | None = None
    revision: str | None = None


def adapter_config(spec: JudgeSpec) -> dict | None:
    """The judge's adapter_config.json (None without an adapter)."""
    if not spec.adapter:
        return None
    return json.loads((Path(spec.adapter) / "adapter_config.json").read_text())


def load_plan(spec: JudgeSpec, engine: str, adapter: dict | None) -> LoadPlan:
    """What ``spec`` loads on ``engine`` (the resolved backend), given its adapter's config; ValueError naming the
    judge for an adapter vLLM cannot run as a LoRA request (not LoRA, DoRA, modules_to_save)."""
    base = spec.model if spec.model is not None else str((adapter or {}).get("base_model_name_or_path"))
    if engine != "vllm":
        return LoadPlan(engine, True, base, spec.adapter)
    if adapter is None:
        return LoadPlan(engine, False, base)
    kind = str(adapter.get("peft_type") or "LORA").split(".")[-1]
    if kind != "LORA":
        raise ValueError(f"judge {spec.name!r}: the vLLM backend runs LoRA adapters only, got {kind}; use --backend "
                         "transformers")
    unsupported = [k for k in ("use_dora", "modules_to_save") if adapter.get(k)]
    if unsupported:
        raise ValueError(f"judge {spec.name!r}: vLLM's LoRA requests do not take {', '.join(unsupported)} of this "
                         "adapter; use --backend transformers")
    revision = adapter.get("revision") if is_hub_id(base) else None  # training records the pinned commit there
    return LoadPlan(engine, False, base, spec.adapter, int(adapter.get("r") or 16), revision or None)


def config_numbers(cfg: dict, dtype: str = "auto", max_length: int | None = None) -> tuple[str, int]:
    """(dtype, context) of the engine: ``dtype`` unless ``auto``, else the config's (``dtype`` / ``torch_dtype``),
    else float32 (what transformers loads a config without one in); ``max_length``, else the config's
    ``max_position_embeddings``, else `DEFAULT_CONTEXT`."""
    text = cfg.get("text_config") or cfg
    if dtype == "auto":
        dtype = str(text.get("dtype") or text.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype")
                    or "float32").replace("torch.", "")
    context = max_length or text.get("max_position_embeddings") or DEFAULT_CONTEXT
    return dtype, int(context)


def engine_estimate(shape, dtype: str, context: int, adapter_bytes: int = 0) -> dict[str, int]:
    """Bytes a vLLM engine of a model of ``shape`` (`judgetrain.checks.memory.ModelShape`) needs at the least:
    ``weights`` (parameters x the dtype's bytes), ``kv_cache`` (keys and values of one ``context``-token sequence
    over every layer), ``allowance`` (`ENGINE_ALLOWANCE`), ``adapter`` and their ``total``."""
    width = DTYPE_BYTES.get(dtype, 2)
    out = {"weights": shape.params() * width, "kv_cache": kv_bytes_per_token(shape, width) * int(context),
           "allowance": ENGINE_ALLOWANCE, "adapter": int(adapter_bytes)}
    out["total"] = sum(out.values())
    return out


def fit_problem(judge: str, estimate: dict[str, int], utilization: float, total: float, free: float | None = None,
                context: int | None = None) -> str | None:
    """One line saying why the vLLM engine of ``judge`` cannot start on a GPU of ``total`` bytes (``free`` of them
    free now) with ``gpu_memory_utilization`` ``utilization``; None when it fits."""
    budget = utilization * total
    if estimate["total"] > budget:
        seq = f"one {context}-token sequence" if context else "one sequence"
        return (f"judge {judge!r}: its vLLM engine needs about {estimate['total'] / GIB:.1f} GiB (weights "
                f"{estimate['weights'] / GIB:.1f} GiB, key/value cache of {seq} {estimate['kv_cache'] / GIB:.1f} GiB, "
                f"{estimate['allowance'] / GIB:.0f} GiB for activations and CUDA graphs) but gets "
                f"gpu_memory_utilization {utilization:g} x {total / GIB:.1f} GiB = {budget / GIB:.1f} GiB; raise "
                f"--gpu_memory_utilization (or the judge's gpu_memory_utilization key), lower --max_length, or use a "
                "smaller judge or a GPU with more memory")
    if free is not None and budget > free:
        return (f"judge {judge!r}: gpu_memory_utilization {utilization:g} asks vLLM for {budget / GIB:.1f} GiB of "
                f"the GPU's {total / GIB:.1f} GiB, but only {free / GIB:.1f} GiB is free (another process holds the "
                f"rest) and vLLM refuses to start with less; lower --gpu_memory_utilization to at most "
                f"{max(int(free / total * 100) / 100, 0.01):.2f} (the engine needs {estimate['total'] / GIB:.1f} GiB) "
                "or free the GPU")
    return None


def gpu_share(spec: JudgeSpec, opts) -> float:
    """The judge's own gpu_memory_utilization, else the command's."""
    own = spec.gpu_memory_utilization
    return float(own if own is not None else opts.gpu_memory_utilization)


def kv_bytes_per_token(shape, width: int) -> int:
    """Bytes of keys and values one token holds over every layer of a model of ``shape``
    (`judgetrain.checks.memory.ModelShape`) at ``width`` bytes a number."""
    return 2 * shape.layers * shape.kv_dim * width


def auto_batch_tokens(model, device=None) -> tuple[int, str]:
    """(batch_tokens, how it was chosen) for generation with the loaded ``model`` on ``device`` (see module doc)."""
    import psutil
    import torch

    from judgetrain.checks.memory import shape_from_config

    per_token = kv_bytes_per_token(shape_from_config(model.config.to_dict()), next(model.parameters()).dtype.itemsize)
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    on_gpu = dev.type == "cuda"
    free = torch.cuda.mem_get_info(dev)[0] if on_gpu else psutil.virtual_memory().available
    return budget_tokens(per_token, free, on_gpu)


def budget_tokens(per_token: int, free: int, on_gpu: bool) -> tuple[int, str]:
    """`auto_batch_tokens`' rule: (tokens, how) from the key/value bytes per token and the free bytes (the GPU's
    free memory, or the available RAM)."""
    if on_gpu:
        tokens = int(AUTO_KV_SHARE * free / per_token)
        how = (f"{AUTO_KV_SHARE:g} x {free / GIB:.1f} GiB free on the GPU after the load / {per_token / 1024:.0f} KiB "
               "of key/value cache per token")
    else:
        tokens = min(CPU_BATCH_TOKENS, int(free / 4 / per_token))
        how = (f"CPU: {CPU_BATCH_TOKENS} or a quarter of {free / GIB:.1f} GiB of available memory / "
               f"{per_token / 1024:.0f} KiB of key/value cache per token, whichever is less")
    low, high = AUTO_BATCH_TOKENS
    return max(low, min(high, tokens)), how


def cuda_memory() -> tuple[int, int] | None:
    """(free, total) bytes of this process's GPU; None without CUDA."""
    import torch

    return tuple(torch.cuda.mem_get_info()) if torch.cuda.is_available() else None


def local_engine(specs: list[JudgeSpec], backend: str) -> str | None:
    """The engine local judges run on (`judgetrain.eval.vllm.resolve_backend`); None without local judges;
    JudgeSpecError when ``vllm`` is asked for and cannot run."""
    if all(s.is_endpoint for s in specs):
        return None
    from judgetrain.eval.vllm import resolve_backend

    try:
        return resolve_backend(backend)
    except RuntimeError as e:
        raise JudgeSpecError(f"--backend {backend}: {e}") from None


def preflight_vllm(specs: list[JudgeSpec], opts, memory: tuple[int, int] | None = None) -> None:
    """Every local judge checked before any model loads when it runs on vLLM: its adapter (`load_plan`) and whether
    its engine fits the GPU (`fit_problem`; ``memory``: (free, total) bytes, by default this process's GPU, and no
    fit check without CUDA: vLLM's CPU build sizes its cache by VLLM_CPU_KVCACHE_SPACE). JudgeSpecError naming the
    judge, the estimate, the budget and what to change."""
    if local_engine(specs, opts.backend) != "vllm":
        return
    from judgetrain.checks.memory import config_json, model_shape

    memory = memory if memory is not None else cuda_memory()
    for spec in (s for s in specs if not s.is_endpoint):
        try:
            plan = load_plan(spec, "vllm", adapter_config(spec))
            shape, _ = model_shape(plan.base)
        except ValueError as e:
            if str(e).startswith("judge "):
                raise JudgeSpecError(str(e)) from None
            logger.warning("judge %s: no memory estimate of its vLLM engine (%s)", spec.name, e)
            continue
        found = config_json(plan.base)
        dtype, context = config_numbers(found[0] if found else {"dtype": "bfloat16"}, opts.dtype, opts.max_length)
        estimate = engine_estimate(shape, dtype, context, adapter_bytes(spec.adapter))
        if memory is None:
            continue
        share = gpu_share(spec, opts)
        problem = fit_problem(spec.name, estimate, share, memory[1], memory[0], context)
        if problem:
            raise JudgeSpecError(problem)
        logger.info("judge %s: its vLLM engine needs about %.1f GiB of the %.1f GiB gpu_memory_utilization %g gives "
                    "it", spec.name, estimate["total"] / GIB, share * memory[1] / GIB, share)


def adapter_bytes(adapter: str | None) -> int:
    """Bytes of an adapter's weight files (0 without one)."""
    if not adapter:
        return 0
    return sum(p.stat().st_size for p in Path(adapter).glob("adapter_model*") if p.is_file())


def engine_weights(plan: LoadPlan, path: str, cfg: dict, opts) -> tuple[Any, int]:
    """(`judgetrain.eval.vllm.VLLMWeights`, context) of a judge whose engine loads its weights from disk."""
    from judgetrain.eval.vllm import VLLMWeights

    dtype, context = config_numbers(cfg, opts.dtype, opts.max_length)
    return VLLMWeights(path, dtype, plan.revision, plan.adapter, plan.lora_rank), context
