"""The dry run's per-device memory estimate (judgetrain.checks.memory): its figures against peaks measured on this machine
(real DPOTrainer steps, every live tensor storage counted), and the verdict `judgetrain train --dry-run` gives."""

import json
import sys

import pytest
from helpers import dry_run_verdict_holds, run

from judgetrain.bench.memory import check, llama_model_folder as random_model_folder
from judgetrain.checks.memory import BUILTIN_SHAPES, GIB
WITHIN = 0.15


def _check(model_dir, tmp_path, lora_r, checkpointing):
    got = check(model_dir, lora_r=lora_r, checkpointing=checkpointing, output_dir=str(tmp_path / f"m{lora_r}{checkpointing}"))
    assert abs(got["error"]) <= WITHIN, got
    return got["measured_mib"], got["estimated_mib"]


@pytest.mark.slow
@pytest.mark.parametrize("lora_r", [16, None], ids=["lora", "full"])
def test_estimate_is_within_15_percent_of_the_measured_peak_of_the_tiny_judge(tiny_judge, tmp_path, lora_r):
    off = _check(tiny_judge, tmp_path, lora_r, False)
    on = _check(tiny_judge, tmp_path, lora_r, True)
    assert on[0] < off[0] and on[1] < off[1]  # checkpointing saves memory, measured and estimated


@pytest.mark.slow
@pytest.mark.parametrize("lora_r", [16, pytest.param(None, marks=pytest.mark.extended(
    reason="the full fine-tune's estimate on a real architecture; the tiny judge's full case runs by default"))],
    ids=["lora", "full"])
def test_estimate_is_within_15_percent_on_a_real_architecture(tiny_judge, tmp_path_factory, tmp_path, lora_r):
    """SmolLM2-135M's layer shapes (hidden 576, GQA 9/3 heads, SwiGLU 1536, vocab 49152, tied), 2 of its 30
    layers to keep the test short; the full depth is measured in docs/scale.md."""
    model = random_model_folder(BUILTIN_SHAPES["HuggingFaceTB/SmolLM2-135M-Instruct"], tmp_path / "smol2", tiny_judge,
                                layers=2)
    _check(model, tmp_path, lora_r, False)
    _check(model, tmp_path, lora_r, True)


def _dry_run(recipe, *flags, check=True):
    return run([sys.executable, "-m", "judgetrain.cli", "train", recipe, "--dry-run", *flags], check=check,
               env={"OMP_NUM_THREADS": "1"}, timeout=600)


def _report(proc) -> dict:
    out = proc.stdout
    return json.loads(out[out.index("{\n"):])  # after W&B's offline-mode line


def test_dry_run_says_whether_the_zero3_recipe_fits_the_stated_gpu():
    proc = _dry_run("recipes/judgebias_qwen3_8b_full_zero3.yaml", "--gpu", "H100-80GB", "--num_processes", "8",
                    check=False)
    report = _report(proc)
    assert dry_run_verdict_holds(proc.returncode, report), proc.stderr[-3000:]  # no deepspeed, no 8B cache here
    assert report["accelerate"]["deepspeed"]["zero_optimization"]["stage"] == 3  # the config resolved by Accelerate
    mem = report["memory"]
    assert mem["plan"]["parallelism"] == "zero3" and mem["plan"]["processes"] == 8
    assert mem["parameters"] == pytest.approx(8.19e9, rel=0.01)  # Qwen3-8B
    assert mem["shape_from"].startswith(("config.json", "cached hub config", "judgetrain's built-in table"))
    gib = mem["per_device_gib"]
    assert gib["weights"] == pytest.approx(8.19e9 * 2 / 8 / GIB, rel=0.01)  # bf16, sharded over 8
    assert gib["reference_weights"] == 0  # precompute_ref_log_probs: no frozen copy during training
    assert mem["tokens_per_step"] == 4096 * 2 * 8 * 8  # max_length x (chosen + rejected) x accumulation x processes
    assert mem["fits"] is True and mem["peak_gib"] < 79
    assert "Memory per device, zero3 over 8 process(es)" in proc.stderr and "fits H100-80GB" in proc.stderr
    # the AdamW it assumed: the recipe sets no optim, so the Trainer's default, fused, with no step temporaries
    assert mem["optimizer"] == "fused" and mem["per_device_gib"]["optimizer_step_temporaries"] == 0
    assert "AdamW assumed: optim adamw_torch_fused: torch's fused AdamW kernel" in proc.stderr


