"""The `--device cuda` part: real shapes (Qwen3-0.6B / Qwen3-8B, random init, bf16), tokens per second and MFU against
a measured matmul rate, the engine's prefix sharing on against off, generation on the static against the dynamic
key/value cache with `--batch_tokens auto`'s choice, and the prefix-sharing trainer against TRL's on a real shape.
"""

# Late imports: torch, peft, transformers, judgetrain.eval, judgetrain.judge, judgetrain.models (inside the functions
# that use them): each benchmark part loads only what it measures, and a timed side's imports are part of what it
# times.

from __future__ import annotations

import argparse
import logging
import time
import types
from pathlib import Path
from typing import Any

from judgetrain.bench.common import alternating, median, ratio
from judgetrain.bench.train import TrainBench, bench_train_shapes
from judgetrain.checks.memory import ModelShape, Plan, estimate
from judgetrain.compat.trl import chunked_logprobs

logger = logging.getLogger(__name__)


# Typed in from the public config.json of Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B and Qwen/Qwen3-8B (no download).
REAL_SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # for checking the code path on a CPU (tests)
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=1024,
                 rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
}


def flops_per_token(shape: dict, seq_len: int) -> dict[str, float]:
    """Model FLOPs per token (PaLM-style MFU accounting, recomputation not counted).

    N = matmul parameters a token passes through: per layer q (h*dq), k and v (h*dkv each), o (dq*h), MLP (3*h*I),
    plus the LM head (h*V; counted even when tied to the embedding, since it is a matmul; the input embedding is a
    lookup and is not counted). dq = heads*head_dim, dkv = kv_heads*head_dim.
    forward            F  = 2*N + 4*L*dq*S          (attention scores QK^T and P@V, full S x S, no causal discount)
    LoRA backward      B  = 2*N + 8*L*dq*S          (activation gradients only: frozen weights need no dW; attention
                                                     backward is twice its forward; LoRA's own matmuls are <1%)
    DPO LoRA step      T  = F (policy) + B (policy) + F (reference, adapter off) per token of chosen and rejected
    The 'full backward' convention (B = 2F, as for full fine-tuning: 6N per token) is reported beside it.
    """
    h, L, V = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    hd = shape.get("head_dim") or h // shape["num_attention_heads"]
    dq, dkv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd
    n_layer = h * dq + 2 * h * dkv + dq * h + 3 * h * shape["intermediate_size"]
    N = L * n_layer + h * V
    attn = 4 * L * dq * seq_len
    fwd = 2 * N + attn
    bwd_lora = 2 * N + 2 * attn
    return {"params_matmul": N, "forward": fwd, "backward_lora": bwd_lora,
            "dpo_lora_step": 2 * fwd + bwd_lora, "dpo_full_backward_convention": 4 * fwd}


