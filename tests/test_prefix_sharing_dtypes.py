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


# Per-token differences as the probe saw them on an H200 (Qwen3-0.6B's layer shape, 4 layers, LoRA, sdpa):
# (chosen mean, chosen max, rejected mean, rejected max).
H200_BF16_ROUNDING = (2.92e-3, 1.17e-2, 3.27e-3, 1.15e-2)
H200_BF16_POSITIONS = (2.92e-3, 1.17e-2, 1.77e-1, 4.40e-1)
H200_TF32_ROUNDING = (3.10e-4, 1.03e-3, 3.17e-4, 1.00e-3)


def _diffs(chosen_mean, chosen_max, rejected_mean, rejected_max, n=40):
    """Per-token differences with the given mean and max: one token at the max, the rest making up the mean."""
    def seg(mean, top):
        rest = (mean * n - top) / (n - 1)
        return torch.tensor([top] + [rest] * (n - 1))
    return seg(chosen_mean, chosen_max), seg(rejected_mean, rejected_max)


@pytest.mark.parametrize(("figures", "dtype", "route"), [
    (H200_BF16_ROUNDING, torch.bfloat16, "control"),  # over the fixed mean bound (1.2e-3): rounding, the control says
    (H200_TF32_ROUNDING, torch.float16, "control"),  # tf32's stand-in dtype: over 1.5e-4
    (H200_BF16_POSITIONS, torch.bfloat16, "failed"),  # the rejected tokens 60x the chosen ones
    ((2.0e-2, 3.0e-2, 2.0e-2, 3.0e-2), torch.bfloat16, "failed"),  # every token off by 2.6 eps: not rounding
    ((1.0e-5, 5.0e-4, 1.2e-5, 6.0e-4), torch.bfloat16, "absolute"),  # CPU's bf16 rounding: within the fixed bounds
    ((1.0e-6, 3.0e-6, 1.4e-3, 5.0e-3), torch.float32, "failed"),  # tiny models' positions fault in fp32
    ((2.9e-3, 1.2e-2, 3.3e-3, 5.0e-2), torch.bfloat16, "failed"),  # one rejected token over 4x the chosen max
])
def test_the_probe_takes_the_chosen_tokens_as_the_measure_of_this_devices_rounding(figures, dtype, route):
    verdict = ps.probe_verdict(*_diffs(*figures), dtype)
    assert verdict.route == route
    assert verdict.ok is (route != "failed")
    assert verdict.chosen_mean == pytest.approx(figures[0], rel=1e-4)
    assert verdict.rejected_max == pytest.approx(figures[3], rel=1e-4)
    assert verdict.mean == pytest.approx((figures[0] + figures[2]) / 2, rel=1e-4)


def _noisy_unpack(unpack, scale):
    """The packed forward's log-probs moved by deterministic noise of mean ``scale`` on every token, chosen and
    rejected alike: a device whose kernels round the packed shapes differently from TRL's."""
    def unpacked(output, packed):
        out = unpack(output, packed)
        g = torch.Generator().manual_seed(0)
        noise = (torch.rand(out.log_probs.shape, generator=g) * 2 * scale).to(out.log_probs.dtype)
        out.log_probs = out.log_probs + noise
        return out
    return unpacked


@pytest.mark.parametrize("fault", [None, "mask"])
def test_rounding_over_the_fixed_bounds_keeps_prefix_sharing_on_and_says_why(tiny_judge, tmp_path, monkeypatch,
                                                                               caplog, fault):
    monkeypatch.setattr(ps, "unpack_output", _noisy_unpack(ps.unpack_output, 3e-3))  # H200's bf16 rounding
    if fault == "mask":
        monkeypatch.setattr(ps.PackedPairs, "attention_mask", _mask_without_the_pair_rule)
    tok = _tokenizer(tiny_judge)
    with caplog.at_level(logging.INFO, logger="judgetrain.trainer.prefix_sharing"):
        trainer = _trainer(JudgeDPOTrainer, _factory("qwen2", tok, torch.bfloat16, tiny_judge), tok, tmp_path,
                           lora=True)
    stats = trainer.prefix_sharing_stats
    assert stats["probe_mean_abs_diff"] > ps.probe_tolerance(torch.bfloat16)[0]
    if fault is None:
        assert trainer.prefix_sharing is True and stats["probe_route"] == "control"
        assert "are this model's rounding on this device" in caplog.text
        assert stats["probe_rejected_mean_abs_diff"] <= ps.CONTROL_RATIO * stats["probe_chosen_mean_abs_diff"]
    else:
        assert trainer.prefix_sharing is False and stats["probe_route"] == "failed"
        assert stats["probe_rejected_mean_abs_diff"] > 3 * ps.CONTROL_RATIO * stats["probe_chosen_mean_abs_diff"]
        assert "against the chosen tokens'" in caplog.text and "does not honour the custom mask" in caplog.text