def test_dry_run_says_a_full_fine_tune_without_sharding_does_not_fit_and_what_would():
    proc = _dry_run("recipes/judgebias_qwen3_8b_full_zero3.yaml", "--gpu", "A100-40GB", "--num_processes", "8",
                    "--accelerate_config", "accelerate_configs/multi_gpu.yaml", "--precompute_ref_log_probs", "false",
                    check=False)
    assert dry_run_verdict_holds(proc.returncode, _report(proc)), proc.stderr[-3000:]
    mem = _report(proc)["memory"]
    assert mem["plan"]["parallelism"] == "ddp"
    assert mem["per_device_gib"]["reference_weights"] == pytest.approx(mem["per_device_gib"]["weights"])
    assert mem["fits"] is False
    assert any(a.startswith("accelerate_configs/zero3.yaml") for a in mem["advice"])
    assert "does NOT fit A100-40GB" in proc.stderr


def test_an_unknown_gpu_is_a_clear_error():
    proc = _dry_run("recipes/quickstart.yaml", "--gpu", "H100-81GB", check=False)
    assert proc.returncode == 2
    assert "--gpu H100-81GB: unknown; one of H100-80GB" in proc.stderr


def test_the_estimate_counts_the_merged_lora_weights_of_an_fp32_eval_within_their_bound():
    """fp32 Llama-3.1-8B with LoRA on every projection: the scoring engine's merged weights are bounded by the cache
    (512 MiB) plus one 4096 x 14336 fp32 projection merged in its forward (224 MiB), not a copy of every adapted
    weight (~28 GB); bf16 layers keep PEFT's forward, and a run with merge_lora off holds none."""
    from judgetrain.checks.memory import MERGED_CACHE_BYTES, Plan, estimate

    shape = BUILTIN_SHAPES["meta-llama/Llama-3.1-8B-Instruct"]
    every = sum(a * b for a, b in shape.adapted_projections(None)) * shape.layers * 4
    assert every / GIB == pytest.approx(26.0, abs=0.1)  # what a copy of each adapted weight would take
    merged = estimate(shape, Plan(weight_bytes=4, lora_r=16, eval_batch_tokens=8192))["eval_merged_lora"]
    assert MERGED_CACHE_BYTES < merged <= MERGED_CACHE_BYTES + 4096 * 14336 * 4
    assert estimate(shape, Plan(weight_bytes=2, lora_r=16))["eval_merged_lora"] == 0
    assert estimate(shape, Plan(weight_bytes=4, lora_r=16, eval_merge_lora=False))["eval_merged_lora"] == 0
    assert estimate(shape, Plan(weight_bytes=4, lora_r=16, eval_batch_tokens=0))["eval_merged_lora"] == 0


def test_every_projection_of_smollm2_is_held_merged_in_float32():
    """SmolLM2-135M, the judge the CPU recipes train, with LoRA on all seven projections: its adapted weights (405 MiB
    in float32) fit the merged cache whole, so generation runs every layer merged (a layer past the cache keeps
    PEFT's forward while decoding); the estimate counts exactly that copy, no layer merged in its forward."""
    from judgetrain.checks.memory import MERGED_CACHE_BYTES, Plan, estimate

    shape = BUILTIN_SHAPES["HuggingFaceTB/SmolLM2-135M-Instruct"]
    every = sum(a * b for a, b in shape.adapted_projections(None)) * shape.layers * 4
    assert every / 2**20 == pytest.approx(405.0, abs=0.1)
    assert every <= MERGED_CACHE_BYTES
    assert estimate(shape, Plan(weight_bytes=4, lora_r=16, eval_batch_tokens=8192))["eval_merged_lora"] == every


