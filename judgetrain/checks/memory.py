"""Per-device peak memory of a DPO recipe, estimated before any weights load (`judgetrain train RECIPE --dry-run`).

The estimate adds, per device:

* static state: weights (sharded by FSDP / ZeRO-3), the LoRA adapter, gradients and AdamW state of what is trained
  (sharded by FSDP / ZeRO-2/3), fp32 master weights where mixed precision keeps them;
* the largest transient of one optimizer step: the policy forward + backward over the 2 x batch chosen / rejected
  sequences (what autograd saves, op by op, or only the layer inputs with activation checkpointing plus the layer
  recomputed), TRL's chunked LM-head log-prob (never the full logits), the reference pass (the same model with the
  adapter disabled, or a frozen copy, under no_grad; nothing with precompute_ref_log_probs), and the optimizer's step
  (every gradient held, plus the temporaries of the AdamW implementation the recipe's ``optim`` selects);
* the eval callback's scoring pass (no_grad, ``eval_batch_tokens`` tokens, logits of scored positions only).

The per-layer bytes are counted op by op for a Llama / Qwen2 / Qwen3 decoder layer (RMSNorm, attention through SDPA,
SwiGLU MLP) and checked against the tensors autograd saves; the whole against peaks measured on CPU with every live
tensor counted (`judgetrain.bench.memory.measure_dpo_step`) and against five peaks measured on an H200
(docs/scale.md): from -0.2% to +2.4% there, with one stated CUDA margin (`CUDA_CHECKPOINTED_LORA_EXTRA_LAYERS`). A
verdict whose spare memory is under ``ESTIMATE_MARGIN`` of the peak says "tight". Model shapes come from the model's
config.json (a local folder, a cached hub snapshot), else from a small built-in table of the recipes' models
(`BUILTIN_SHAPES`), and the report says which.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from judgetrain.config.recipe import MERGED_CACHE_BYTES, Recipe
from judgetrain.models.aliases import is_alias, resolve_model
from judgetrain.trainer.parallelism import zero3_gather_fits
from judgetrain.utils.hub import cached_snapshot

logger = logging.getLogger(__name__)

GIB = 1024**3

# Usable memory of common GPUs (what torch can allocate: the card's memory less the CUDA context, ~0.5-1 GiB).
GPUS = {
    "H100-80GB": 79.1 * GIB, "H200-141GB": 139.8 * GIB, "A100-80GB": 79.1 * GIB, "A100-40GB": 39.4 * GIB,
    "L40S-48GB": 44.3 * GIB, "A10-24GB": 22.0 * GIB, "RTX4090-24GB": 23.0 * GIB, "B200-180GB": 178.0 * GIB,
}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that memory depends on (from its config.json)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool = False  # an RMSNorm on each head's query and key (Qwen3)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    def layer_params(self) -> int:
        h, q = self.hidden, self.heads * self.head_dim
        attn = h * q + 2 * h * self.kv_dim + q * h
        mlp = 3 * h * self.intermediate
        return attn + mlp + 2 * h  # + the two RMSNorm weights (q/k norms of Qwen3 are a few hundred numbers)

    def params(self) -> int:
        emb = self.vocab * self.hidden
        return emb * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def projection_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection of one layer, by name."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def adapted_names(self, targets: list[str] | str | None) -> list[str]:
        """The projections of one layer that LoRA targets (all of them for none or ``all-linear``)."""
        if not targets or targets in ("all-linear", ["all-linear"]):
            return list(self.projection_dims())
        return [name for name in self.projection_dims() if name in targets]

    def adapted_projections(self, targets: list[str] | str | None) -> list[tuple[int, int]]:
        """(in, out) of each projection of one layer that LoRA targets."""
        return [self.projection_dims()[name] for name in self.adapted_names(targets)]

    def lora_params(self, r: int, targets: list[str] | None) -> int:
        """LoRA A (in x r) and B (r x out) on each targeted projection of every layer."""
        return self.layers * sum(r * (a + b) for a, b in self.adapted_projections(targets))


# The recipes' models, for dry runs on a machine that cannot read their config.json (no hub, nothing cached).
BUILTIN_SHAPES = {
    "Qwen/Qwen3-8B": ModelShape(4096, 12288, 36, 32, 8, 128, 151936, False, qk_norm=True),
    "meta-llama/Llama-3.1-8B-Instruct": ModelShape(4096, 14336, 32, 32, 8, 128, 128256, False),
    "meta-llama/Llama-3.1-8B": ModelShape(4096, 14336, 32, 32, 8, 128, 128256, False),
    "HuggingFaceTB/SmolLM2-135M-Instruct": ModelShape(576, 1536, 30, 9, 3, 64, 49152, True),
}


# Model types whose attention normalises each head's query and key (an RMSNorm that saves its input for backward)
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")


def shape_from_config(cfg: dict) -> ModelShape:
    cfg = cfg.get("text_config", cfg)
    heads = cfg["num_attention_heads"]
    return ModelShape(
        hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"], layers=cfg["num_hidden_layers"],
        heads=heads, kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, vocab=cfg["vocab_size"],
        tied=bool(cfg.get("tie_word_embeddings", False)), qk_norm=cfg.get("model_type") in QK_NORM_MODEL_TYPES,
    )


def config_json(name_or_path: str) -> tuple[dict, str] | None:
    """(config.json, where it came from) of a local folder (an alias's) or a cached hub snapshot; None when neither
    holds one. Never downloads."""

    path = resolve_model(name_or_path) if is_alias(name_or_path) else name_or_path
    local = Path(path) / "config.json"
    if local.is_file():
        return json.loads(local.read_text()), f"config.json of {path}"

    try:
        snapshot = cached_snapshot(path)
    except Exception:  # noqa: BLE001 - not a hub id
        snapshot = None
    if snapshot is not None and (snapshot / "config.json").is_file():
        return json.loads((snapshot / "config.json").read_text()), f"cached hub config of {path}"
    return None


def model_shape(name_or_path: str) -> tuple[ModelShape, str]:
    """(shape, where it came from): a local folder's or a cached hub snapshot's config.json (`config_json`), else
    the built-in table. Never downloads."""

    found = config_json(name_or_path)
    if found is not None:
        return shape_from_config(found[0]), found[1]
    path = resolve_model(name_or_path) if is_alias(name_or_path) else name_or_path
    if path in BUILTIN_SHAPES:
        return BUILTIN_SHAPES[path], f"judgetrain's built-in table ({path}'s config is not readable offline)"
    raise ValueError(f"no config.json for {name_or_path} offline and it is not in the built-in table "
                     f"({', '.join(BUILTIN_SHAPES)}); pass a local model folder")


@dataclass
class Plan:
    """How the recipe runs: what it trains, on what parallelism, with what batch."""

    processes: int = 1
    parallelism: str = "ddp"  # single | ddp | fsdp | zero2 | zero3
    weight_bytes: int = 2  # bf16 / fp16 weights: 2, fp32: 4
    mixed_precision_master: bool = False  # fp32 master weights (DeepSpeed bf16, FSDP mixed precision)
    lora_r: int | None = None
    lora_targets: list[str] | None = None
    lora_dropout: float = 0.0
    batch: int = 1  # pairs per device per micro-step: 2 x batch sequences
    seq_len: int = 1024
    grad_accum: int = 1
    checkpointing: bool = False
    precompute_ref: bool = False
    eval_batch_tokens: int = 8192
    eval_merge_lora: bool = True  # the scoring engine's merged LoRA forwards (judgetrain.eval.merged)
    # generate mode under ZeRO-3 (eval_generate_zero3_gather: auto | always | never); "": no such generation
    eval_generate_zero3_gather: str = ""
    optimizer_state_per_param: int = 2  # AdamW: exp_avg, exp_avg_sq
    optimizer: str = "fused"  # AdamW's implementation: fused | foreach | per-parameter (optimizer_implementation)
    padded: bool = True  # rows of unequal length: a padding mask, and GQA's k / v repeated to q's width for SDPA
    device: str = "cuda"  # "cpu": TRL's LM head runs its torch fallback (checks on this machine)


# ----------------------------------------------------------------------------------- what one layer's backward keeps
#
# Bytes autograd saves per token for one decoder layer (Llama / Qwen2 / Qwen3: RMSNorm, attention through SDPA,
# SwiGLU MLP), op by op, as torch saves them: an op keeps what its backward needs and nothing for an input that needs
# no gradient (a frozen weight's matmul keeps no input; a frozen norm weight's multiply keeps no normalised input).
# Counted from the saved-tensor hooks of real layers (tests/test_memory.py checks these sums against them).
NORM_BYTES = 4  # an RMSNorm computes in fp32: it keeps an fp32 copy of its input (and the negligible 1/rms)
DROPOUT_MASK_BYTES_CUDA = 1  # a live dropout's mask on CUDA (bool); on CPU torch keeps a noise tensor of the dtype


def saved_bytes_per_token_layer(shape: ModelShape, plan: "Plan") -> int:
    """Bytes one decoder layer keeps for backward per token, in training:

    * each RMSNorm's fp32 input (input and post-attention norms, and Qwen3's per-head q and k norms), plus, when the
      norm weights are trained (a full fine-tune), the normalised input in the weights' dtype;
    * SDPA's rotated q, k, v and output (the output is o_proj's input too); k and v at q's width when the batch has a
      padding mask (transformers then repeats them for GQA instead of SDPA's ``enable_gqa``);
    * SwiGLU's gate, up and act(gate);
    * the projections' inputs (`projection_inputs_bytes`): a trained weight keeps its input; LoRA's adapter keeps
      its own."""
    w, h, dq, kv, i = plan.weight_bytes, shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    norms = 2 * h + ((dq + kv) if shape.qk_norm else 0)
    full = plan.lora_r is None
    saved = NORM_BYTES * norms + (w * norms if full else 0)
    kv_width = dq if plan.padded and kv < dq else kv
    saved += w * (2 * dq + 2 * kv_width)
    saved += 3 * w * i
    return saved + projection_inputs_bytes(shape, plan)


def projection_inputs_bytes(shape: ModelShape, plan: "Plan") -> int:
    """The projections' saved inputs per token per layer. A full fine-tune keeps q/k/v's input (one tensor for the
    three), the MLP's input and down_proj's (o_proj's is SDPA's output, already counted). LoRA's frozen base keeps
    none; its adapter keeps what ``lora_A`` multiplies:

    * a bf16 / fp16 base with PEFT's fp32 adapter (the recipes' setup): PEFT casts the input to fp32 and autocast
      casts it back for ``lora_A``, one new half-precision copy per adapted projection (2 bytes per input element);
      so does a live dropout (its output, in the base dtype's bytes), plus its mask;
    * an adapter of the base's dtype without dropout (fp32 runs; TRL keeps the adapter in the base dtype under
      ZeRO-3): the projection's input itself, shared as the full fine-tune's is."""
    w, h, i = plan.weight_bytes, shape.hidden, shape.intermediate
    if plan.lora_r is None:
        return w * (2 * h + i)
    adapter = w if plan.parallelism == "zero3" else 4
    targets = shape.adapted_names(plan.lora_targets)
    if plan.lora_dropout > 0 or adapter != w:
        copy = w
        mask = (DROPOUT_MASK_BYTES_CUDA if plan.device == "cuda" else adapter) if plan.lora_dropout > 0 else 0
        return (copy + mask) * sum(shape.projection_dims()[name][0] for name in targets)
    shared = {"attention input": h if {"q_proj", "k_proj", "v_proj"} & set(targets) else 0,
              "mlp input": h if {"gate_proj", "up_proj"} & set(targets) else 0,
              "down_proj input": i if "down_proj" in targets else 0}
    return w * sum(shared.values())


def no_grad_bytes_per_token_layer(shape: ModelShape, plan: "Plan", *, adapter_on: bool) -> int:
    """The most one layer holds at once per token in a no_grad forward (the reference pass, the eval): the MLP's
    gate, up, act(gate) and their product, the residual and the norm's output; with a live LoRA adapter on a half-
    precision base, PEFT's fp32 copy of the widest adapted input too (measured on CPU at Qwen3-0.6B's shape: 28 KiB
    per token, 39 KiB with the adapter on)."""
    w = plan.weight_bytes
    held = w * (4 * shape.intermediate + 2 * shape.hidden)
    if adapter_on and plan.lora_r is not None and w != 4 and plan.parallelism != "zero3":
        held += 4 * max(a for a, _ in shape.adapted_projections(plan.lora_targets))
    return held


def backward_transient_bytes_per_token(shape: ModelShape, plan: "Plan") -> int:
    """The gradients in flight inside one layer's backward beyond what it saved: the MLP's two widest and the
    residual's (measured on CPU: 14 KiB per token at Qwen3-0.6B's shape in bf16, LoRA and full alike)."""
    return plan.weight_bytes * (2 * shape.intermediate + shape.hidden)


# Layers' saved tensors a checkpointed LoRA backward on CUDA held beyond this account, in the one GPU measurement
# there is: an H200, Qwen3-0.6B's shape, bf16, LoRA r=16 on every projection, 4,034 tokens, 2,415 MiB measured against
# 1,878 MiB counted here without it, 537 MiB or 1.9 layers of 71 KiB per token. Not found on CPU: the tracker at the
# same layer shape sees the recomputed layer and the backward's gradients only; nor in that H200's full fine-tune with
# checkpointing (within 3% without it). Counted for LoRA with checkpointing on CUDA, as measured (rounded up to 2):
# a stated margin until its cause is found, not a derived term (docs/scale.md; gpu_check records each phase's peak).
CUDA_CHECKPOINTED_LORA_EXTRA_LAYERS = 2


# -------------------------------------------------------------------------------------------- the optimizer's step
#
# The transformers Trainer builds torch's AdamW from the recipe's ``optim``: ``adamw_torch_fused`` (its default since
# torch 2.8) passes ``fused=True``; ``adamw_torch`` leaves the choice to torch (`torch.optim.optimizer.
# _default_to_fused_or_foreach`): foreach on CUDA / XPU, the per-parameter loop elsewhere. What each allocates beyond
# the state, while the gradients are still held (measured on CPU with every tensor counted: tests/test_memory.py):
# * fused: nothing (one kernel updates parameters and state in place);
# * foreach: ``torch._foreach_sqrt(exp_avg_sq)``, one tensor the size of every trained parameter of a device and dtype;
# * per-parameter: the previous parameter's denominator beside the current one's square root and quotient, at most 3
#   tensors the size of the largest trained parameter.
OPTIMIZER_IMPLEMENTATIONS = ("fused", "foreach", "per-parameter")


def optimizer_implementation(optim: str, device: str = "cuda") -> tuple[str, str]:
    """(implementation, why) of the AdamW step the Trainer runs for the recipe's ``optim`` on ``device``."""
    optim = str(getattr(optim, "value", optim))
    if optim == "adamw_torch_fused":
        return "fused", f"optim {optim}: torch's fused AdamW kernel"
    if optim == "adamw_torch":
        chosen = "foreach" if device in ("cuda", "xpu") else "per-parameter"
        return chosen, f"optim {optim}: torch's default on {device}, {chosen}"
    return "foreach", f"optim {optim}: not torch's AdamW; its step's temporaries counted as foreach AdamW's (the most)"


