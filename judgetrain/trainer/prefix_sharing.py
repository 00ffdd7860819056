"""Prefix sharing for DPO: each pair's prompt runs once, its chosen and rejected completions on top of it.

TRL's DPOTrainer scores a pair as two sequences, prompt + chosen and prompt + rejected, for the policy and again for
the reference, so every prompt token is computed twice per model. Judge data has long prompts (a rubric and the
evaluation being judged) and short completions (a verdict), so most of that work is repeated. Prefix sharing
(`judgetrain.trainer.dpo.JudgeDPOTrainer` with ``prefix_sharing=True``, built on `PrefixSharingMixin`) keeps TRL's
loss, metrics, collator and reference handling untouched and changes one thing: the model call that returns per-token
log-probabilities. For a batch laid out as TRL lays it out ([chosen rows; rejected rows], right padded), the call
runs instead one packed row per pair,

    prompt[:-1] | prompt[-1] chosen[:-1] | prompt[-1] rejected[:-1]

with position ids restarting at the prompt end for each completion segment and a 4D attention mask in which the
rejected segment sees the shared prompt and itself, never the chosen segment. The last prompt token is repeated at
the head of each segment because its hidden state predicts the first completion token of both. The per-token results
are scattered back into TRL's (2 x batch, length - 1) layout, so everything downstream (loss types, ld_alpha, WPO
weights, rewards, logged metrics) reads exactly what TRL's own forward would give, within float rounding.

It applies to the policy, the reference (a LoRA model with its adapter disabled, or a separate reference model) and
`precompute_ref_log_probs`. Where it cannot apply it falls back to TRL's forward with a warning naming why: attention
implementations that take no custom 4D mask (flash-attention varlen kernels, flex attention), sliding-window or
chunked attention layers, ALiBi or multimodal rotary positions, vision data, prompt-learning PEFT, MoE auxiliary
losses, context parallelism, and a model whose packed result disagrees with its two-sequence result on a probe pair
at start-up. A batch whose two rows of a pair do not share their prompt (``truncation_mode: keep_end`` cutting them
differently) runs TRL's forward for that batch.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from dataclasses import dataclass

import torch
from peft import PeftModel

from judgetrain.compat.transformers import attn_implementation
from judgetrain.compat.trl import forward_is_wrapped, unwrap_fused_forward, uses_vision_data, wrap_fused_forward
from judgetrain.models.attention import prefix_sharing_problem
from judgetrain.utils.ranks import any_rank

logger = logging.getLogger(__name__)

PER_TOKEN_FIELDS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask")

# The start-up probe's two pairs (prompt, chosen, rejected tokens): 264 tokens through the model in its two forwards
# (736 with the 16/96/32 and 12/80/40 tokens it had: 2.8x the probe's time on a CPU). A chosen completion of 28-32
# tokens moves a rejected one that sees it, or whose positions do not restart, as far as 80-96 did (`probe_tolerance`).
PROBE_PAIRS = ((8, 32, 12), (6, 28, 14))


def probe_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(mean, max) absolute difference of per-token log-probs the start-up probe allows between the packed and the
    two-sequence forward, from the rounding of the weights' dtype (machine epsilon: 1.2e-7 fp32, 9.8e-4 fp16,
    7.8e-3 bf16). Measured on CPU (Qwen2, Qwen3 sdpa, Llama eager; the probe's pairs): rounding gives a mean of at most
    9e-5 in bf16 and 1.1e-5 in fp16; a rejected completion that sees the chosen one gives >= 6.7e-2, position ids
    that do not restart >= 4.6e-3, in every dtype. With the shorter `PROBE_PAIRS`, on the tests' tiny random Qwen2,
    Qwen3 and Llama with LoRA in fp32, bf16 and fp16: rounding a mean of at most 1.4e-5 (2.1e-5 with the longer
    pairs), a mask ignored >= 2.3e-2 (1.9e-2), positions that do not restart >= 1.4e-3 (1.4e-3). So the mean bound
    sits at 0.15 eps (bf16 1.2e-3), the max at 4 eps.
    """
    eps = _eps(dtype)
    return max(1e-5, 0.15 * eps), max(1e-4, 4 * eps)