def test_lora_saved_activations_of_a_bf16_base_with_the_fp32_adapter():
    """Qwen3-8B, LoRA on every projection, per token per layer: the norms' fp32 inputs (4 x (2 x 4096 + 4096 + 1024)),
    SDPA's q, k, v and output at q's width under a padding mask (2 x 4 x 4096), SwiGLU's gate, up and act (2 x 3 x
    12288), and LoRA's half-precision copy of each adapted input (2 x (5 x 4096 + 4096 + 12288) = 72 KiB), plus a live
    dropout's mask (bool on CUDA, an fp32 noise tensor on CPU); an fp32 base without dropout keeps the shared inputs
    once (its adapter takes the tensor the base layer had)."""
    from judgetrain.checks.memory import Plan, saved_bytes_per_token_layer

    shape = BUILTIN_SHAPES["Qwen/Qwen3-8B"]
    kib = {name: saved_bytes_per_token_layer(shape, plan) / 1024 for name, plan in {
        "bf16": Plan(weight_bytes=2, lora_r=16), "bf16 dropout": Plan(weight_bytes=2, lora_r=16, lora_dropout=0.05),
        "bf16 dropout cpu": Plan(weight_bytes=2, lora_r=16, lora_dropout=0.05, device="cpu"),
        "bf16 no padding": Plan(weight_bytes=2, lora_r=16, padded=False),
        "fp32": Plan(weight_bytes=4, lora_r=16), "bf16 full": Plan(weight_bytes=2)}.items()}
    base = 4 * (2 * 4096 + 4096 + 1024) / 1024 + 2 * 4 * 4096 / 1024 + 2 * 3 * 12288 / 1024
    assert kib["bf16"] == base + 72
    assert kib["bf16 dropout"] == base + 72 + 36 and kib["bf16 dropout cpu"] == base + 72 + 144
    assert kib["bf16 no padding"] == base + 72 - 2 * 2 * (4096 - 1024) / 1024  # SDPA's enable_gqa: k, v at kv width
    norms = 4 * (2 * 4096 + 4096 + 1024) / 1024  # fp32 in either dtype
    assert kib["fp32"] == norms + 2 * (base - norms) + 4 * (2 * 4096 + 12288) / 1024
    # a full fine-tune: the trained norm weights keep the normalised inputs, the projections their inputs
    assert kib["bf16 full"] == base + 2 * (2 * 4096 + 4096 + 1024) / 1024 + 2 * (2 * 4096 + 12288) / 1024


# Five peaks torch.cuda.max_memory_allocated measured on an H200 (torch 2.11, CUDA 13.0, transformers 5.24, TRL 1.16)
# for two DPOTrainer steps of random Qwen3-shaped models in bf16, batch 1, 2,017 tokens a sequence (scripts/gpu_check.py
# with words=1000; the Trainer's default adamw_torch_fused), as docs/scale.md reports them: two in MiB; the other three
# "within 1%" of the estimate then in use, which the test takes with that 1% as their uncertainty.
H200_PEAKS = [  # (shape, lora_r, checkpointing, measured MiB, uncertainty)
    ("qwen3-0.6b", 16, True, 2415, 0.0), ("qwen3-0.6b", None, False, 13516, 0.0),
    ("qwen3-0.6b", 16, False, 9265.3, 0.01), ("qwen3-0.6b", None, True, 6125.5, 0.01),
    ("qwen3-1.7b", None, True, 17259.5, 0.01)]


@pytest.mark.parametrize("case", H200_PEAKS, ids=lambda c: f"{c[0]}-{'lora' if c[1] else 'full'}-ckpt{int(c[2])}")
def test_the_estimate_is_within_10_percent_of_each_peak_the_h200_measured(case):
    """The H200's worked cases: the estimate within 10% of the measured peak (the band gpu_check holds it to), the
    measured figure's own uncertainty added. Before the account of where memory goes, two of them were 15.5% and
    17% low (2,040 and 11,223 MiB)."""
    from judgetrain.bench.gpu import REAL_SHAPES
    from judgetrain.checks.memory import Plan, estimate, shape_from_config

    name, lora_r, ckpt, measured, unsure = case
    shape = shape_from_config({**REAL_SHAPES[name], "model_type": "qwen3"})
    est = estimate(shape, Plan(weight_bytes=2, lora_r=lora_r, batch=1, seq_len=2017, checkpointing=ckpt,
                               eval_batch_tokens=0, device="cuda", padded=False, optimizer="fused"))
    error = est["peak"] / 2**20 / measured - 1
    assert abs(error) <= 0.10 + unsure, (case, est["peak"] / 2**20)
    assert est["peak_phase"] == "policy forward/backward"