def optimizer_step_temporaries(shape: ModelShape, plan: "Plan", trainable: int, state_bytes: int, shard: int) -> float:
    """Bytes the optimizer's step allocates beyond its state (see OPTIMIZER_IMPLEMENTATIONS)."""
    if plan.optimizer == "fused":
        return 0
    if plan.optimizer == "foreach":
        return trainable * state_bytes / shard
    if plan.lora_r is not None:
        largest = plan.lora_r * max(max(a, b) for a, b in shape.adapted_projections(plan.lora_targets))
    else:
        largest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate, shape.hidden * shape.q_dim)
    return 3 * min(largest, trainable) * state_bytes / shard


def _eval_gathers_whole(plan: Plan, params: int, resident: float, usable: float | None) -> bool:
    """Whether the eval's generate mode gathers the whole ZeRO-3 model (see `zero3_gather_fits`): ``auto`` decides on
    the device's ``usable`` memory less what is ``resident``; no device stated: counted as gathering (the worst)."""
    mode = plan.eval_generate_zero3_gather
    if plan.parallelism != "zero3" or mode in ("", "never"):
        return False
    if mode == "always" or usable is None:
        return True
    return zero3_gather_fits(params, plan.weight_bytes, usable - resident)


def estimate(shape: ModelShape, plan: Plan, usable: float | None = None) -> dict[str, Any]:
    """Per-device peak memory in bytes by component, the peak, and the tokens one optimizer step sees. ``usable``:
    the device's memory, where known (decides ``eval_generate_zero3_gather: auto``)."""
    out: dict[str, Any] = {}
    params = shape.params()
    shard_w = plan.processes if plan.parallelism in ("fsdp", "zero3") else 1
    trainable, tb, shard_o = _states(shape, plan, out)
    tokens = 2 * plan.batch * plan.seq_len
    act, backward_layer, lm_head = _training_pass(shape, plan, out, tokens, shard_w)
    ref_pass = _reference(shape, plan, out, tokens, shard_w)
    _eval_pass(shape, plan, out, shard_w)
    out["optimizer"] = plan.optimizer
    out["optimizer_step_temporaries"] = optimizer_step_temporaries(shape, plan, trainable, tb, shard_o)

    static = sum(out[k] for k in ("weights", "adapter", "master_weights", "optimizer_state", "reference_weights"))
    # backward starts at the LM head: its tiles and temporaries are gone before the layers' backward (a recomputed
    # layer under checkpointing, the gradients in flight) runs and their gradients accumulate
    out["backward_layer"] = backward_layer
    train_peak = static + act + max(lm_head, backward_layer + out["gradients"]) + out["gathered_layers"]
    # the optimizer's step: activations gone, every gradient held, and the step's own temporaries
    step_peak = static + out["gradients"] + out["optimizer_step_temporaries"]
    ref_peak = static + ref_pass + out["gathered_layers"]
    # generate mode under ZeRO-3 gathering the whole model (TRL's unwrap_model_for_generation): every parameter whole
    # on each rank for the eval, beside its own partition; layer by layer: the two gathered layers, as scoring
    whole = _eval_gathers_whole(plan, params, static + out["eval_pass"], usable)
    out["eval_gathered"] = "whole model" if whole else "2 layers"
    out["eval_gathered_weights"] = params * plan.weight_bytes if whole else out["gathered_layers"]
    eval_peak = static + out["eval_pass"] + out["eval_gathered_weights"]
    out["eval_peak"] = eval_peak
    out["peak"] = max(train_peak, ref_peak, eval_peak, step_peak)
    eval_phase = "eval scoring" + (" (generate mode gathers the whole model)" if whole else "")
    out["peak_phase"] = {step_peak: "optimizer step", train_peak: "policy forward/backward",
                         ref_peak: "reference pass", eval_peak: eval_phase}[out["peak"]]
    out["tokens_per_step"] = tokens * plan.grad_accum * plan.processes
    out["tokens_per_micro_step_per_device"] = tokens
    out["parameters"] = params
    out["trainable_parameters"] = trainable
    return out


