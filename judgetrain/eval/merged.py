"""Scoring forwards with each LoRA layer run as one matmul: ``x @ (W + s B A)^T`` instead of ``x @ W^T + s (x A^T) B^T``.

An eval forward has thousands of tokens and the adapter's two extra matmuls (plus PEFT's per-layer bookkeeping) cost
about a third of a small model's layer time; building ``W + s B A`` costs ``out x in x r`` once per layer per scoring
call. Nothing is written into the model: each LoRA layer's ``forward`` is shadowed by an instance attribute for the
duration of the context and the merged weights are temporaries held by it (one copy of the adapted layers' weights:
float32 models only, i.e. small ones), so the base weights (the reference's) and the adapter stay bit for bit what
they were. Scores differ from the unmerged forward by float
rounding only (the engine's equality tests hold it to rtol 1e-4).

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
    if not active or any(a in module.lora_variant or module.lora_bias.get(a, False) for a in active):
        return None
    if any(module.lora_A[a].weight.dtype != torch.float32 for a in active):
        return None
    return active


def _merged_forward(module: torch.nn.Module, adapters: list[str]):
    """A forward with ``W + s B A`` built once for the context (the weights do not change while scoring): one small
    op per layer and forward instead of three, which matters on a busy CPU where every op pays a thread barrier."""
    base = module.base_layer
    with torch.no_grad():
        weight = base.weight
        for a in adapters:
            weight = weight + module.get_delta_weight(a)

    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return F.linear(x, weight, base.bias)

    return forward


@contextlib.contextmanager
def merged_lora(model: torch.nn.Module) -> Iterator[int]:
    """Within the context, LoRA layers of ``model`` that qualify run merged; yields how many do."""
    if any("FullyShardedDataParallel" in type(m).__name__ for m in model.modules()):
        yield 0
        return
    shadowed = []
    try:
        for module in model.modules():
            adapters = _mergeable(module)
            if adapters:
                shadow_forward(module, _merged_forward(module, adapters))
                shadowed.append(module)
        yield len(shadowed)
    finally:
        for module in shadowed:
            restore_forward(module)