def test_the_full_fine_tunes_excess_on_the_h200_is_what_its_layers_save():
    """The full fine-tune without checkpointing measured 2,293 MiB over the old estimate. Its layers save 70 KiB per
    token each (the norms' fp32 inputs, Qwen3's q/k norms, the trained norm weights' normalised inputs), not the
    50 KiB the old per-layer constant gave: over 28 layers and 4,034 tokens that is 2,206 MiB of the 2,293."""
    from judgetrain.bench.gpu import REAL_SHAPES
    from judgetrain.checks.memory import Plan, saved_bytes_per_token_layer, shape_from_config

    shape = shape_from_config({**REAL_SHAPES["qwen3-0.6b"], "model_type": "qwen3"})
    per_layer = saved_bytes_per_token_layer(shape, Plan(weight_bytes=2, padded=False))
    assert per_layer == 70 * 1024
    old = 2 * (9 * 1024 + 4 * 1024 + 4 * 3072)
    assert (per_layer - old) * 28 * 4034 / 2**20 == pytest.approx(2206, abs=1)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_a_layers_saved_bytes_are_what_autograd_saves(arch, dtype, lora):
    """The per-layer account against the tensors autograd really saves (saved-tensor hooks, parameters left out):
    Qwen3-0.6B's layer widths (q 2,048 wide against hidden 1,024, GQA 16/8 heads, q/k norms) as Qwen3 and as Llama (no
    q/k norms), bf16 under autocast (PEFT's fp32 adapter) and fp32, LoRA r=16 on every projection and full; the
    difference between 2 layers and 1, per token, within 2% (the rest: rotary tables, 1/rms, LoRA's r-wide
    intermediates)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    from judgetrain.bench.gpu import REAL_SHAPES
    from judgetrain.checks.memory import Plan, saved_bytes_per_token_layer, shape_from_config

    tokens, torch_dtype = 2 * 512, getattr(torch, dtype)  # LoRA casts its weights once a layer: 0.7 KiB a token here

    def saved(layers: int) -> int:
        cfg = {**REAL_SHAPES["qwen3-0.6b"], "num_hidden_layers": layers, "vocab_size": 256}
        torch.manual_seed(0)
        config = Qwen3Config(**cfg) if arch == "qwen3" else LlamaConfig(**cfg)
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype, attn_implementation="sdpa")
        if lora:
            model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear", lora_dropout=0.0))
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        storages = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                storages[storage.data_ptr()] = storage.nbytes()
            return t

        inner = model.get_base_model().model if lora else model.model
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            inner(input_ids=torch.randint(0, 256, (2, tokens // 2)))
        return sum(storages.values())

    measured = (saved(2) - saved(1)) / tokens
    shape = shape_from_config({**REAL_SHAPES["qwen3-0.6b"], "model_type": arch})
    counted = saved_bytes_per_token_layer(shape, Plan(weight_bytes=torch_dtype.itemsize, lora_r=16 if lora else None,
                                                      padded=False))
    assert counted == pytest.approx(measured, rel=0.02), (measured, counted)


def test_the_optimizer_steps_temporaries_are_those_of_its_implementation():
    """torch's AdamW step on CPU with every tensor counted: fused allocates nothing beyond parameters, gradients and
    state; foreach one tensor the size of every parameter (the square root of exp_avg_sq); the per-parameter loop the
    previous denominator beside the current square root and quotient (here 1 + 3 + 3 = 7 of the 7 million numbers:
    at most 3 x the largest). The estimate counts the same, and takes the implementation as the Trainer and torch
    choose it from the recipe's optim."""
    import torch

    from judgetrain.bench.memory import LiveTensorBytes
    from judgetrain.checks.memory import ModelShape, Plan, optimizer_implementation, optimizer_step_temporaries

    extra = {}
    implementations = {"fused": {"fused": True}, "foreach": {"foreach": True}, "per-parameter": {"foreach": False}}
    for impl, flags in implementations.items():
        params = [torch.nn.Parameter(torch.randn(n, 1000)) for n in (1000, 1000, 1000, 1000, 3000)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, **flags)
        opt.step()  # the state exists from here on
        tracker = LiveTensorBytes()
        for t in params + [p.grad for p in params] + [v for s in opt.state.values() for v in s.values()]:
            tracker.track(t)
        before = tracker.current
        with tracker:
            opt.step()
        extra[impl] = (tracker.peak - before) / 4
    assert extra == {"fused": 0, "foreach": 7_000_000, "per-parameter": 7_000_000}
    shape = ModelShape(1000, 3000, 1, 1, 1, 1000, 1000, True)  # largest trained tensor: 3000 x 1000
    assert [optimizer_step_temporaries(shape, Plan(optimizer=impl), 7_000_000, 4, 1) for impl in extra] == \
        [0, 7_000_000 * 4, 3 * 3_000_000 * 4]
    assert optimizer_implementation("adamw_torch_fused")[0] == "fused"  # the Trainer's default since torch 2.8
    assert optimizer_implementation("adamw_torch", "cuda")[0] == "foreach"
    assert optimizer_implementation("adamw_torch", "cpu")[0] == "per-parameter"
    assert optimizer_implementation("adamw_bnb_8bit")[0] == "foreach"  # not torch's: counted as the most