def _states(shape: ModelShape, plan: Plan, out: dict[str, Any]) -> tuple[int, int, int]:
    """The weights, adapter, master weights, gradients and optimizer state into ``out``; returns (trainable
    parameters, bytes per trainable value, the shards of gradients and optimizer state)."""
    params, wb, lora = shape.params(), plan.weight_bytes, plan.lora_r is not None
    shard_w = plan.processes if plan.parallelism in ("fsdp", "zero3") else 1
    shard_o = plan.processes if plan.parallelism in ("fsdp", "zero2", "zero3") else 1  # gradients, optimizer state
    trainable = shape.lora_params(plan.lora_r, plan.lora_targets) if lora else params
    tb = 4 if lora or plan.mixed_precision_master else wb  # PEFT keeps adapters in fp32; masters are fp32
    out["weights"] = params * wb / shard_w
    out["adapter"] = trainable * 4 / shard_w if lora else 0
    out["master_weights"] = params * 4 / shard_o if (plan.mixed_precision_master and not lora) else 0
    out["gradients"] = trainable * tb / shard_o
    out["optimizer_state"] = trainable * tb * plan.optimizer_state_per_param / shard_o
    return trainable, tb, shard_o


def _training_pass(shape: ModelShape, plan: Plan, out: dict[str, Any], tokens: int,
                   shard_w: int) -> tuple[float, float, float]:
    """The policy's forward and backward over ``tokens``: activations, the LM head's log-probabilities and the
    layers gathered under sharding into ``out``; returns (activations, one layer's backward, the LM head)."""
    wb, lora = plan.weight_bytes, plan.lora_r is not None
    train_layer = saved_bytes_per_token_layer(shape, plan)
    transient = backward_transient_bytes_per_token(shape, plan)
    if plan.checkpointing:  # layer inputs kept; in backward one layer recomputed at a time
        live = 1 + (CUDA_CHECKPOINTED_LORA_EXTRA_LAYERS if lora and plan.device == "cuda" else 0)
        act = tokens * shape.layers * shape.hidden * wb
        backward_layer = tokens * (live * train_layer + transient)
    else:
        act = tokens * shape.layers * train_layer
        backward_layer = tokens * transient
    act += tokens * shape.hidden * (NORM_BYTES + 2 * wb)  # embeddings out, the final norm's fp32 input and output
    lm_head = lm_head_bytes(shape, tokens, wb, device=plan.device, trains_head=not lora)
    # unsharded layers in flight under FSDP / ZeRO-3: the current layer and the prefetched next one
    gathered = 2 * shape.layer_params() * wb + (shape.vocab * shape.hidden * wb if shard_w > 1 else 0)
    out["activations"] = act
    out["lm_head_logprobs"] = lm_head
    out["gathered_layers"] = gathered if shard_w > 1 else 0
    return act, backward_layer, lm_head