def measure_matmul_rate(device: str, dtype, n: int = 8192, seconds: float = 3.0) -> float:
    """Dense matmul FLOP/s of this device in ``dtype`` (a torch.matmul loop on n x n operands)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        torch.matmul(a, b)
    sync()
    iters, t0 = 0, time.perf_counter()
    while True:
        for _ in range(10):
            torch.matmul(a, b)
        iters += 10
        sync()
        if time.perf_counter() - t0 > seconds:
            break
    return 2 * n**3 * iters / (time.perf_counter() - t0)


def device_bench_shape(name: str, device: str, dtype, seq_len: int, pairs: int, steps: int, warmup: int,
                       eval_batch: int, peak_flops: float, checkpointing: bool = True) -> dict:
    """LoRA DPO steps (policy forward + backward on chosen and rejected, reference forward with the adapter
    disabled, sigmoid loss, AdamW on the adapter) and the eval forward (policy + reference, last-token logits kept
    only for the response) on a random-init model of a real shape. As the recipes train: activation checkpointing
    (``checkpointing``) and TRL's chunked LM-head log-probs (no [tokens x vocab] logits, no entropy), so the default
    shapes fit an 80 GB card (the dry run's estimate for the same step is in the result, beside the measured peak)."""
    import torch

    shape = REAL_SHAPES[name]
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t_setup = time.perf_counter()
    model = _lora_model(shape, device, dtype, checkpointing)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, shape["vocab_size"], (2 * pairs, seq_len), generator=gen).to(device)
    prompt = seq_len // 2
    step, opt = _dpo_step(model, ids, prompt, pairs)
    model.train()
    setup_s = time.perf_counter() - t_setup
    train_s = _timed(step, warmup, steps, sync)
    fl = flops_per_token(shape, seq_len)
    train_tps = steps * ids.numel() / train_s
    out: dict[str, Any] = {
        "shape": shape, "seq_len": seq_len, "pairs_per_step": pairs, "steps": steps, "setup_s": setup_s,
        "flops_per_token": fl,
        "train_tokens_per_s": train_tps,
        "train_mfu": train_tps * fl["dpo_lora_step"] / peak_flops,
        "train_mfu_full_backward_convention": train_tps * fl["dpo_full_backward_convention"] / peak_flops,
        "checkpointing": checkpointing,
        "train_peak_estimated_mb": _estimated_peak(shape, pairs, seq_len, checkpointing) / 2**20,
    }
    if cuda:
        out["train_peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    opt.zero_grad(set_to_none=True)
    del opt, step
    out.update(_eval_forward(model, ids, eval_batch, keep=seq_len - prompt + 1, steps=steps, sync=sync, cuda=cuda))
    out["eval_mfu"] = out["eval_tokens_per_s"] * fl["forward"] / peak_flops
    del model
    return out


def _lora_model(shape: dict, device: str, dtype, checkpointing: bool):
    """A random-init Qwen3 of ``shape`` with LoRA r=16 on every projection, as the recipes adapt it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(**shape, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"]))
    model.config.use_cache = False
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model


def _dpo_step(model, ids, prompt: int, pairs: int):
    """One DPO step over ``ids`` (chosen rows, then rejected; the tokens after ``prompt`` scored) and its optimizer:
    reference log-probs with the adapter off, policy log-probs, sigmoid loss, backward, AdamW."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    backbone, head = model.get_base_model().model, model.get_output_embeddings()
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, prompt:] = True
    scored = mask[:, 1:]
    row = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(scored)[scored]

    def seq_logps():
        hidden = backbone(input_ids=ids).last_hidden_state[:, :-1][scored]
        lp = chunked_logprobs(hidden, head.weight, ids[:, 1:][scored])
        return torch.zeros(ids.shape[0], device=ids.device, dtype=lp.dtype).index_add(0, row, lp)

    def step():
        with torch.no_grad(), model.disable_adapter():
            ref = seq_logps()
        pol = seq_logps()
        ratio_ = (pol - ref) * 0.1
        loss = -F.logsigmoid(ratio_[:pairs] - ratio_[pairs:]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, opt


def _timed(fn, warmup: int, steps: int, sync) -> float:
    """Seconds of ``steps`` calls of ``fn`` after ``warmup`` untimed ones, the device synchronised at both ends."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return time.perf_counter() - t0


def _estimated_peak(shape: dict, pairs: int, seq_len: int, checkpointing: bool) -> float:
    """The memory estimate's peak bytes for the same LoRA step on one device."""
    return estimate(ModelShape(shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"],
                               shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"],
                               shape["vocab_size"], shape["tie_word_embeddings"]),
                    Plan(processes=1, parallelism="single", weight_bytes=2, lora_r=16, batch=pairs, seq_len=seq_len,
                         checkpointing=checkpointing, eval_batch_tokens=0, device="cuda"))["peak"]


def _eval_forward(model, ids, eval_batch: int, *, keep: int, steps: int, sync, cuda: bool) -> dict:
    """The eval forward (policy + reference, the response's logits kept) over ``eval_batch`` rows: tokens/s and,
    on CUDA, the peak memory."""
    import torch

    model.eval()
    reps = (eval_batch + ids.shape[0] - 1) // ids.shape[0]
    eval_ids = ids[:eval_batch] if eval_batch <= ids.shape[0] else ids.repeat(reps, 1)[:eval_batch]

    def forward_pair():
        with torch.inference_mode():
            model(input_ids=eval_ids, logits_to_keep=keep)
            with model.disable_adapter():
                model(input_ids=eval_ids, logits_to_keep=keep)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    n = max(steps, 2)
    eval_s = _timed(forward_pair, 1, n, sync)
    out = {"eval_tokens_per_s": 2 * n * eval_ids.numel() / eval_s}  # policy and reference forwards
    if cuda:
        out["eval_peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


# eval sets of the device bench as (rows, prompt tokens, responses per row, tokens per response)
DEVICE_EVAL_SETS = {"judgebias": (32, 768, 2, 256), "rmbench": (16, 128, 6, 512)}


def device_bench_eval_sharing(name: str, device: str, dtype, repeats: int = 2, sets: dict | None = None) -> dict:
    """The scoring engine's first-epoch work (policy + reference with the adapter disabled) on a random-init model of
    a real shape, prefix sharing on against off, on JudgeBias-shaped rows (prompt 3x each evaluation) and RM-Bench-
    shaped rows (a short prompt, 6 long responses); random token ids, so no tokenizer is needed."""

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    from judgetrain.eval.scoring import ScoringEngine
    from judgetrain.eval.sequences import TokenSequence

    shape = REAL_SHAPES[name]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**shape, attn_implementation="sdpa"), dtype=dtype)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                             target_modules="all-linear", init_lora_weights=False))
    model.eval()
    pad = types.SimpleNamespace(pad_token_id=0, eos_token_id=0)
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}
    for set_name, (rows, prompt_len, n_resp, resp_len) in (sets or DEVICE_EVAL_SETS).items():
        seqs = []
        for r in range(rows):
            prompt = torch.randint(1, shape["vocab_size"], (prompt_len,), generator=gen).tolist()
            for slot in range(n_resp):
                resp = torch.randint(1, shape["vocab_size"], (resp_len,), generator=gen).tolist()
                seqs.append(TokenSequence(r, slot, prompt + resp, prompt_len))
        times: dict[bool, list[float]] = {True: [], False: []}
        values, tokens = {}, {}
        for i, warm, order in alternating(1, repeats, [True, False]):
            for share in order:
                engine = ScoringEngine(model, pad, prefix_sharing=share, max_length=prompt_len + resp_len + 1)
                sync()
                t0 = time.perf_counter()
                with torch.inference_mode():
                    with engine._policy_forwards(model):
                        policy, _ = engine._score_sequences(model, seqs, False, False)
                    with model.disable_adapter():
                        ref, _ = engine._score_sequences(model, seqs, False, False)
                sync()
                if not warm:
                    times[share].append(time.perf_counter() - t0)
                values[share] = [policy[k] - ref[k] for k in sorted(policy)]
                tokens[share] = engine.stats.padded_tokens / len(seqs)
        diffs = [abs(a - b) / max(abs(b), 1.0) for a, b in zip(values[True], values[False])]
        shared_s, whole_s = median(times[True]), median(times[False])
        out[set_name] = {"rows": rows, "prompt_tokens": prompt_len, "responses_per_row": n_resp,
                         "tokens_per_response": resp_len, "shared_s": shared_s, "whole_s": whole_s,
                         "speedup": ratio(whole_s, shared_s), "responses_per_s": len(seqs) / shared_s,
                         "computed_tokens_per_response": {"shared": tokens[True], "whole": tokens[False]},
                         "max_rel_score_diff": max(diffs)}
    del model
    return out