def _eps(dtype: torch.dtype) -> float:
    """Machine epsilon of the dtype the probe computes in (fp32's for a non-float dtype)."""
    return torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps


# The chosen segment as the probe's control. A packed chosen token sees exactly what it sees in TRL's forward (the
# prompt and the chosen tokens before it, at the same positions), so its difference is the rounding of this model on
# this device alone; the two faults the probe looks for (a rejected segment that sees the chosen one, positions that
# do not restart) move the rejected segment only. Measured on an H200 with Qwen3-0.6B's layer shape (4 layers, LoRA,
# sdpa and eager): rounding alone gave a mean of 3.0e-3 to 3.6e-3 in bf16 (0.39-0.46 eps) and 3.1e-4 in tf32, above
# `probe_tolerance`'s means, while a wrong mask gave 0.136 and positions that do not restart 0.054 in every dtype.
# The rejected tokens' mean was 0.71-1.12x the chosen tokens' under rounding there, and 45x or more under a fault. So a
# probe over the absolute bounds passes when its rejected tokens differ no more than CONTROL_RATIO times its chosen
# tokens (mean and max), and the chosen tokens themselves stay within CONTROL_EPS of the dtype's epsilon (a packed
# forward that is wrong everywhere is not rounding). The tiny test models' faults are weaker (a mean of 4.5e-3 for
# positions that do not restart in bf16) but their rounding is near 0 on a CPU, so the absolute bounds catch them.
CONTROL_RATIO = 3.0
CONTROL_EPS = 2.0


@dataclass(frozen=True)
class ProbeVerdict:
    """The start-up probe's figures and decision: ``route`` is "absolute" (within `probe_tolerance`), "control"
    (within the chosen segment's own rounding, `CONTROL_RATIO`) or "failed"."""

    mean: float
    max: float
    chosen_mean: float
    chosen_max: float
    rejected_mean: float
    rejected_max: float
    route: str

    @property
    def ok(self) -> bool:
        return self.route != "failed"


def probe_verdict(chosen: torch.Tensor, rejected: torch.Tensor, dtype: torch.dtype) -> ProbeVerdict:
    """Decide the probe from the absolute per-token log-prob differences of its chosen and rejected tokens."""
    both = torch.cat([chosen.flatten(), rejected.flatten()]).float()
    c, r = chosen.float(), rejected.float()
    figures = [both.mean().item(), both.max().item(), c.mean().item(), c.max().item(), r.mean().item(), r.max().item()]
    mean, top, c_mean, c_max, r_mean, r_max = figures
    mean_tol, max_tol = probe_tolerance(dtype)
    if mean <= mean_tol and top <= max_tol:  # NaN fails every comparison
        route = "absolute"
    elif c_mean <= CONTROL_EPS * _eps(dtype) and r_mean <= CONTROL_RATIO * c_mean and r_max <= CONTROL_RATIO * c_max:
        route = "control"
    else:
        route = "failed"
    return ProbeVerdict(*figures, route=route)


def fp32_matmuls_in_tf32() -> bool:
    """Whether CUDA fp32 matmuls run in tf32, read through torch's newer ``fp32_precision`` flags where torch has them
    (they answer whichever API set it). The older ``allow_tf32`` / ``get_float32_matmul_precision`` raise once
    transformers' ``tf32: true`` has set the newer flag (torch >= 2.9: "mix of the legacy and new APIs")."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return matmul.fp32_precision == "tf32"
    return bool(matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"


def compute_dtype(weights: torch.dtype, device: torch.device) -> tuple[torch.dtype, str]:
    """The dtype whose rounding the maths of a forward on ``device`` runs in, and its name: the autocast dtype when
    autocast is on there (fp32 weights under bf16 mixed precision compute their matmuls in bf16), tf32 for fp32
    matmuls on a CUDA device that allows it (10 mantissa bits, as fp16: its dtype stands in), else the weights'."""
    kind = device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        return dtype, str(dtype).removeprefix("torch.")
    if weights == torch.float32 and kind == "cuda" and fp32_matmuls_in_tf32():
        return torch.float16, "tf32"
    return weights, str(weights).removeprefix("torch.")


# Set while DPOTrainer computes a loss or reference log-probs: only those calls carry the [chosen; rejected] layout.
_PAIR_CALL = contextvars.ContextVar("judgetrain_pair_call", default=False)