def _reference(shape: ModelShape, plan: Plan, out: dict[str, Any], tokens: int, shard_w: int) -> float:
    """The reference model's weights (a full fine-tune's frozen copy) and pass into ``out``; returns the pass."""
    wb = plan.weight_bytes
    if plan.precompute_ref:
        ref_static, ref_pass = 0, 0
    else:
        ref_static = 0 if plan.lora_r is not None else shape.params() * wb / shard_w  # TRL's frozen copy
        ref_pass = (tokens * (no_grad_bytes_per_token_layer(shape, plan, adapter_on=False) + shape.hidden * wb * 2)
                    + lm_head_bytes(shape, tokens, wb, device=plan.device))
    out["reference_weights"] = ref_static
    out["reference_pass"] = ref_pass
    return ref_pass


def _eval_pass(shape: ModelShape, plan: Plan, out: dict[str, Any], shard_w: int) -> None:
    """The scoring engine's pass over ``eval_batch_tokens`` (and the merged LoRA copy it may hold) into ``out``."""
    wb, lora = plan.weight_bytes, plan.lora_r is not None
    eval_tokens = plan.eval_batch_tokens
    # judgetrain's scoring engine keeps the logits of scored positions only (the responses: EVAL_SCORED_FRACTION of
    # a batch's tokens, assumed): the logits in the weights' dtype, their fp32 copy and the logsumexp temporary
    scored = int(eval_tokens * EVAL_SCORED_FRACTION)
    eval_layer = no_grad_bytes_per_token_layer(shape, plan, adapter_on=lora)
    out["eval_pass"] = eval_tokens * (eval_layer + shape.hidden * wb * 2) + scored * shape.vocab * (wb + 8)
    # merged LoRA weights (fp32 models only; half-precision layers keep PEFT's forward): bounded by the engine
    merge = lora and wb == 4 and plan.eval_merge_lora and eval_tokens > 0 and shard_w == 1
    out["eval_merged_lora"] = merged_extra_bytes(
        [a * b * wb for a, b in shape.adapted_projections(plan.lora_targets)] * shape.layers) if merge else 0
    out["eval_pass"] += out["eval_merged_lora"]