@pytest.mark.slow
def test_foreach_adamw_raises_a_full_fine_tunes_peak_by_one_copy_of_its_parameters_as_estimated(tiny_judge, tmp_path):
    """Real DPOTrainer steps on CPU, every tensor counted, Qwen3-0.6B's layer widths (2 layers, the tokenizer's
    vocabulary), a full bf16 fine-tune with checkpointing on 37-token sequences, so that the optimizer's step is the
    peak: the Trainer's fused AdamW, then foreach forced (what adamw_torch runs on CUDA) and the per-parameter loop
    (adamw_torch on CPU). Foreach adds one bf16 copy of the trained parameters (57 MiB) to the measured peak; the
    estimate of each is within 2%."""
    from judgetrain.bench.gpu import random_model_folder as qwen3_model_folder

    model = qwen3_model_folder("qwen3-0.6b", tiny_judge, tmp_path / "q", layers=2, vocab=1)
    got = {impl: check(model, lora_r=None, checkpointing=True, bf16=True, words=10, optimizer=impl,
                       output_dir=str(tmp_path / impl)) for impl in ("fused", "foreach", "per-parameter")}
    for impl, g in got.items():
        assert abs(g["error"]) <= 0.02, g
    assert got["foreach"]["estimated_phase"] == "optimizer step"
    trained = got["foreach"]["measured_mib"] - got["fused"]["measured_mib"]
    assert 50 <= trained <= 60, got  # 2 layers of 15.7 M and the 2,048 x 1,024 embedding, 2 bytes each: 57 MiB