@contextlib.contextmanager
def _pair_call(mode: str = "auto"):
    """auto: pack where it computes less; force: pack every batch that can be packed (the start-up probe)."""
    token = _PAIR_CALL.set(mode)
    try:
        yield
    finally:
        _PAIR_CALL.reset(token)


# ----------------------------------------------------------------------------------------------- packing


@dataclass
class PackedPairs:
    """One row per pair; `gather` maps each position of TRL's (2B, L-1) per-token layout to a flat packed index."""

    input_ids: torch.Tensor  # (B, Lp)
    position_ids: torch.Tensor  # (B, Lp)
    segment: torch.Tensor  # (B, Lp): 0 prompt, 1 chosen, 2 rejected, -1 padding
    shift_labels: torch.Tensor  # (B, Lp): the token each position predicts, -100 where none is scored
    gather: torch.Tensor  # (2B, L-1), -1 where TRL's layout holds no scored token

    @property
    def tokens(self) -> int:
        return int((self.segment >= 0).sum())

    def attention_mask(self, dtype: torch.dtype | None) -> torch.Tensor:
        """(B, 1, Lp, Lp): causal, no padding keys, and the rejected segment blind to the chosen one. Boolean for
        sdpa; additive (0 / dtype min) when `dtype` is given, as eager attention adds the mask to the scores."""
        n = self.segment.size(1)
        idx = torch.arange(n, device=self.segment.device)
        causal = idx[None, :] <= idx[:, None]
        q_seg, k_seg = self.segment[:, :, None], self.segment[:, None, :]
        allowed = causal[None] & (k_seg >= 0) & ~((q_seg == 2) & (k_seg == 1))
        allowed = allowed[:, None]
        if dtype is None:
            return allowed
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def pack_pairs(input_ids: torch.Tensor, labels: torch.Tensor, pad_token_id: int = 0) -> PackedPairs | str:
    """Pack TRL's [chosen; rejected] batch (labels -100 outside the completions) into one row per pair, or return why
    it cannot be packed (the caller then runs the batch as TRL does)."""
    two_b, length = input_ids.shape
    if two_b % 2:
        return "the batch does not hold chosen and rejected rows in two halves"
    b = two_b // 2
    ids, lab = input_ids.tolist(), labels.tolist()
    rows, gathers = [], []
    for i in range(b):
        ci = [t for t, v in enumerate(lab[i]) if v != -100]
        ri = [t for t, v in enumerate(lab[b + i]) if v != -100]
        if not ci or not ri:
            return "a completion with no tokens left"
        n = ci[0]
        if n < 1 or ri[0] != n or ids[i][:n] != ids[b + i][:n]:
            return "the chosen and rejected rows of a pair do not share their prompt"
        if ci[-1] - n + 1 != len(ci) or ri[-1] - n + 1 != len(ri):
            return "a completion is not one contiguous span"
        chosen, rejected, last = ids[i][n : n + len(ci)], ids[b + i][n : n + len(ri)], ids[i][n - 1]
        a, r = len(chosen), len(rejected)
        rows.append((
            ids[i][: n - 1] + [last] + chosen[:-1] + [last] + rejected[:-1],
            list(range(n - 1)) + list(range(n - 1, n - 1 + a)) + list(range(n - 1, n - 1 + r)),
            [0] * (n - 1) + [1] * a + [2] * r,
            [-100] * (n - 1) + chosen + rejected,
        ))
        gathers.append((n, a, r))
    width = max(len(row[0]) for row in rows)
    fill = (pad_token_id, 0, -1, -100)
    cols = [[row[k] + [fill[k]] * (width - len(row[k])) for row in rows] for k in range(4)]
    gather = [[-1] * (length - 1) for _ in range(two_b)]
    for i, (n, a, r) in enumerate(gathers):
        base = i * width + n - 1
        gather[i][n - 1 : n - 1 + a] = range(base, base + a)
        gather[b + i][n - 1 : n - 1 + r] = range(base + a, base + a + r)
    dev = input_ids.device
    t = functools.partial(torch.tensor, dtype=torch.long, device=dev)
    return PackedPairs(t(cols[0]), t(cols[1]), t(cols[2]), t(cols[3]), t(gather))


