"""Prefix sharing in the dtypes recipes train in: bf16 and fp16 weights keep it on (the start-up probe's tolerance
comes from the dtype's rounding), its loss, rewards and gradients equal TRL's own forward within that rounding, and a
mask the attention ignores or position ids that do not restart are still caught by the probe, in every dtype."""

from __future__ import annotations

import logging

import pytest
import torch

import judgetrain.trainer.prefix_sharing as ps
from judgetrain.trainer.dpo import JudgeDPOTrainer
from test_prefix_sharing import _loss_metrics_grads, _random_model, _tokenizer, _trainer

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _factory(kind, tok, dtype, tiny_judge):
    if kind == "qwen2":
        from transformers import AutoModelForCausalLM

        return lambda: AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=dtype)
    return lambda: _random_model(kind, len(tok), "sdpa" if kind == "qwen3" else "eager").to(dtype)


def _mask_without_the_pair_rule(self, dtype):
    """Causal over the packed row: the rejected completion sees the chosen one (an attention that ignores the mask)."""
    n = self.segment.size(1)
    idx = torch.arange(n, device=self.segment.device)
    allowed = ((idx[None, :] <= idx[:, None])[None] & (self.segment[:, None, :] >= 0))[:, None]
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def _positions_without_restart(pack):
    def packed(*args, **kwargs):
        out = pack(*args, **kwargs)
        if not isinstance(out, str):  # an attention that ignores position ids: 0..n-1 along the packed row
            out.position_ids = torch.arange(out.position_ids.size(1)).expand_as(out.position_ids).clone()
        return out
    return packed


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_the_probe_keeps_prefix_sharing_on_in_every_dtype_and_says_by_how_much(tiny_judge, tmp_path, kind, dtype):
    tok = _tokenizer(tiny_judge)
    # fp32 computed in fp32 (DPOConfig's bf16 default would run it under bf16 autocast: the autocast test below)
    mixed = {"bf16": False} if dtype == torch.float32 else {}
    trainer = _trainer(JudgeDPOTrainer, _factory(kind, tok, dtype, tiny_judge), tok, tmp_path, lora=True, **mixed)
    assert trainer.prefix_sharing is True
    mean_tol, max_tol = ps.probe_tolerance(dtype)
    stats = trainer.prefix_sharing_stats
    assert 0 <= stats["probe_mean_abs_diff"] <= mean_tol and stats["probe_max_abs_diff"] <= max_tol


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("fault", ["mask", "positions"])
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_the_probe_catches_a_wrong_mask_or_wrong_positions_in_every_dtype(tiny_judge, tmp_path, monkeypatch, caplog,
                                                                          kind, fault, dtype):
    if fault == "mask":
        monkeypatch.setattr(ps.PackedPairs, "attention_mask", _mask_without_the_pair_rule)
    else:
        monkeypatch.setattr(ps, "pack_pairs", _positions_without_restart(ps.pack_pairs))
    tok = _tokenizer(tiny_judge)
    with caplog.at_level(logging.WARNING, logger="judgetrain.trainer.prefix_sharing"):
        trainer = _trainer(JudgeDPOTrainer, _factory(kind, tok, dtype, tiny_judge), tok, tmp_path, lora=True)
    assert trainer.prefix_sharing is False
    assert "gives different log-probs packed" in caplog.text and "does not honour the custom mask or position ids" in caplog.text