def lm_head_bytes(shape: ModelShape, tokens: int, wb: int, *, device: str = "cuda", trains_head: bool = False) -> int:
    """TRL's fused LM head (trl.kernels.chunked_logprob) never builds the full logits: it multiplies
    [4096 tokens x 32768 vocab] tiles into one buffer. On CUDA a Triton kernel folds each tile in place (and only
    completion positions are scored: ``tokens`` is then an upper bound); elsewhere torch code makes ~TILE_TEMPS fp32
    temporaries of the tile (measured: the backward's fold is the peak). Backward rebuilds the tiles and accumulates
    fp32 gradients of the hidden states (and of the head's weight when it is trained)."""
    rows = min(tokens, 4096)
    buf = rows * 32768 * wb
    temps = 0 if device == "cuda" else TILE_TEMPS * rows * min(shape.vocab, 32768) * 4
    grads = tokens * shape.hidden * 4 + (shape.vocab * shape.hidden * 4 if trains_head else 0)
    return buf + temps + grads + tokens * 4 * 8


TILE_TEMPS = 7
EVAL_SCORED_FRACTION = 0.5



def merged_extra_bytes(layer_weight_bytes: list[int], cache_bytes: int = MERGED_CACHE_BYTES) -> int:
    """The most memory `judgetrain.eval.merged.merged_lora` holds beyond the model for adapted layers whose weights
    take these bytes (in the model's order): the layers merged for the whole context (first come, while they fit
    ``cache_bytes``) plus the largest of the others, merged in its forward."""
    held, rest = 0, [0]
    for n in layer_weight_bytes:
        if held + n <= cache_bytes:
            held += n
        else:
            rest.append(n)
    return held + max(rest)


