"""Small helpers every entry point shares when it loads a model: the tokenizer, and which device is there."""

from __future__ import annotations

import os


def load_tokenizer(path: str | os.PathLike, *, trust_remote_code: bool = False):
    """``AutoTokenizer.from_pretrained(path)`` with a pad token: batched scoring and DPO collation pad, and many
    causal LMs ship without one, so the end-of-sequence token stands in (as TRL's own scripts do). A chat template
    that reads today's date gets a fixed one (`judgetrain.models.templates.pin_template_date`)."""
    from transformers import AutoTokenizer

    from judgetrain.models.templates import pin_template_date

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    pin_template_date(tokenizer)  # a template that reads the clock would change tokens (and scores) every day
    return tokenizer


def has_accelerator() -> bool:
    """True when torch sees a CUDA (or ROCm) or XPU device; without one, accelerate must be told ``cpu=True``."""
    import torch

    xpu = getattr(torch, "xpu", None)
    return torch.cuda.is_available() or (xpu is not None and xpu.is_available())