# Gradient differences relative to each gradient's largest entry, in units of the dtype's epsilon, as measured on CPU
# (LoRA, one batch of 3 pairs): bf16 0.40-0.43, fp16 1.4 (Qwen3) and 19 (Qwen2: fp16's small exponent range).
GRAD_EPS = {torch.bfloat16: 4, torch.float16: 32}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_half_precision_training_equals_trls_forward_within_the_dtype_rounding(tiny_judge, tmp_path, kind, dtype):
    from trl import DPOTrainer

    tok = _tokenizer(tiny_judge)
    factory = _factory(kind, tok, dtype, tiny_judge)
    (loss_a, met_a, grad_a) = _loss_metrics_grads(_trainer(DPOTrainer, factory, tok, tmp_path, lora=True))
    trainer = _trainer(JudgeDPOTrainer, factory, tok, tmp_path, lora=True)
    assert trainer.prefix_sharing is True
    (loss_b, met_b, grad_b) = _loss_metrics_grads(trainer)
    assert trainer.prefix_sharing_stats["batches_packed"] > 0
    eps = torch.finfo(dtype).eps
    tol = eps  # one rounding of the dtype, relative (measured: at most 0.01 eps)
    assert abs(loss_b.item() - loss_a.item()) <= tol * max(1.0, abs(loss_a.item()))
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"):
        assert met_b[key] == pytest.approx(met_a[key], rel=tol, abs=tol), key
    assert grad_a and set(grad_a) == set(grad_b)
    for name, g in grad_a.items():
        scale = g.float().abs().max().clamp(min=1e-8)
        assert ((grad_b[name].float() - g.float()).abs().max() / scale).item() <= GRAD_EPS[dtype] * eps, name


@pytest.mark.parametrize("fault", [None, "mask"])
def test_the_probe_runs_under_the_trainings_autocast_with_the_tolerance_of_its_dtype(tiny_judge, tmp_path, monkeypatch,
                                                                                       caplog, fault):
    # fp32 weights under bf16 mixed precision: training computes its matmuls in bf16, and so does the probe
    if fault == "mask":
        monkeypatch.setattr(ps.PackedPairs, "attention_mask", _mask_without_the_pair_rule)
    tok = _tokenizer(tiny_judge)
    with caplog.at_level(logging.WARNING, logger="judgetrain.trainer.prefix_sharing"):
        trainer = _trainer(JudgeDPOTrainer, _factory("qwen2", tok, torch.float32, tiny_judge), tok, tmp_path,
                           lora=True, bf16=True)
    assert trainer.model.get_input_embeddings().weight.dtype == torch.float32
    stats = trainer.prefix_sharing_stats
    assert stats["probe_compute_dtype"] == "bfloat16"
    if fault is None:
        assert trainer.prefix_sharing is True
        assert 0 <= stats["probe_mean_abs_diff"] <= ps.probe_tolerance(torch.bfloat16)[0]
        # bf16 rounding, beyond what fp32 weights' own rounding allows: the weights' dtype would turn it off
        assert stats["probe_max_abs_diff"] > ps.probe_tolerance(torch.float32)[1]
    else:
        assert trainer.prefix_sharing is False
        assert "where bfloat16 rounding allows" in caplog.text and "does not honour the custom mask" in caplog.text


def test_tf32_is_read_whichever_torch_api_set_it():
    # transformers' `tf32: true` sets torch's newer fp32_precision flag (torch >= 2.9), after which the older
    # allow_tf32 / get_float32_matmul_precision raise; the flags are read without a CUDA device
    cuda = torch.device("cuda")
    before = torch.backends.fp32_precision
    try:
        assert ps.compute_dtype(torch.float32, cuda) == (torch.float32, "float32")
        torch.backends.fp32_precision = "tf32"  # as transformers.utils.import_utils.enable_tf32(True) does
        assert ps.compute_dtype(torch.float32, cuda) == (torch.float16, "tf32")
        assert ps.compute_dtype(torch.bfloat16, cuda) == (torch.bfloat16, "bfloat16")
        assert ps.compute_dtype(torch.float32, torch.device("cpu")) == (torch.float32, "float32")
        torch.backends.fp32_precision = "ieee"
        torch.set_float32_matmul_precision("high")  # the older API
        assert ps.compute_dtype(torch.float32, cuda) == (torch.float16, "tf32")
        torch.set_float32_matmul_precision("highest")
        assert ps.compute_dtype(torch.float32, cuda) == (torch.float32, "float32")
    finally:
        torch.backends.fp32_precision = before
