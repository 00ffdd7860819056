"""The scoring engine shared by the training callback and `judgetrain eval`.

A suite turns each of its rows into a `Request`: one prompt and several responses to score (RM-Bench: 3 chosen +
3 rejected; JudgeBias and Ideation: chosen + rejected), or several judge prompts (judge mode). The engine turns the
requests into token sequences (`judgetrain.eval.sequences`), batches them by length and returns one float per response:

- ``implicit``: sum over the response tokens of log pi(y|x) - log pi_ref(y|x), prompt tokens masked, chat template
  applied exactly as TRL 1.16's DPOTrainer tokenizes (prompt = chat template with ``add_generation_prompt=True``,
  completion = the rest of prompt+completion after their common prefix). With a peft model the reference is the
  same model under ``model.disable_adapter()``; otherwise a separate ``ref_model``; with neither, the score is the
  plain log-likelihood, warned and recorded as such (`ScoringEngine.reading`: ``loglik_sum``, never ``log_ratio``,
  so that no comparison sets it against a trained judge's log-ratio). Reference log-probs depend only on the token
  ids and the reference weights, which never change, so they are cached by sequence and computed once per eval set.
- ``loglik_sum``: sum of log pi(y|x) over the response tokens, no reference (a response's likelihood reading, and
  forced verdicts); ``loglik_mean``: the same sum divided by the response tokens scored. With a peft model both read
  the judge as it is (the adapter on): a base and a trained judge under one reading.
- ``judge``: the judge prompt is rendered with the chat template up to where an assistant turn's content starts as
  training renders it (Qwen3: after the empty think block, `judgetrain.models.templates.assistant_prefix`) and followed by a
  forced answer prefix (by default the JSON up to ``"overall_score": ``); the score is the expectation of the score over the next-token
  probabilities of the score tokens ("1".."5", plus the half steps the tokenizer has as single tokens), one forward
  pass. What the judge writes when it is let to write is the ``generate`` mode's (`judgetrain.eval.generate`).

Shared prompts (``prefix_sharing``, on by default): a row's prompt runs once and its key/value cache serves all of
the row's responses, and the token prefix common to a whole call (the chat template's opening, a judge rubric) runs
once; see `judgetrain.eval.sharing` for how, and for the models where the engine warns and scores every sequence
whole instead. The policy's LoRA layers run merged (``merge_lora``, `judgetrain.eval.merged`). Both give the same
scores as the plain path up to float rounding.

Inputs longer than ``max_length`` are never dropped silently: ``long_inputs="truncate_prompt"`` cuts the prompt from
the left (the response end, where the verdict is, stays), ``"skip"`` leaves the whole row unscored; both are counted.
Sharding: each process scores rows ``rank, rank + world, ...`` and the results are gathered in row order, so every
row is counted once whatever the process count.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object

from judgetrain.compat.transformers import base_model
from judgetrain.config.recipe import NO_REFERENCE_READING, PROXY_MODES, READINGS
from judgetrain.eval.batching import MIN_FILL, budget_batches
from judgetrain.eval.merged import merged_lora
from judgetrain.eval.requests import Request, RowScore
from judgetrain.eval.sequences import DEFAULT_JUDGE_PREFIX, SequenceBuilder, TokenSequence, as_ids
from judgetrain.eval.sharing import SharedScorer, count_forwards, plan_rows
from judgetrain.models.attention import prefix_sharing_problem

logger = logging.getLogger(__name__)

DEFAULT_SCORE_VALUES = tuple(x / 2 for x in range(2, 11))  # 1, 1.5, ..., 5


class EvalStopped(Exception):
    """A stop request (SIGTERM) seen between two scoring batches: the eval is abandoned, nothing of it is kept."""

    def __init__(self, batches: int):
        self.batches = batches
        super().__init__(f"stop requested: eval abandoned after {batches} scoring batches")


class StopPoints:
    """What the scoring engine and the generator share: before each forward or generate call (`_stop_point`) they ask
    ``stop_check`` (given at construction; None: never stop), and a True answer abandons the eval with `EvalStopped`,
    naming how many such points were passed (``_stop_points``). The same points count the forwards done for
    ``progress`` (`judgetrain.eval.runner.SuiteProgress`, given for one call: `ScoringEngine.score_requests`; None:
    nothing shown)."""

    stop_check: Any = None
    _stop_points: int = 0
    progress: Any = None

    def _stop_point(self) -> None:
        if self.progress is not None:
            self.progress.forward()
        if self.stop_check is None:
            return
        self._stop_points += 1
        if self.stop_check():
            raise EvalStopped(self._stop_points)


# values per logsumexp block: on a CPU a block of ~2 MB stays in cache between the passes; an accelerator takes large
# blocks (fewer kernel launches) and is bounded only by the float32 copy of a bf16 block
LOGSUMEXP_BLOCK_CPU = 1 << 19
LOGSUMEXP_BLOCK_ACCELERATOR = 1 << 26


@dataclass
class EngineStats:
    """Counters over the engine's life (the callback reuses one engine every epoch)."""

    policy_batches: int = 0
    ref_batches: int = 0  # reference forwards run; 0 on an epoch whose eval set was already cached
    ref_sequences_computed: int = 0
    ref_cache_hits: int = 0
    shared_prompts: int = 0  # prompts run once for all their sequences (policy and reference passes counted apart)
    whole_sequences: int = 0  # sequences scored whole (prefix sharing off or not applicable, a prompt cut alone)
    real_tokens: int = 0  # tokens of the sequences fed to the model
    padded_tokens: int = 0  # batch slots (batch size x longest sequence) actually computed
    sequences: int = 0
    # implicit sequences whose policy log-prob is the frozen reference's own (the weights have not changed since
    # the reference was scored: the eval_on_start of a full fine-tune with precompute_ref_log_probs), not run again
    policy_from_reference: int = 0
    # likelihood sequences whose policy log-prob another mode of the same evaluation scored (`sharing_policy_scores`:
    # implicit, loglik_sum and loglik_mean read one policy forward), not run again
    policy_shared: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class ScoringEngine(StopPoints):
    """Scores `Request`s with a policy (and reference) model; reuse one instance to reuse the reference cache.

    Args:
        model: a causal LM, optionally a peft model (then the reference is the model with the adapter disabled).
        tokenizer: its tokenizer (chat template used when it has one).
        ref_model: a separate reference model for implicit scoring without peft.
        scoring: one of `PROXY_MODES` (recorded; the requests carry their own kind).
        max_length: longest sequence fed to the model (None: the model's ``max_position_embeddings``).
        long_inputs: ``truncate_prompt`` or ``skip`` (see module doc).
        batch_tokens: budget of padded tokens per forward batch.
        max_batch_size: cap on sequences per batch.
        judge_prefix: forced answer prefix for judge scoring.
        score_values: candidate scores for judge scoring (kept when the tokenizer has them as one token).
        ref_key: names the reference weights in the cache key (defaults to the model's name_or_path).
        ref_cache: the reference log-prob cache, shared by engines that score with the same reference (e.g. the
            checkpoints of one run); its keys name the reference and the tokens. Default: a new, private cache.
        prefix_sharing: run each row's prompt (and the call's common prefix) once for all its sequences; False
            scores every sequence whole (the reference path the shared one is tested against).
        merge_lora: the policy's LoRA layers run as one merged matmul each (`judgetrain.eval.merged`; nothing is
            written into the model); False runs PEFT's two-path forward.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        ref_model: torch.nn.Module | None = None,
        scoring: str = "implicit",
        max_length: int | None = None,
        long_inputs: str = "truncate_prompt",
        batch_tokens: int = 8192,
        max_batch_size: int = 64,
        judge_prefix: str = DEFAULT_JUDGE_PREFIX,
        score_values: Sequence[float] = DEFAULT_SCORE_VALUES,
        ref_key: str | None = None,
        ref_cache: dict[str, float] | None = None,
        prefix_sharing: bool = True,
        merge_lora: bool = True,
        stop_check: Callable[[], bool] | None = None,
    ) -> None:
        if scoring not in PROXY_MODES:
            raise ValueError(f"scoring must be one of {PROXY_MODES}, got {scoring!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.ref_model = ref_model
        self.scoring = scoring
        self.batch_tokens = int(batch_tokens)
        self.max_batch_size = int(max_batch_size)
        self.score_values = tuple(score_values)
        if max_length is None:
            max_length = getattr(getattr(model, "config", None), "max_position_embeddings", None) or 4096
        # requests -> token sequences: the tokenizer, the length rule and the judge prefix live there
        self.sequences = SequenceBuilder(tokenizer, max_length=max_length, long_inputs=long_inputs,
                                         judge_prefix=judge_prefix)
        self.stats = EngineStats()
        self._ref_cache: dict[str, float] = {} if ref_cache is None else ref_cache
        self._ref_key = ref_key
        self._score_tokens: tuple[list[int], list[float]] | None = None
        self._warned_no_ref = False
        self.prefix_sharing = bool(prefix_sharing)
        self.merge_lora = bool(merge_lora)
        self._prefix_sharing_problems: dict[int, str | None] = {}
        # The reference of implicit scoring without an adapter or ref_model, changed only by the methods below
        # (`judgetrain.eval.reference` drives them): None scores log-likelihood (warned); "compute" scores the current
        # weights as the reference (`computing_reference`: the untrained policy, before the first step); "frozen"
        # reads the reference cache only (`freeze_reference`), and a sequence missing from it leaves its row unscored
        # (`RowScore.no_reference`), never scored against 0.
        self.policy_reference: str | None = None
        # True from `freeze_reference(..., policy_is_reference=True)` until `policy_updated` (the first optimizer
        # step): implicit sequences in the cache score exactly 0 without a policy forward
        self.policy_is_reference = False
        self.no_reference_sequences = 0
        # called before every forward; True stops the eval (`EvalStopped`). Under several processes it must be the
        # same collective on every rank (every rank runs the same number of forwards when scoring with ``sync``)
        self.stop_check = stop_check
        self._stop_points = 0
        # inside `sharing_policy_scores`: the policy's summed log-prob of each likelihood sequence scored, by its
        # token ids and first scored token; None outside (the weights may change between two evaluations)
        self._policy_cache: dict[tuple[int, bytes], float] | None = None

    @property
    def max_length(self) -> int:
        """Longest sequence fed to the model (`SequenceBuilder.max_length`)."""
        return self.sequences.max_length

    @max_length.setter
    def max_length(self, value: int) -> None:
        self.sequences.max_length = int(value)

    @property
    def long_inputs(self) -> str:
        return self.sequences.long_inputs

    @property
    def judge_prefix(self) -> str:
        """The forced answer prefix of judge scoring (`SequenceBuilder.judge_prefix`)."""
        return self.sequences.judge_prefix

    # ------------------------------------------------------------------------------------------ model access
    def set_model(self, model: torch.nn.Module) -> None:
        """Point the engine at the (possibly re-wrapped) policy; the reference cache stays valid."""
        self.model = model

    # ------------------------------------------------------------------------------------------ the policy reference
    @contextlib.contextmanager
    def computing_reference(self):
        """Inside: the current weights are implicit scoring's reference (`judgetrain.eval.reference.score_reference`
        fills the reference cache with them); after, the reference is frozen on that cache."""
        self.policy_reference = "compute"
        try:
            yield self
        finally:
            self.policy_reference = "frozen"

    def freeze_reference(self, values: dict[str, float] | None = None, *, policy_is_reference: bool = False) -> None:
        """Implicit scoring reads its reference from the cache only, with ``values`` (log-probs by sequence key: a
        resumed run's file, or every process's share of the reference pass) added to it. ``policy_is_reference``: the
        policy still has the weights the reference was scored with (until `policy_updated`)."""
        if values:
            self._ref_cache.update(values)
        self.policy_reference = "frozen"
        self.policy_is_reference = policy_is_reference

    @contextlib.contextmanager
    def sharing_policy_scores(self):
        """Inside: the policy's weights do not change, so a likelihood sequence's summed log-prob is computed once
        and read by every mode that scores it (implicit before its reference is subtracted, loglik_sum, and
        loglik_mean before its division): one policy forward for the three readings. Cleared on exit."""
        outer = self._policy_cache is not None
        if not outer:
            self._policy_cache = {}
        try:
            yield self
        finally:
            if not outer:
                self._policy_cache = None

    @staticmethod
    def _policy_key(s: TokenSequence) -> tuple[int, bytes]:
        return s.start, np.asarray(s.ids, dtype=np.int64).tobytes()

    def policy_updated(self) -> None:
        """An optimizer step changed (or is about to change) the policy: it is no longer its own reference."""
        self.policy_is_reference = False

    @property
    def reference_values(self) -> dict[str, float]:
        """The reference log-probs held (sequence key -> log-prob): what a resume reads back."""
        return self._ref_cache

    @property
    def has_reference(self) -> bool:
        """Whether implicit scoring has a reference to subtract: an adapter to disable, a ``ref_model``, or the
        policy's own reference (`computing_reference`, `freeze_reference`)."""
        return self.ref_model is not None or self.has_adapter_reference or self.policy_reference is not None

    def reading(self, mode: str) -> str:
        """What this engine's figures of ``mode`` are (`judgetrain.config.recipe.READINGS`): implicit without a
        reference is the summed log-likelihood (`NO_REFERENCE_READING`), not a log-ratio."""
        if mode == "implicit" and not self.has_reference:
            return NO_REFERENCE_READING
        return READINGS.get(mode, mode)

    @property
    def has_adapter_reference(self) -> bool:
        return hasattr(self.model, "disable_adapter") and bool(getattr(self.model, "peft_config", None))

    def _reference_namespace(self) -> str:
        if self._ref_key is not None:
            return self._ref_key
        if self.ref_model is not None:
            return "ref:" + str(getattr(self.ref_model, "name_or_path", id(self.ref_model)))
        base = base_model(self.model)
        return "base:" + str(getattr(base, "name_or_path", id(base)))

    @property
    def _pad_id(self) -> int:
        tok = self.tokenizer
        for cand in (tok.pad_token_id, tok.eos_token_id, 0):
            if cand is not None:
                return int(cand)
        return 0

    def score_token_ids(self) -> tuple[list[int], list[float]]:
        """(token ids, score values) of the candidate score tokens after the judge prefix."""
        if self._score_tokens is None:
            self._score_tokens = self._find_score_tokens()
        return self._score_tokens

    def _find_score_tokens(self) -> tuple[list[int], list[float]]:
        tok = self.tokenizer

        def encode(text: str) -> list[int]:
            return as_ids(tok(text=text, add_special_tokens=False))

        for prefix, lead in ((self.judge_prefix, ""), (self.judge_prefix.rstrip(), " ")):
            base = encode(prefix)
            ids, values = [], []
            for value in self.score_values:
                text = f"{value:g}"
                full = encode(prefix + lead + text)
                if full[: len(base)] == base and len(full) == len(base) + 1 and full[-1] not in ids:
                    ids.append(full[-1])
                    values.append(float(value))
            if len(ids) >= 2:
                if prefix != self.judge_prefix:
                    self.sequences.judge_prefix = prefix  # the score token carries the space
                logger.info("judge scoring: %d score tokens %s", len(ids), values)
                return ids, values
        raise ValueError(
            f"the tokenizer has no single-token scores after the judge prefix {self.judge_prefix!r}; "
            "score this model in implicit or generate mode (recipe key eval_scoring, `judgetrain eval --eval_scoring "
            "implicit`), or from Python give ScoringEngine other score_values or judge_prefix"
        )

    # ------------------------------------------------------------------------------------------ batching
    def _batches(self, seqs: list[TokenSequence]) -> list[list[TokenSequence]]:
        """Sorted length buckets: longest first, a batch grows while batch size x longest <= batch_tokens and each
        sequence is at least `MIN_FILL` of the longest."""
        order = sorted(seqs, key=lambda s: (-len(s.ids), s.row, s.slot))
        return budget_batches(order, lambda s: len(s.ids), self.batch_tokens, self.max_batch_size, min_fill=MIN_FILL)

    def _collate(self, batch: list[TokenSequence], device: torch.device):
        longest = max(len(s.ids) for s in batch)
        ids = torch.full((len(batch), longest), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for i, s in enumerate(batch):  # left padding: every sequence ends at the last column
            ids[i, longest - len(s.ids) :] = torch.tensor(s.ids, dtype=torch.long)
            mask[i, longest - len(s.ids) :] = 1
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        self.stats.real_tokens += int(mask.sum())
        self.stats.padded_tokens += ids.numel()
        return ids.to(device), mask.to(device), position_ids.to(device)

    @staticmethod
    def _supports_logits_to_keep(model: torch.nn.Module) -> bool:
        try:
            return "logits_to_keep" in inspect.signature(base_model(model).forward).parameters
        except (TypeError, ValueError):
            return False

    def _forward(self, model: torch.nn.Module, batch: list[TokenSequence], keep: int) -> torch.Tensor:
        device = next(model.parameters()).device
        ids, mask, pos = self._collate(batch, device)
        kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        if self._supports_logits_to_keep(model):
            kwargs["logits_to_keep"] = keep
        logits = model(**kwargs).logits
        return logits[:, -keep:, :], ids

    def _sequence_logps(self, model: torch.nn.Module, batch: list[TokenSequence]) -> list[float]:
        """Sum of log-probs of each sequence's scored tokens (positions >= start)."""
        keep = max(len(s.ids) - s.start for s in batch) + 1
        logits, ids = self._forward(model, batch, keep)
        longest = ids.shape[1]
        targets = ids[:, longest - keep + 1 :]
        # log p(target) = logit[target] - logsumexp(logits): no (B, positions, vocab) log-softmax tensor to build
        # only to read one value per position (24% of engine time went there; judgetrain bench)
        token_logps = self._token_logps(logits[:, :-1, :], targets)  # (B, keep-1)
        out = []
        for i, s in enumerate(batch):
            n_scored = len(s.ids) - s.start
            vals = token_logps[i, token_logps.shape[1] - n_scored :] if n_scored else token_logps[i, :0]
            out.append(float(vals.double().sum()))
        return out

    @staticmethod
    def _token_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(target) per position = logit[target] - logsumexp(logits), over blocks of positions.

        No (B, positions, vocab) log-softmax tensor is built only to read one value per position, and the
        logsumexp runs on blocks of about `LOGSUMEXP_BLOCK_CPU` values: on a CPU its four passes (max, subtract, exp,
        sum) then stay in cache, 2.5x faster than one pass over the whole tensor (the same values, bit for bit);
        a bf16 model's logits are made float32 one block at a time."""
        out = torch.empty(targets.shape, dtype=torch.float32, device=logits.device)
        block = LOGSUMEXP_BLOCK_CPU if logits.device.type == "cpu" else LOGSUMEXP_BLOCK_ACCELERATOR
        step = max(1, block // logits.shape[-1])
        for b in range(logits.shape[0]):  # blocks of one row's positions: views, no copy of a sliced logits tensor
            for i in range(0, logits.shape[1], step):
                lg = logits[b, i: i + step].float()
                torch.sub(lg.gather(-1, targets[b, i: i + step, None]).squeeze(-1), torch.logsumexp(lg, dim=-1),
                          out=out[b, i: i + step])
        return out

    def _judge_value(self, last_logits: torch.Tensor) -> torch.Tensor:
        """Expected score from the logits after a judge prompt (B, vocab) -> (B,)."""
        token_ids, values = self.score_token_ids()
        probs = torch.softmax(last_logits.float(), dim=-1)[:, token_ids]
        vals = torch.tensor(values, dtype=probs.dtype, device=probs.device)
        return (probs * vals).sum(-1) / probs.sum(-1).clamp_min(1e-30)

    def _judge_scores(self, model: torch.nn.Module, batch: list[TokenSequence]) -> list[float]:
        logits, _ = self._forward(model, batch, 1)
        return [float(x) for x in self._judge_value(logits[:, -1, :])]

    # ------------------------------------------------------------------------------------------ shared or whole
    def _prefix_sharing_problem(self, model: torch.nn.Module) -> str | None:
        """Why prefix sharing cannot run on this model (checked once per model, warned once)."""
        if id(model) not in self._prefix_sharing_problems:
            problem = prefix_sharing_problem(model, cache=True)
            self._prefix_sharing_problems[id(model)] = problem
            if problem is not None:
                logger.warning("prefix sharing off for %s: %s; every sequence is scored whole (slower, same scores)",
                               type(model).__name__, problem)
        return self._prefix_sharing_problems[id(model)]

    def _policy_forwards(self, model: torch.nn.Module):
        """LoRA layers run merged for the policy's forwards (`judgetrain.eval.merged`) unless ``merge_lora`` is off."""
        if not self.merge_lora:
            return contextlib.nullcontext(0)

        return merged_lora(model)

    def _score_sequences(self, model: torch.nn.Module, seqs: list[TokenSequence], judge: bool, sync: bool) -> tuple[dict, int]:
        """Score sequences ({(row, slot): value}) and return how many forwards ran. Rows whose sequences share their
        prompt go through `judgetrain.eval.sharing`; the rest in length buckets. With sharded weights (``sync``) every
        rank runs as many forwards as the busiest one (padding forwards, results thrown away)."""

        shared_rows, whole = [], list(seqs)
        if self.prefix_sharing and seqs and self._prefix_sharing_problem(model) is None:
            shared_rows, whole = plan_rows(seqs, judge)
        self.stats.shared_prompts += len(shared_rows)
        self.stats.whole_sequences += len(whole)
        batches = self._batches(whole)
        n_forwards = count_forwards(shared_rows, self.batch_tokens, self.max_batch_size) + len(batches)
        n_total = n_forwards
        if sync:
            n_total = max(gather_object([n_forwards]))
        if self.progress is not None:
            self.progress.stage(n_total)
        out: dict[tuple[int, int], float] = {}
        if shared_rows:
            scorer = SharedScorer(model, self._pad_id, self.stats, self._token_logps, self._judge_value,
                                  self._supports_logits_to_keep(model))
            scorer.before_forward = self._stop_point
            out.update(scorer.score(shared_rows, judge, self.batch_tokens, self.max_batch_size))
        fn = self._judge_scores if judge else self._sequence_logps
        for batch in batches:
            self._stop_point()
            out.update(((s.row, s.slot), v) for s, v in zip(batch, fn(model, batch)))
        for _ in range(n_total - n_forwards):  # padding forward for FSDP / ZeRO-3
            self._stop_point()
            self._sequence_logps(model, [TokenSequence(-1, 0, [self._pad_id, self._pad_id], 1)])
        return out, n_forwards

    # ------------------------------------------------------------------------------------------ scoring
    @torch.no_grad()  # not inference_mode: the model is the live training model (see generate.py)
    def score_requests(self, requests: Sequence[Request], *, sync: bool = False,
                       progress: Any = None) -> list[RowScore]:
        """Score the requests held by this process (no communication unless ``sync``); ``progress`` counts this
        call's forwards (`judgetrain.eval.runner.SuiteProgress`; None: nothing shown)."""
        t0 = time.perf_counter()
        self._stop_points = 0  # forwards of this call (named when a stop request ends it)
        self.progress = progress
        model = self.model
        was_training = model.training
        model.eval()
        try:
            seqs, rows = self.sequences.build(requests)
            self.stats.sequences += len(seqs)
            kinds = {r: req.kind for r, req in enumerate(requests)}
            judge = [s for s in seqs if kinds[s.row] == "judge"]
            lik = [s for s in seqs if kinds[s.row] != "judge"]
            implicit = [s for s in lik if kinds[s.row] == "implicit"]
            if self.policy_is_reference and self.policy_reference == "frozen":
                self._key_sequences(implicit)
                reused = {id(s) for s in implicit if s.key in self._ref_cache}
                for s in implicit:
                    if id(s) in reused:
                        rows[s.row].scores[s.slot] = self._ref_cache[s.key]
                lik = [s for s in lik if id(s) not in reused]
                self.stats.policy_from_reference += len(reused)
            todo, keys = lik, {}
            if self._policy_cache is not None:  # another mode of this evaluation scored the same sequences
                keys = {id(s): self._policy_key(s) for s in lik}
                todo = []
                for s in lik:
                    if keys[id(s)] in self._policy_cache:
                        rows[s.row].scores[s.slot] = self._policy_cache[keys[id(s)]]
                    else:
                        todo.append(s)
                self.stats.policy_shared += len(lik) - len(todo)
            # under sync every rank runs each stage (collectives), even with nothing of its own to score
            with self._policy_forwards(model):
                for group, is_judge in ((judge, True), (todo, False)):
                    if sync or group:
                        values, n_forwards = self._score_sequences(model, group, is_judge, sync)
                        self.stats.policy_batches += n_forwards
                        for (r, slot), v in values.items():
                            rows[r].scores[slot] = v
                        if not is_judge and self._policy_cache is not None:
                            self._policy_cache.update((keys[id(s)], values[(s.row, s.slot)])
                                                      for s in group if (s.row, s.slot) in values)
            for s in lik:  # the per-token reading: the sum over the response tokens scored, divided by their count
                if kinds[s.row] == "loglik_mean" and rows[s.row].scores is not None:
                    rows[s.row].scores[s.slot] /= max(len(s.ids) - s.start, 1)
            if sync or implicit:
                ref = self._reference_logps(implicit, sync)
                for s in implicit:
                    if rows[s.row].no_reference:
                        continue
                    if s.key in ref:
                        rows[s.row].scores[s.slot] -= ref[s.key]
                    else:  # frozen reference without this sequence: the row has no reference, so no score
                        rows[s.row] = RowScore(None, skipped=True, no_reference=True)
        finally:
            self.progress = None
            if was_training:
                model.train()
        self.stats.seconds += time.perf_counter() - t0
        return rows

    def _key_sequences(self, seqs: list[TokenSequence]) -> None:
        """Each sequence's reference-cache key: its token ids, where its completion starts, the reference's name."""
        namespace = self._reference_namespace()
        for s in seqs:
            s.key = _reference_key(np.asarray(s.ids, dtype=np.int64).tobytes(), s.start, namespace)

    @property
    def scores_its_own_reference(self) -> bool:
        """Whether the policy is a base model alone (no adapter, no ``ref_model``, no reference of its own): the
        reference of implicit scoring for any adapter trained on it, whose likelihood sequences' log-probs
        (`policy_values_as_reference`) another evaluation can subtract instead of scoring the base again."""
        return self.ref_model is None and not self.has_adapter_reference and self.policy_reference is None

    def policy_values_as_reference(self) -> dict[str, float]:
        """Inside `sharing_policy_scores`: every likelihood sequence's policy log-prob scored so far, keyed as the
        reference cache of an adapter on this model keys it (the tokens, where the completion starts, the base's
        name: `_key_sequences`)."""
        if self._policy_cache is None:
            raise RuntimeError("policy_values_as_reference reads the policy cache of sharing_policy_scores")
        namespace = self._reference_namespace()
        return {_reference_key(ids, start, namespace): value for (start, ids), value in self._policy_cache.items()}

    def _reference_logps(self, seqs: list[TokenSequence], sync: bool) -> dict[str, float]:
        self._key_sequences(seqs)
        todo, seen = [], set()
        for s in seqs:
            if s.key in self._ref_cache or s.key in seen:
                self.stats.ref_cache_hits += 1
            else:
                seen.add(s.key)
                todo.append(s)
        if self.ref_model is not None:
            ref, ctx = self.ref_model, contextlib.nullcontext
            ref.eval()
        elif self.has_adapter_reference:
            ref, ctx = self.model, self.model.disable_adapter
        elif self.policy_reference == "compute":  # the current weights are the reference (before the first step)
            ref, ctx = self.model, contextlib.nullcontext
        elif self.policy_reference == "frozen":
            missing = {s.key for s in todo}
            if missing:
                self.no_reference_sequences += len(missing)
                logger.warning("implicit scoring: %d eval sequences have no reference log-prob (their rows were not in "
                               "the eval set when the run started and its reference was scored): those rows are left "
                               "unscored and counted as n_no_reference", len(missing))
            return self._ref_cache
        else:
            if not self._warned_no_ref:
                logger.warning("implicit scoring without a reference (no peft adapter, no ref_model): its figures are "
                               "the summed log-likelihood, recorded as reading %s, never compared with a trained "
                               "judge's log-ratio; score such a judge with --eval_scoring loglik_sum or loglik_mean",
                               NO_REFERENCE_READING)
                self._warned_no_ref = True
            return {s.key: 0.0 for s in seqs}

        with ctx():
            values, n_forwards = self._score_sequences(ref, todo, False, sync)
        self.stats.ref_batches += n_forwards
        self.stats.ref_sequences_computed += len(todo)
        for s in todo:
            self._ref_cache[s.key] = values[(s.row, s.slot)]
        return self._ref_cache

    def clear_reference_cache(self) -> None:
        self._ref_cache.clear()


def _reference_key(ids: bytes, start: int, namespace: str) -> str:
    """A sequence's key in the reference cache: its token ids (int64 bytes), where its completion starts, and the
    reference's name."""
    h = hashlib.blake2b(ids, digest_size=16)
    h.update(f"|{start}|{namespace}".encode())
    return h.hexdigest()


# Strided, not accelerate's PartialState.split_between_processes (contiguous chunks): suite rows come grouped by
# domain (RM-Bench: chat, code, safety), so chunks give the busiest rank 1.3-1.4x the mean text at 4-8 processes on
# the bundled RM-Bench (stride: 1.05-1.08).
def shard_indices(n_rows: int, rank: int, world: int) -> list[int]:
    """Rows this process scores: rank, rank + world, ... (every row exactly once over the processes)."""
    return list(range(rank, n_rows, world))


def score_sharded(engine: ScoringEngine, requests: Sequence[Request], state: Any | None = None,
                  progress: Any = None) -> tuple[list[RowScore], list[int] | None]:
    """Score all requests split over the processes of ``state`` (accelerate PartialState); every process gets all
    row results back, in row order. Returns (row scores, rows each process scored; None in one process).
    ``progress``: as `ScoringEngine.score_requests`."""
    if state is None or state.num_processes == 1:
        return engine.score_requests(requests, progress=progress), None

    mine = shard_indices(len(requests), state.process_index, state.num_processes)
    local = [requests[i] for i in mine]
    for i, req in zip(mine, local):
        req.row_index = i
    scored = engine.score_requests(local, sync=True, progress=progress)
    gathered = gather_object([(i, s, state.process_index) for i, s in zip(mine, scored)])
    out: list[RowScore | None] = [None] * len(requests)
    rows_per_rank = [0] * state.num_processes
    for i, s, rank in gathered:
        if out[i] is not None:
            raise RuntimeError(f"sharded scoring scored row {i} twice")
        out[i] = s
        rows_per_rank[rank] += 1
    missing = [i for i, s in enumerate(out) if s is None]
    if missing:
        raise RuntimeError(f"sharded scoring lost rows {missing[:10]}")
    return out, rows_per_rank  # type: ignore[return-value]
