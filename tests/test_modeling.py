"""Shared model-loading helpers: the tokenizer always has a pad token; the accelerator check agrees with torch."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from judgetrain.models.loading import load_tokenizer
from judgetrain.utils.device import has_accelerator


def test_load_tokenizer_keeps_a_pad_token_and_gives_eos_to_one_without(tiny_judge, tmp_path):
    assert load_tokenizer(tiny_judge).pad_token == AutoTokenizer.from_pretrained(tiny_judge).pad_token
    bare = AutoTokenizer.from_pretrained(tiny_judge)
    bare.pad_token = None
    bare.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token is None
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.pad_token == tokenizer.eos_token is not None
    assert tokenizer(["a", "a b c"], padding=True)["input_ids"][0][-1] == tokenizer.eos_token_id


def test_has_accelerator_matches_torch():
    """By torch's other route (torch.accelerator: the device type torch would place work on), CUDA / ROCm or XPU."""
    found = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    assert has_accelerator() == (found is not None and found.type in ("cuda", "xpu"))