def unpack_output(output, packed: PackedPairs):
    """Scatter the packed per-token fields back into TRL's (2B, L-1) layout (zero where no token is scored)."""
    valid = packed.gather >= 0
    index = packed.gather.clamp(min=0)
    fields = {}
    for name in PER_TOKEN_FIELDS:
        value = getattr(output, name, None)
        if value is not None:
            value = value.reshape(-1)[index]
            fields[name] = torch.where(valid, value, torch.zeros((), dtype=value.dtype, device=value.device))
    log_probs = fields["log_probs"]
    mask = fields.get("label_mask", valid)
    fields["loss"] = -log_probs.sum() / mask.sum().clamp(min=1)
    return type(output)(**fields, aux_loss=getattr(output, "aux_loss", None))


# ----------------------------------------------------------------------------------------------- the model call


def forward_cost(config):
    """(cost per token, cost per query-key pair) of one forward, in FLOPs: the matmul parameters a token passes
    through (x2) and the attention scores and values (4 x layers x query width). The packed row's attention is
    dense over all three segments, so for a short prompt under long completions it costs more than TRL's two rows."""
    c = config.get_text_config()
    h, layers = c.hidden_size, c.num_hidden_layers
    head_dim = getattr(c, "head_dim", None) or h // c.num_attention_heads
    dq, dkv = c.num_attention_heads * head_dim, (getattr(c, "num_key_value_heads", None) or c.num_attention_heads) * head_dim
    mlp = 3 * h * (getattr(c, "intermediate_size", None) or 4 * h)
    params = layers * (2 * h * dq + 2 * h * dkv + mlp) + h * c.vocab_size
    return 2 * params, 4 * layers * dq


def packing_pays(unpacked_shape: tuple[int, int], packed: PackedPairs, cost: tuple[float, float]) -> bool:
    """Whether the packed batch computes fewer FLOPs than TRL's padded [chosen; rejected] batch."""
    per_token, per_pair = cost
    rows, length = unpacked_shape
    p_rows, p_len = packed.input_ids.shape
    return p_rows * p_len * (per_token + per_pair * p_len) < rows * length * (per_token + per_pair * length)


