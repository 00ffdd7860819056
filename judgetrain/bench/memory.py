"""The memory-measurement harness: real DPOTrainer steps on this CPU with every live tensor storage counted, beside
the dry run's estimate (judgetrain.checks.memory) for the same shape, tokens and options. docs/scale.md gives the
figures; `judgetrain memory check` runs it."""

# Late imports: datasets, torch, peft, transformers, trl, judgetrain.bench (inside the functions that use them): each
# benchmark part loads only what it measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

from judgetrain.checks.memory import ModelShape, Plan, estimate, model_shape


def _pairs(n: int, words: int) -> list[dict]:
    """n conversational pairs of equal length (so no padding blurs the token count)."""
    body = " ".join(["score"] * words)
    return [{"prompt": [{"role": "user", "content": f"Rate {i}: {body}"}],
             "chosen": [{"role": "assistant", "content": f"good {body}"}],
             "rejected": [{"role": "assistant", "content": f"bad {body}"}]} for i in range(n)]


def measure_dpo_step(model_dir: str, *, lora_r: int | None, checkpointing: bool, batch: int = 1, words: int = 100,
                     steps: int = 2, output_dir: str, bf16: bool = False, lora_dropout: float = 0.0,
                     device: str = "cpu", optimizer: str = "fused") -> dict[str, Any]:
    """Peak live tensor memory of `steps` real DPOTrainer optimizer steps on this process's CPU, tracked by torch's
    MemTracker (every tensor storage, parameters, gradients, optimizer state, activations, temporaries), with the
    token count per sequence as TRL tokenised it. For checking `estimate` on CPU; GPU peaks need a GPU. ``bf16``: the
    recipes' setup, bf16 weights and bf16 autocast (PEFT keeps the adapter in fp32). ``lora_dropout`` > 0 keeps
    dropout on (TRL's ``disable_dropout`` sets every dropout to 0 by default, LoRA's too). ``device="cuda"``: the steps
    run on the GPU and the peak is ``torch.cuda.max_memory_allocated`` (scripts/gpu_check.py), with the allocator's
    reserved peak and the peak of each phase beside it. ``optimizer``: the AdamW implementation (fused: the Trainer's
    default ``adamw_torch_fused``; foreach; per-parameter), the Trainer's own hyperparameters either way."""
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if bf16 else torch.float32)
    args = DPOConfig(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch, max_length=None,
                     activation_checkpointing=checkpointing, report_to="none", save_strategy="no", logging_steps=1,
                     learning_rate=1e-4, bf16=bf16, use_cpu=device == "cpu", dataloader_num_workers=0, seed=0,
                     disable_dropout=lora_dropout == 0)
    peft = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=lora_dropout, target_modules="all-linear",
                      task_type="CAUSAL_LM") if lora_r else None
    trainer = DPOTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(_pairs(batch * steps, words)),
                         processing_class=tok, peft_config=peft)
    if optimizer != "fused":  # the Trainer builds the fused one itself; another is handed to it before train()
        trainer.optimizer = torch.optim.AdamW([p for p in trainer.model.parameters() if p.requires_grad],
                                              lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                                              eps=args.adam_epsilon, weight_decay=args.weight_decay,
                                              foreach=optimizer == "foreach")
    row = trainer.train_dataset[0]
    seq_len = len(row["input_ids"]) if "input_ids" in row else len(row["prompt_ids"]) + len(row["chosen_ids"])
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()  # the peak starts at what is allocated now: weights, reference
        with PhasePeaks() as phases:
            trainer.train()
        peak = max(int(torch.cuda.max_memory_allocated()), *phases.peaks.values())  # the phase hooks reset the counter
        return {"peak_bytes": peak, "seq_len": seq_len, "batch": batch,
                "reserved_peak_bytes": int(torch.cuda.max_memory_reserved()), "phase_peak_bytes": phases.peaks}
    tracker = LiveTensorBytes()
    for m in (trainer.model, trainer.ref_model):
        if m is not None:
            for t in list(m.parameters()) + list(m.buffers()):
                tracker.track(t)
    with tracker:
        trainer.train()
    return {"peak_bytes": int(tracker.peak), "seq_len": seq_len, "batch": batch}