@pytest.mark.slow
@pytest.mark.parametrize("lora_r", [16, None], ids=["lora", "full"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
def test_the_estimate_at_qwen3_layer_widths_is_within_10_percent_of_the_cpu_peak(tiny_judge, tmp_path, lora_r,
                                                                                   checkpointing):
    """The H200's four Qwen3-0.6B cases at the same layer widths on CPU (2 layers, the tokenizer's vocabulary, 417
    tokens a sequence, bf16, the Trainer's fused AdamW), every tensor counted: within 10% (measured: +0.5%, -0.4%,
    +8.9%, +5.8%: with checkpointing the CPU's LM-head tiles and the reference pass weigh most at 2 layers)."""
    from judgetrain.bench.gpu import random_model_folder as qwen3_model_folder

    model = qwen3_model_folder("qwen3-0.6b", tiny_judge, tmp_path / "q", layers=2, vocab=1)
    got = check(model, lora_r=lora_r, checkpointing=checkpointing, bf16=True, words=200,
                output_dir=str(tmp_path / "out"))
    assert got["seq_len"] == 417 and abs(got["error"]) <= 0.10, got


def test_a_verdict_with_less_spare_than_the_estimates_margin_says_tight():
    """Fits, but with under 10% of the peak to spare: the report says tight, and by how much."""
    from judgetrain.checks.memory import ESTIMATE_MARGIN, GPUS, Plan, report

    shape = BUILTIN_SHAPES["Qwen/Qwen3-8B"]
    plans = {batch: report(shape, "table", Plan(weight_bytes=2, lora_r=16, batch=batch, seq_len=4096,
                                                checkpointing=True), "A10-24GB") for batch in (1, 2, 4)}
    assert ESTIMATE_MARGIN == 0.10
    for got in plans.values():
        peak = got["peak_gib"]
        assert got["tight"] == (got["fits"] and GPUS["A10-24GB"] / GIB - peak < 0.1 * peak)
        assert got["margin_gib"] == pytest.approx(0.1 * peak, abs=0.01)
    assert any(g["tight"] for g in plans.values()) or any(not g["fits"] for g in plans.values())


@pytest.mark.parametrize("hidden", [256, pytest.param(512, marks=pytest.mark.extended(
    reason="the same estimate at twice the width; 256 runs by default"))])
def test_estimate_of_a_bf16_lora_step_with_live_dropout_is_within_15_percent_above_the_measured_peak(
        tiny_judge, tmp_path, hidden):
    """The recipes' LoRA setup (bf16 weights and autocast, PEFT's fp32 adapter, lora_dropout 0.05 with TRL's
    disable_dropout off) at two small Llama shapes, 2 layers, 617 tokens a sequence: the estimate is never below the
    measured peak and at most 15% above it."""
    from judgetrain.checks.memory import ModelShape

    shape = ModelShape(hidden, 3 * hidden, 2, hidden // 64, 2, 64, 2048, True)
    model = random_model_folder(shape, tmp_path / "m", tiny_judge)
    got = check(model, lora_r=16, checkpointing=False, bf16=True, lora_dropout=0.05, words=300,
                output_dir=str(tmp_path / "out"))
    assert got["seq_len"] == 617 and 0 <= got["error"] <= WITHIN, got


def test_zero3_generation_gathers_whole_only_when_the_full_weights_and_a_fifth_fit_the_free_memory():
    """eval_generate_zero3_gather: auto: Qwen3-8B's 8.19e9 bf16 weights (16.4 GB) with the 20 % margin need 19.7 GB
    free; on CPU (free memory unknown) generation gathers as it always did."""
    from judgetrain.trainer.parallelism import ZERO3_GATHER_HEADROOM, zero3_gather_fits

    assert ZERO3_GATHER_HEADROOM == 0.2
    assert zero3_gather_fits(8_190_000_000, 2, 20e9) is True
    assert zero3_gather_fits(8_190_000_000, 2, 19e9) is False
    assert zero3_gather_fits(8_190_000_000, 2, 9.8e9) is False
    assert zero3_gather_fits(8_190_000_000, 4, 20e9) is False  # fp32: 32.8 GB
    assert zero3_gather_fits(1000, 2, 2400) is True and zero3_gather_fits(1000, 2, 2399) is False  # the edge
    assert zero3_gather_fits(1000, 2, 2000, headroom=0.0) is True
    assert zero3_gather_fits(8_190_000_000, 4, None) is True  # unknown: gather


def test_the_estimate_counts_the_whole_gathered_model_in_the_eval_when_zero3_generation_gathers_it():
    """Generate mode under ZeRO-3 over 8 devices: gathering the whole model adds the full bf16 weights to the eval's
    peak in place of the two gathered layers; never (and auto where they do not fit the device) counts the layers."""
    from judgetrain.checks.memory import GPUS, Plan, estimate, report

    shape = BUILTIN_SHAPES["Qwen/Qwen3-8B"]
    base = dict(processes=8, parallelism="zero3", weight_bytes=2, lora_r=None, mixed_precision_master=True,
                seq_len=4096, precompute_ref=True)
    layers, always, never = (estimate(shape, Plan(**base, eval_generate_zero3_gather=mode))
                             for mode in ("", "always", "never"))
    full = shape.params() * 2
    assert always["eval_gathered"] == "whole model" and never["eval_gathered"] == layers["eval_gathered"] == "2 layers"
    assert always["eval_gathered_weights"] == full and never["eval_gathered_weights"] == layers["gathered_layers"]
    # the eval's peak grew by the full weights less the two layers it counted before
    assert always["eval_peak"] - layers["eval_peak"] == full - layers["gathered_layers"]
    assert never["eval_peak"] == layers["eval_peak"]
    assert never["peak"] == layers["peak"] <= always["peak"]
    # auto: the device decides (no device: counted as gathering); the dry run's report says which was counted
    auto = Plan(**base, eval_generate_zero3_gather="auto")
    assert estimate(shape, auto)["eval_gathered"] == "whole model"
    assert estimate(shape, auto, GPUS["H100-80GB"])["eval_gathered"] == "whole model"
    assert estimate(shape, auto, GPUS["A10-24GB"])["eval_gathered"] == "2 layers"
    assert report(shape, "table", auto, "A10-24GB")["eval_gathered"] == "2 layers"
    assert report(shape, "table", auto, "H100-80GB")["eval_gathered"] == "whole model"