def random_model_folder(name: str, tokenizer_dir: str, out: Path, *, layers: int | None = None,
                        vocab: int | None = None) -> str:
    """A random-init model of a real shape saved with a small tokenizer (its ids are valid in the larger vocabulary),
    so the train workers can load it as they load any model folder. ``layers`` / ``vocab``: fewer layers, or the
    tokenizer's vocabulary in place of the shape's (checks on a CPU of the per-layer terms at a real layer width)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    if (out / "config.json").is_file():
        return str(out)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    shape = {**REAL_SHAPES[name], "num_hidden_layers": layers or REAL_SHAPES[name]["num_hidden_layers"]}
    config = Qwen3Config(**{**shape, "vocab_size": max(vocab or shape["vocab_size"], len(tokenizer))})
    config.architectures = ["Qwen3ForCausalLM"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)


def bench_device_prefix_sharing(cfg: argparse.Namespace, tb: TrainBench, workdir: Path,
                                peak_flops: float | None = None) -> dict:
    """TRL's DPOTrainer against JudgeDPOTrainer on a real shape (bf16, LoRA, sdpa), both row shapes; with
    ``peak_flops`` (the device's measured matmul rate) each side's MFU: the model FLOPs of the pairs it trained (TRL's
    tokens, the work both sides do for the same loss) per second over that rate."""
    out = {}
    for name in cfg.prefix_sharing_shapes:
        folder = random_model_folder(name, tb.model_path, workdir / f"model-{name}")
        out[name] = bench_train_shapes(cfg, tb, workdir / name, model_path=folder,
                                       dpo_extra={"bf16": cfg.device == "cuda", "use_cpu": cfg.device != "cuda"})
        if peak_flops:
            for rows in out[name].values():
                add_train_mfu(rows, REAL_SHAPES[name], peak_flops)
    return out


def add_train_mfu(rows: dict, shape: dict, peak_flops: float) -> None:
    """``mfu`` of each side of a train_shapes result: samples/s x the pair's model FLOPs (chosen and rejected
    sequences of TRL's length, `flops_per_token`'s DPO LoRA step) over ``peak_flops``."""
    seq = rows["tokens_per_response"]["trl"]
    per_pair = 2 * seq * flops_per_token(shape, int(seq))["dpo_lora_step"]
    for side in ("trl", "prefix_sharing"):
        rows[side]["mfu"] = rows[side]["samples_per_s"] * per_pair / peak_flops
    rows["mfu_ratio"] = ratio(rows["prefix_sharing"]["mfu"], rows["trl"]["mfu"])


def device_bench_generation(name: str, device: str, dtype, tokenizer_dir: str, workdir: Path, *, prompts: int = 16,
                            prompt_words: int = 60, new_tokens: int = 64) -> dict:
    """`judgetrain.eval.generate.Generator` (greedy, the same prompts) on a random-init model of a real shape: tokens
    per second on the preallocated key/value cache against the dynamic one, and ``--batch_tokens auto``'s choice for
    this model on this device (`judgetrain.judge.fit.auto_batch_tokens`) with the memory the generation then used."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from judgetrain.eval.generate import Generator
    from judgetrain.judge.fit import auto_batch_tokens

    folder = random_model_folder(name, tokenizer_dir, workdir / f"gen-{name}")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    cuda = device == "cuda"
    batch_tokens, how = auto_batch_tokens(model, device)
    body = " ".join(["the alloy is heated"] * (prompt_words // 4))
    rows = [[{"role": "user", "content": f"Grade answer {i}: {body}"}] for i in range(prompts)]
    out: dict[str, Any] = {"prompts": prompts, "max_new_tokens": new_tokens, "batch_tokens_auto": batch_tokens,
                           "batch_tokens_how": how}
    times: dict[bool, list[float]] = {True: [], False: []}
    for i, warm, order in alternating(1, 1, [True, False]):
        for static in order:
            gen = Generator(model, tokenizer, max_new_tokens=new_tokens, batch_tokens=batch_tokens,
                            static_cache=static)
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            texts = gen.generate(rows)
            if cuda:
                torch.cuda.synchronize()
            if warm:
                continue
            seconds = time.perf_counter() - t0
            key = "static_cache" if static else "dynamic_cache"
            out[key] = {"seconds": seconds, "tokens": sum(len(g.token_ids) for g in texts),
                        "static_cache_batches": gen.stats.static_cache_batches}
            out[key]["tokens_per_s"] = out[key]["tokens"] / seconds
            if cuda:
                out[key]["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
            times[static].append(seconds)
    out["static_cache_speedup"] = ratio(out["dynamic_cache"]["seconds"], out["static_cache"]["seconds"])
    del model
    return out


def bench_device(cfg: argparse.Namespace, workdir: Path) -> dict:
    """Per real shape: the LoRA DPO step's and the eval forward's tokens/s and MFU, the scoring engine's prefix
    sharing on against off, and generation on the static against the dynamic key/value cache with ``--batch_tokens
    auto``'s choice (random models saved under ``workdir``)."""
    import torch

    from judgetrain.models.tiny import ensure_tiny_judge

    dtype = torch.bfloat16
    t0 = time.perf_counter()
    peak = measure_matmul_rate(cfg.device, dtype, n=cfg.matmul_size, seconds=cfg.matmul_seconds)
    out: dict[str, Any] = {"dtype": "bfloat16", "matmul_flops_per_s": peak, "matmul_size": cfg.matmul_size, "shapes": {}}
    for name in cfg.shapes:
        seq = cfg.seq_len
        pairs = cfg.pairs if name != "qwen3-0.6b" else cfg.pairs * 4
        out["shapes"][name] = device_bench_shape(name, cfg.device, dtype, seq, pairs, cfg.device_steps, cfg.device_warmup,
                                                 cfg.eval_batch, peak)
        logger.info("%s: train %.0f tok/s (MFU %.1f%%), eval %.0f tok/s (MFU %.1f%%)", name,
                    out["shapes"][name]["train_tokens_per_s"], 100 * out["shapes"][name]["train_mfu"],
                    out["shapes"][name]["eval_tokens_per_s"], 100 * out["shapes"][name]["eval_mfu"])
        out["shapes"][name]["eval_sharing"] = device_bench_eval_sharing(name, cfg.device, dtype)
        logger.info("%s: eval first epoch, prefix sharing on / off: %s", name,
                    {k: round(v["speedup"], 2) for k, v in out["shapes"][name]["eval_sharing"].items()})
        gen = out["shapes"][name]["generation"] = device_bench_generation(
            name, cfg.device, dtype, ensure_tiny_judge(), workdir)
        logger.info("%s: generation %.0f tok/s on the static cache, %.0f on the dynamic one (%.2fx); judge's "
                    "batch_tokens auto: %d (%s)", name, gen["static_cache"]["tokens_per_s"],
                    gen["dynamic_cache"]["tokens_per_s"], gen["static_cache_speedup"], gen["batch_tokens_auto"], gen["batch_tokens_how"])
    out["seconds"] = time.perf_counter() - t0
    return out