class PhasePeaks:
    """While active: ``torch.cuda.max_memory_allocated`` of each phase of every optimizer step, through torch's global
    optimizer-step hooks: the forward and backward (the reference pass included) up to the step, and the step
    itself."""

    def __init__(self):
        self.peaks: dict[str, int] = {"forward_backward": 0, "optimizer_step": 0}
        self._handles: list = []

    def _take(self, phase: str) -> None:
        import torch

        torch.cuda.synchronize()
        self.peaks[phase] = max(self.peaks[phase], int(torch.cuda.max_memory_allocated()))
        torch.cuda.reset_peak_memory_stats()

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles = [register_optimizer_step_pre_hook(lambda *_: self._take("forward_backward")),
                         register_optimizer_step_post_hook(lambda *_: self._take("optimizer_step"))]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        return False


class LiveTensorBytes:
    """Bytes of live tensor storages, and their peak, while active: every tensor an operator returns is counted once
    per storage until the storage is freed (the accounting torch's MemTracker does, without its module hooks, which
    fail on frozen parameters). Tensors made before entering must be passed to `track`."""

    def __init__(self):

        self._weakref = weakref
        self.live: dict[int, int] = {}
        self._refs: dict[int, Any] = {}
        self.current = 0
        self.peak = 0
        self._mode = None

    def track(self, t) -> None:
        import torch

        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        st = t.untyped_storage()
        key = id(st)
        if key in self.live:
            return
        n = st.nbytes()
        self.live[key] = n
        self._refs[key] = self._weakref.ref(st, lambda _, k=key: self._free(k))
        self.current += n
        self.peak = max(self.peak, self.current)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)
        self._refs.pop(key, None)

    def __enter__(self):
        from judgetrain.bench.dispatch import TrackingMode  # torch's private base class: see that module

        self._mode = TrackingMode(self.track)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        return False


def llama_model_folder(shape: ModelShape, out: str | Path, tokenizer_from: str, *, layers: int | None = None) -> str:
    """A randomly initialised Llama-architecture model of ``shape`` (optionally with fewer layers) with the tokenizer
    of ``tokenizer_from``: a real architecture to measure on a machine that cannot download one."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=layers or shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, vocab_size=shape.vocab,
                      tie_word_embeddings=shape.tied, max_position_embeddings=4096)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(out)
    return str(out)


def check(model_dir: str, *, lora_r: int | None, checkpointing: bool, words: int = 100, steps: int = 2,
          output_dir: str, bf16: bool = False, lora_dropout: float = 0.0, device: str = "cpu",
          optimizer: str = "fused") -> dict[str, Any]:
    """Measured peak of real DPO steps on this CPU (or GPU) beside the estimate for the same shape, tokens, options
    and AdamW implementation (equal-length rows: no padding mask). On a GPU also the allocator's reserved peak and
    the peak of each phase."""
    shape, source = model_shape(model_dir)
    measured = measure_dpo_step(model_dir, lora_r=lora_r, checkpointing=checkpointing, words=words, steps=steps,
                                output_dir=output_dir, bf16=bf16, lora_dropout=lora_dropout, device=device,
                                optimizer=optimizer)
    plan = Plan(weight_bytes=2 if bf16 else 4, lora_r=lora_r, lora_dropout=lora_dropout if lora_r else 0.0, batch=1,
                seq_len=measured["seq_len"], checkpointing=checkpointing, eval_batch_tokens=0, device=device,
                optimizer=optimizer, padded=False)
    est = estimate(shape, plan)
    out = {"model": model_dir, "lora_r": lora_r, "checkpointing": checkpointing, "bf16": bf16,
           "lora_dropout": lora_dropout, "optimizer": optimizer, "seq_len": measured["seq_len"],
           "measured_mib": round(measured["peak_bytes"] / 2**20, 1), "estimated_mib": round(est["peak"] / 2**20, 1),
           "estimated_phase": est["peak_phase"], "error": round(est["peak"] / measured["peak_bytes"] - 1, 3)}
    if "reserved_peak_bytes" in measured:
        out["reserved_mib"] = round(measured["reserved_peak_bytes"] / 2**20, 1)
        out["phase_peak_mib"] = {k: round(v / 2**20, 1) for k, v in measured["phase_peak_bytes"].items()}
    return out