# ----------------------------------------------------------------------------------------------- recipe -> plan


def plan_from_recipe(recipe: Recipe, *, processes: int = 1,
                     parallelism: str = "single", mixed_precision: str | None = None) -> Plan:
    """The recipe's plan: LoRA or full, dtype, batch, max_length, checkpointing, reference, eval batch. ``resolved``
    (the recipe as written) gives bf16: a dry run on a CPU machine parses it as false."""
    script_args, training_args = recipe.script_args, recipe.training_args
    model_args, resolved = recipe.model_args, recipe.resolved
    dtype = str(resolved.get("dtype") or getattr(model_args, "dtype", None) or "auto")
    bf16 = bool(resolved.get("bf16", True) or resolved.get("fp16")) or mixed_precision in ("bf16", "fp16")
    half = dtype in ("bfloat16", "float16") or (dtype == "auto" and bf16)
    lora = bool(getattr(model_args, "use_peft", False))
    targets = getattr(model_args, "lora_target_modules", None)
    return Plan(
        processes=processes,
        parallelism=parallelism,
        weight_bytes=2 if half else 4,
        mixed_precision_master=(not lora) and bf16 and parallelism in ("fsdp", "zero2", "zero3"),
        lora_r=getattr(model_args, "lora_r", 16) if lora else None,
        lora_targets=list(targets) if isinstance(targets, (list, tuple)) else targets,
        # TRL's disable_dropout (on by default) sets every dropout to 0, LoRA's too: no mask is saved then
        lora_dropout=0.0 if not lora or getattr(training_args, "disable_dropout", True)
        else float(getattr(model_args, "lora_dropout", 0.0) or 0.0),
        batch=training_args.per_device_train_batch_size,
        seq_len=training_args.max_length or 1024,
        grad_accum=training_args.gradient_accumulation_steps,
        checkpointing=bool(getattr(training_args, "activation_checkpointing", False)
                           or getattr(training_args, "gradient_checkpointing", False)),
        precompute_ref=bool(training_args.precompute_ref_log_probs),
        eval_batch_tokens=script_args.eval_batch_tokens if script_args.eval_suites else 0,
        eval_merge_lora=bool(getattr(script_args, "eval_merge_lora", True)),
        optimizer=optimizer_implementation(getattr(training_args, "optim", "adamw_torch_fused"))[0],
        eval_generate_zero3_gather=str(getattr(script_args, "eval_generate_zero3_gather", "auto"))
        if parallelism == "zero3" and script_args.eval_suites and "generate" in (script_args.eval_scoring or [])
        and getattr(script_args, "eval_generate_backend", "transformers") == "transformers" else "",
    )