def install_pair_forward(model, stats: dict) -> None:
    """Wrap `model.forward` (already patched with TRL's fused LM head) so that a DPO pair call runs packed."""
    if forward_is_wrapped(model):
        return
    inner = model.forward
    additive = attn_implementation(model.config) == "eager"
    pad_id = getattr(model.config, "pad_token_id", None) or 0
    cost = forward_cost(model.config)

    def forward(self, *args, **kwargs):
        if not (_PAIR_CALL.get() and kwargs.get("fused_lm_head") and not args and kwargs.get("labels") is not None):
            return inner(*args, **kwargs)
        extra = {k for k, v in kwargs.items() if v is not None} - {
            "input_ids", "attention_mask", "labels", "fused_lm_head", "use_cache", "output_attentions",
            "output_hidden_states", "return_dict"}
        packed = "inputs the packed forward does not handle: " + ", ".join(sorted(extra)) if extra else None
        if packed is None:
            packed = pack_pairs(kwargs["input_ids"], kwargs["labels"], pad_id)
        real = int(kwargs["attention_mask"].sum()) if kwargs.get("attention_mask") is not None else kwargs["input_ids"].numel()
        stats["tokens_unshared"] += real
        if isinstance(packed, str):
            stats["batches_fallback"] += 1
            if stats["batches_fallback"] == 1:
                logger.warning("prefix_sharing: a batch runs TRL's two-sequence forward: %s", packed)
            stats["tokens_computed"] += real
            return inner(*args, **kwargs)
        if _PAIR_CALL.get() != "force" and not packing_pays(tuple(kwargs["input_ids"].shape), packed, cost):
            stats["batches_unpacked_cheaper"] += 1  # short prompt, long completions: TRL's two rows cost less
            stats["tokens_computed"] += real
            return inner(*args, **kwargs)
        stats["batches_packed"] += 1
        stats["tokens_computed"] += packed.tokens
        dtype = self.dtype if additive else None
        rest = {k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask", "labels") and v is not None}
        out = inner(input_ids=packed.input_ids, attention_mask=packed.attention_mask(dtype),
                    position_ids=packed.position_ids, shift_labels=packed.shift_labels, **rest)
        return unpack_output(out, packed)

    wrap_fused_forward(model, inner, forward)


# ----------------------------------------------------------------------------------------------- the trainer


class PrefixSharingMixin:
    """Prefix sharing for a DPOTrainer subclass (`judgetrain.trainer.dpo.JudgeDPOTrainer`): deciding once the models
    carry TRL's fused head, installing the packed forward, and the start-up probe. The subclass calls
    `_init_prefix_sharing` before ``DPOTrainer.__init__``, `_setup_prefix_sharing` once its models carry TRL's fused
    head, and runs the calls that carry a [chosen; rejected] batch inside `_pair_calls`."""

    def _init_prefix_sharing(self, requested: bool) -> None:
        self.prefix_sharing_requested = bool(requested)
        self.prefix_sharing_stats = {"batches_packed": 0, "batches_unpacked_cheaper": 0, "batches_fallback": 0,
                                     "tokens_computed": 0, "tokens_unshared": 0}
        self.prefix_sharing: bool | None = None  # decided once the models carry TRL's fused head; None: not asked

    _probe_pending = False  # DeepSpeed / FSDP: the probe waits for the weights to be placed (the first step)

    def _pair_calls(self, training_step: bool = False):
        """The context of a call whose model forwards carry TRL's [chosen; rejected] layout. ``training_step``: a
        loss computed in training, where the weights are placed (DeepSpeed, FSDP): a probe still pending runs first;
        before it has run, calls take TRL's forward."""
        if self._probe_pending:
            if not training_step:
                return contextlib.nullcontext()
            self._probe_placed()
        return _pair_call() if self.prefix_sharing else contextlib.nullcontext()

    def _probe_placed(self) -> None:
        """The start-up probe under DeepSpeed / FSDP, at the first step (every rank: its forwards gather the sharded
        weights); prefix sharing stays on only where it passes on every process."""

        self._probe_pending = False
        reason = self._probe()
        if any_rank([reason is not None])[0]:
            reason = reason or "the start-up probe failed on another process"
            for m in self._models():
                unwrap_fused_forward(m)
            self.prefix_sharing = False
            logger.warning("prefix_sharing: OFF for this run: %s. Training uses TRL's two-sequence forward (same "
                           "results, each prompt computed twice).", reason)
        else:
            logger.info("prefix_sharing: the start-up probe passed at the first step (max abs diff %.2e)",
                        self.prefix_sharing_stats.get("probe_max_abs_diff", float("nan")))

    # -- deciding and installing
    def _models(self) -> list:

        policy = self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
        models = [policy]
        if self.ref_model is not None:
            models.append(self.accelerator.unwrap_model(self.ref_model))
        return models

    def _trainer_reason(self) -> str | None:

        if uses_vision_data(self):
            return "vision datasets"
        if isinstance(self.model, PeftModel) and self.model.active_peft_config.is_prompt_learning:
            return "prompt-learning PEFT prepends virtual tokens"
        if getattr(self, "aux_loss_enabled", False):
            return "the MoE load-balancing loss is computed over the unpacked 2D mask"
        pc = self.accelerator.parallelism_config
        if pc is not None and (getattr(pc, "cp_size", 1) > 1 or getattr(pc, "sp_size", 1) > 1):
            return "context/sequence parallelism shards the sequence"
        return None

    def _setup_prefix_sharing(self) -> None:
        if self.prefix_sharing is not None or not self.prefix_sharing_requested:
            return
        models = self._models()
        reason = self._trainer_reason() or next(filter(None, (prefix_sharing_problem(m.config) for m in models)), None)
        if reason is None:
            for m in models:
                install_pair_forward(m, self.prefix_sharing_stats)
            if self.is_deepspeed_enabled or self.is_fsdp_enabled:  # weights are placed/sharded only in train()
                self._probe_pending = True  # `_probe_placed`, at the first training step; TRL's forward until then
                logger.info("prefix_sharing: DeepSpeed/FSDP: the start-up probe runs at the first step, once the "
                            "weights are placed")
            else:
                reason = self._probe()
        self.prefix_sharing = reason is None
        if reason:
            for m in models:
                unwrap_fused_forward(m)  # TRL's fused forward, bound to the model
            logger.warning("prefix_sharing: OFF for this run: %s. Training uses TRL's two-sequence forward (same "
                           "results, each prompt computed twice).", reason)
        else:
            logger.info("prefix_sharing: on (%s, attn_implementation=%s): each prompt is computed once per pair",
                        models[0].config.model_type, attn_implementation(models[0].config))

    def _probe(self) -> str | None:
        """Run two synthetic pairs (`PROBE_PAIRS`) through TRL's forward and the packed one, under the training's
        autocast; their per-token log-probs must agree within the rounding of the dtype the maths runs in
        (`compute_dtype`, `probe_tolerance`). The chosen completions are the longest part, so a rejected one that
        sees them (a mask the attention ignores) or whose positions do not restart shows clearly."""
        policy = self._models()[0]
        vocab = policy.config.get_text_config().vocab_size
        g = torch.Generator().manual_seed(0)
        tok = lambda n: torch.randint(3, min(vocab, 1000), (n,), generator=g).tolist()  # noqa: E731
        examples = [{"prompt_ids": tok(p), "chosen_ids": tok(c), "rejected_ids": tok(r)} for p, c, r in PROBE_PAIRS]
        batch = self.data_collator(examples)
        device = next(policy.parameters()).device
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        labels = ids.masked_fill(batch["completion_mask"].to(device) == 0, -100)
        was_training = self.model.training
        self.model.eval()
        try:  # under the autocast training runs in (mixed precision), so in the dtype its maths uses
            with torch.no_grad(), self.accelerator.autocast():
                dtype, dtype_name = compute_dtype(policy.get_input_embeddings().weight.dtype, device)
                plain = self.model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True, use_cache=False)
                with _pair_call("force"):
                    shared = self.model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True, use_cache=False)
        except Exception as e:  # a model whose forward rejects position ids or a 4D mask
            return f"the packed forward failed on a probe pair ({type(e).__name__}: {e})"
        finally:
            self.model.train(was_training)
        if self.prefix_sharing_stats["batches_packed"] != 1:
            return "the probe pair did not run packed (the model's forward is not the one TRL patched)"
        self.prefix_sharing_stats.update(batches_packed=0, batches_unpacked_cheaper=0, tokens_computed=0, tokens_unshared=0)
        scored = labels[:, 1:] != -100
        diff = (shared.log_probs.float() - plain.log_probs.float()).abs()
        half = diff.size(0) // 2  # TRL's layout: the chosen rows, then the rejected rows
        v = probe_verdict(diff[:half][scored[:half]], diff[half:][scored[half:]], dtype)
        mean_tol, max_tol = probe_tolerance(dtype)
        self.prefix_sharing_stats.update(probe_mean_abs_diff=v.mean, probe_max_abs_diff=v.max,
                                         probe_chosen_mean_abs_diff=v.chosen_mean,
                                         probe_rejected_mean_abs_diff=v.rejected_mean, probe_route=v.route,
                                         probe_compute_dtype=dtype_name)
        if v.route == "control":
            logger.info("prefix_sharing: the probe's differences (mean %.2e, max %.2e) exceed %s's fixed bounds "
                        "(%.1e / %.1e) but are this model's rounding on this device: the rejected tokens (mean %.2e, "
                        "max %.2e) differ no more than %.0fx the chosen ones (mean %.2e, max %.2e), which a packed "
                        "forward computes exactly as TRL's", v.mean, v.max, dtype_name, mean_tol, max_tol,
                        v.rejected_mean, v.rejected_max, CONTROL_RATIO, v.chosen_mean, v.chosen_max)
        if not v.ok:
            return (f"{policy.config.model_type} gives different log-probs packed (mean abs diff {v.mean:.2e}, max "
                    f"{v.max:.2e} on the probe pairs, where {dtype_name} rounding allows {mean_tol:.1e} / "
                    f"{max_tol:.1e}; rejected tokens mean {v.rejected_mean:.2e} against the chosen tokens' "
                    f"{v.chosen_mean:.2e}): its attention does not honour the custom mask or position ids")
        return None

