"""Scoring forwards with each LoRA layer run as one matmul: ``x @ (W + s B A)^T`` instead of ``x @ W^T + s (x A^T) B^T``.

An eval forward has thousands of tokens and the adapter's two extra matmuls (plus PEFT's per-layer bookkeeping) cost
about a third of a small model's layer time; building ``W + s B A`` costs ``out x in x r``, against the forward's
``tokens x out x in``. Nothing is written into the model: each LoRA layer's ``forward`` is shadowed by an instance
attribute for the duration of the context, so the base weights (the reference's) and the adapter stay bit for bit what
they were, whatever happens inside the context. Scores differ from the unmerged forward by float rounding only (the
engine's equality tests hold it to rtol 1e-4).

The merged weights are temporaries, and their memory is bounded: layers are merged once for the whole context while
their merged weights fit ``cache_bytes`` (``MERGED_CACHE_BYTES``, 512 MiB: every adapted layer of a small model, such
as SmolLM2-135M's 405 MiB in float32), and every further layer builds ``W + s B A`` in its own forward and frees it on
return (one layer's weight at a time: 224 MiB for Llama-3.1-8B's fp32 MLP projections, instead of a copy of every
adapted weight, ~28 GB). An in-place merge
(``W += s B A``, undone after) would hold nothing at all but cannot be undone bit for bit in float arithmetic without a
copy of ``W``, and the reference (the same weights with the adapter disabled) must stay exact; merging in the forward
keeps the weights untouched at a cost of ``r / tokens`` of the layer's matmul. The memory estimate counts the bound
(`judgetrain.checks.memory.merged_extra_bytes`, where the constant lives).

A layer keeps PEFT's own forward unless every active adapter is plain LoRA on an ``nn.Linear`` with float32 weights
held as ordinary tensors: DoRA and other variants, LoRA bias, half-precision weights (a merged bf16 weight rounds the
adapter's contribution), quantised, FSDP / DTensor or DeepSpeed-partitioned weights are left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from judgetrain.compat.peft import lora_linear_type, restore_forward, shadow_forward
from judgetrain.config.recipe import MERGED_CACHE_BYTES


def _mergeable(module: torch.nn.Module) -> list[str] | None:
    """The active adapters of a PEFT LoRA Linear that can run merged, or None."""
    lora_linear = lora_linear_type()
    if lora_linear is None or type(module) is not lora_linear or module.disable_adapters or module.merged:
        return None
    base = module.base_layer
    if type(base) is not torch.nn.Linear or type(base.weight.data) is not torch.Tensor or hasattr(base.weight, "ds_id"):
        return None
    if base.weight.dtype != torch.float32:
        return None
    active = [a for a in module.active_adapters if a in module.lora_A]
    if not active or getattr(module, "fan_in_fan_out", False) or any(
            a in module.lora_variant or module.lora_bias.get(a, False) for a in active):
        return None
    if any(module.lora_A[a].weight.dtype != torch.float32 for a in active):
        return None
    return active


def _merged_weight(module: torch.nn.Module, adapters: list[str]) -> torch.Tensor:
    """``W + sum_a s_a B_a A_a``: one new tensor of the weight's size (``addmm`` adds in place of a delta)."""
    weight = module.base_layer.weight
    with torch.no_grad():
        for a in adapters:
            weight = torch.addmm(weight, module.lora_B[a].weight, module.lora_A[a].weight, alpha=module.scaling[a])
    return weight


def _merged_forward(module: torch.nn.Module, adapters: list[str], held: bool):
    """A forward through ``W + s B A``: built once for the context when ``held`` (the weights do not change while
    scoring; one small op per layer and forward instead of three, which matters on a busy CPU where every op pays a
    thread barrier), else built in each call and freed on return."""
    base = module.base_layer
    if held:
        weight = _merged_weight(module, adapters)

        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            return F.linear(x, weight, base.bias)
    else:
        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            return F.linear(x, _merged_weight(module, adapters), base.bias)

    return forward


@contextlib.contextmanager
def merged_lora(model: torch.nn.Module, cache_bytes: int = MERGED_CACHE_BYTES,
                per_forward: bool = True) -> Iterator[int]:
    """Within the context, LoRA layers of ``model`` that qualify run merged; yields how many do. The layers merged
    for the whole context hold at most ``cache_bytes``; the others merge in their forward (``per_forward``), or keep
    PEFT's forward when ``per_forward`` is False: generation's decode steps feed one token per row, where building
    ``W + s B A`` (``out x in x r``) costs as much as the layer's matmul itself."""
    if any("FullyShardedDataParallel" in type(m).__name__ for m in model.modules()):
        yield 0
        return
    shadowed, held = [], 0
    try:
        for module in model.modules():
            adapters = _mergeable(module)
            if adapters:
                weight = module.base_layer.weight
                keep = held + weight.numel() * weight.element_size() <= cache_bytes
                held += weight.numel() * weight.element_size() if keep else 0
                if not keep and not per_forward:
                    continue
                shadow_forward(module, _merged_forward(module, adapters, keep))
                shadowed.append(module)
        yield len(shadowed)
    finally:
        for module in shadowed:
            restore_forward(module)