def dry_run_memory(recipe: Recipe, accelerate_cfg=None) -> dict[str, Any]:
    """The dry run's memory section for the recipe under its accelerate config (or --num_processes) and --gpu."""
    script_args, model_args = recipe.script_args, recipe.model_args
    parallelism, processes = parallelism_of_config(accelerate_cfg) if accelerate_cfg is not None else ("single", 1)
    if script_args.num_processes:
        processes = script_args.num_processes
        if parallelism == "single" and processes > 1:
            parallelism = "ddp"
    shape, source = model_shape(model_args.model_name_or_path)
    plan = plan_from_recipe(recipe, processes=processes,
                            parallelism=parallelism, mixed_precision=getattr(accelerate_cfg, "mixed_precision", None))
    out = report(shape, source, plan, script_args.gpu)
    verdict = "" if "fits" not in out else (
        f": fits {out['gpu']} ({out['headroom_gib']} GiB to spare)" if out["fits"] and not out["tight"] else
        f": fits {out['gpu']} only within the estimate's margin ({out['headroom_gib']} GiB to spare against "
        f"{out['margin_gib']} GiB, {ESTIMATE_MARGIN:.0%} of the peak): tight" if out["fits"] else
        f": does NOT fit {out['gpu']} ({-out['headroom_gib']} GiB over); try {'; '.join(out['advice'])}")
    optim = optimizer_implementation(getattr(recipe.training_args, "optim", "adamw_torch_fused"))[1]
    gathered = "" if not plan.eval_generate_zero3_gather else (
        f"; generate mode under ZeRO-3 (eval_generate_zero3_gather: {plan.eval_generate_zero3_gather}) counted with "
        f"the {out['eval_gathered']} gathered")
    out["optimizer_assumed"] = optim
    logger.info("Memory per device, %s over %d process(es): peak %.1f GiB in the %s%s; %s tokens per optimizer step%s; "
                "AdamW assumed: %s", plan.parallelism, plan.processes, out["peak_gib"], out["peak_phase"], verdict,
                f"{out['tokens_per_step']:,}", gathered, optim)
    return out


def parallelism_of_config(cfg) -> tuple[str, int]:
    """(parallelism, total processes) of a loaded accelerate config."""
    kind = str(cfg.distributed_type).split(".")[-1]
    n = int(cfg.num_processes or 1)
    if kind == "DEEPSPEED":
        stage = int((cfg.deepspeed_config or {}).get("zero_stage", 2))
        return {1: "zero2", 2: "zero2", 3: "zero3"}.get(stage, "zero2"), n
    if kind == "FSDP":
        return "fsdp", n
    return ("single" if n == 1 else "ddp"), n


# How far the estimate may be from a GPU's measured peak (torch.cuda.max_memory_allocated): the band gpu_check's memory
# check holds it to. Measured so far: five cases on an H200 from -0.2% to +2.4% (docs/scale.md). A verdict whose spare
# memory is under this share of the peak says "tight". The caching allocator's reserve beyond the allocated peak
# (fragmentation) is not in it: gpu_check records max_memory_reserved beside each case.
ESTIMATE_MARGIN = 0.10


def report(shape: ModelShape, source: str, plan: Plan, gpu: str | None) -> dict[str, Any]:
    """The dry run's memory section: figures in GiB, the peak, whether it fits the stated GPU."""
    usable = GPUS.get(gpu) if gpu else None
    est = estimate(shape, plan, usable)
    gib = {k: round(v / GIB, 2) for k, v in est.items() if isinstance(v, (int, float)) and k not in
           ("tokens_per_step", "tokens_per_micro_step_per_device", "parameters", "trainable_parameters")}
    out = {"model_shape": asdict(shape), "shape_from": source, "plan": asdict(plan), "per_device_gib": gib,
           "peak_gib": gib["peak"], "peak_phase": est["peak_phase"], "tokens_per_step": est["tokens_per_step"],
           "parameters": est["parameters"], "trainable_parameters": est["trainable_parameters"],
           "eval_gathered": est["eval_gathered"], "optimizer": plan.optimizer}
    if gpu:
        if gpu not in GPUS:
            raise ValueError(f"--gpu {gpu}: unknown; one of {', '.join(GPUS)}")
        usable = GPUS[gpu]
        out["gpu"], out["gpu_usable_gib"] = gpu, round(usable / GIB, 1)
        out["fits"] = est["peak"] <= usable
        out["headroom_gib"] = round((usable - est["peak"]) / GIB, 2)
        out["margin_gib"] = round(ESTIMATE_MARGIN * est["peak"] / GIB, 2)
        out["tight"] = out["fits"] and usable - est["peak"] < ESTIMATE_MARGIN * est["peak"]
        if not out["fits"]:
            out["advice"] = advice(shape, plan, usable)
    return out


def advice(shape: ModelShape, plan: Plan, usable: float) -> list[str]:
    """What would make it fit, tried one change at a time."""
    tries = []
    if not plan.checkpointing:
        tries.append(("activation_checkpointing: true", Plan(**{**asdict(plan), "checkpointing": True})))
    if plan.batch > 1:
        half = max(plan.batch // 2, 1)
        tries.append((f"per_device_train_batch_size: {half}, gradient_accumulation_steps: {plan.grad_accum * plan.batch // half}",
                      Plan(**{**asdict(plan), "batch": half, "grad_accum": plan.grad_accum * plan.batch // half})))
    if plan.lora_r is None and not plan.precompute_ref:
        tries.append(("precompute_ref_log_probs: true", Plan(**{**asdict(plan), "precompute_ref": True})))
    if plan.eval_batch_tokens > 2048:
        tries.append(("eval_batch_tokens: 2048", Plan(**{**asdict(plan), "eval_batch_tokens": 2048})))
    if plan.parallelism in ("ddp", "single", "zero2") and plan.processes > 1:
        tries.append(("accelerate_configs/zero3.yaml or fsdp2.yaml (shard the weights)",
                      Plan(**{**asdict(plan), "parallelism": "zero3"})))
    if estimate(shape, plan, usable)["eval_gathered"] == "whole model":
        tries.append(("eval_generate_zero3_gather: never (layer-by-layer generation)",
                      Plan(**{**asdict(plan), "eval_generate_zero3_gather": "never"})))
    peaks = [(what, estimate(shape, p, usable)["peak"]) for what, p in tries]
    return [f"{what}: {peak / GIB:.1f} GiB" + (" (fits)" if peak <= usable else "") for what, peak in peaks]
