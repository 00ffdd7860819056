"""A trained judge as a reward function: TRL's ``reward_funcs`` (GRPOTrainer, OnlineDPOTrainer) and `judgetrain serve`.

    from judgetrain.rewards import JudgeReward
    reward = JudgeReward.from_folder("runs/quickstart", mode="implicit")
    trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=GRPOConfig(...), train_dataset=prompts)
    reward.card.against_base          # what was measured of this judge against its base, with intervals

TRL calls it with ``prompts``, ``completions`` (plain strings, or assistant message lists when the dataset is
conversational), ``completion_ids``, the dataset's other columns by name, ``trainer_state`` and (GRPO) ``log_metric``;
it returns one float per completion (None: the completion was left unscored, TRL's NaN). ``reward.as_async()`` is the
same reward as an async callable (TRL runs async reward functions side by side; the scoring runs in a worker thread).

Modes (``mode``), each a reading of the scoring engine (`judgetrain.eval.scoring`), so a reward equals what
`judgetrain eval` scores for the same texts:

- ``implicit``: the DPO implicit reward, sum over the completion's tokens of log pi(y|x) - log pi_ref(y|x) with the
  reference the base (the adapter disabled), RM-Bench's reading of a DPO-trained model; the completions of one prompt
  (a GRPO group) are one engine row, so the prompt runs once for all of them (prefix sharing).
- ``judge``: the judge-mode expected score (1 to 5) of the rubric prompt `judgetrain.eval.suites.rubric_prompt` shows
  the judge for each completion; one engine row per prompt, its common prefix run once.
- ``verdict``: the completion against a reference answer from a dataset column (``reference_column``), in the verdict
  prompt of the pairwise suites (the recipe's ``eval_pairwise_prompt``, else `judgetrain.data.pairwise.PAIRWISE_USER`)
  in both orders: in each, log p(the completion wins) - log p(the reference wins) of the verdicts ``[[A>B]]`` /
  ``[[B>A]]``, and the reward is their mean, so a constant lean to a position cancels. The share of completions whose
  verdict changed with the order is logged.

Lengths: the recipe's ``max_length`` (the judge's context without one) and its ``long_rows``: ``skip`` leaves a longer
completion unscored (None), every other rule cuts the prompt from the left, the completion's end kept (the engine's
``truncate_prompt``); both counted. Logged through ``log_metric`` on each call (``<name>/`` + ``reward_mean``,
``reward_std``, ``truncated``, ``skipped``, and in verdict mode ``order_changed``), and kept in ``reward.totals``;
``reward_std`` is the sample std (n - 1), as TRL's ``rewards/<name>/std`` (NaN for a single reward, as there).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from judgetrain.data.pairwise import PAIRWISE_USER, both_orders
from judgetrain.eval.benchmarks.base import rubric_prompt
from judgetrain.eval.benchmarks.verdicts import VERDICTS
from judgetrain.eval.requests import Request
from judgetrain.eval.scoring import ScoringEngine
from judgetrain.eval.suites import check_verdict_tokens
from judgetrain.rewards.card import JudgeCard, read_card
from judgetrain.rewards.loading import judge_source, load_judge
from judgetrain.utils.errors import BadInputError

logger = logging.getLogger(__name__)

REWARD_MODES = ("implicit", "judge", "verdict")
DEFAULT_NAME = "judge_reward"


def message_text(value: Any) -> str:
    """A prompt, completion or reference as text: a string as itself, a messages list as its contents joined by
    newlines (the text the judge's own prompts show, as `judgetrain.eval.suites.rubric_prompt` joins them)."""
    if isinstance(value, str):
        return value
    return "\n".join(str(m["content"]) for m in value)


def long_inputs_of(long_rows: str) -> str:
    """The engine's rule for a recipe's ``long_rows``: ``skip`` skips; every other rule keeps the completion's end."""
    return "skip" if long_rows == "skip" else "truncate_prompt"


@dataclass
class RewardCall:
    """What one call scored: a reward per completion (None: skipped), and the counts logged."""

    rewards: list[float | None]
    truncated: int = 0
    skipped: int = 0
    order_changed: int | None = None  # verdict mode: completions whose verdict changed with the order

    def metrics(self) -> dict[str, float]:
        values = [r for r in self.rewards if r is not None]
        out = {"reward_mean": float(np.mean(values)) if values else math.nan,
               "reward_std": float(np.std(values, ddof=1)) if len(values) > 1 else math.nan,
               "truncated": float(self.truncated), "skipped": float(self.skipped)}
        if self.order_changed is not None:
            scored = len(values)
            out["order_changed"] = self.order_changed / scored if scored else math.nan
        return out


@dataclass
class RewardTotals:
    """Counts over the reward's life (every call)."""

    calls: int = 0
    completions: int = 0
    truncated: int = 0
    skipped: int = 0
    order_changed: int = 0
    seconds: float = 0.0
    last: list[dict] = field(default_factory=list)  # the last call: {prompt, completion, reward} per completion

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "last"}


class JudgeReward:
    """A judge as a reward function (see the module doc). ``engine`` is the `ScoringEngine` that scores it."""

    def __init__(self, model: Any, tokenizer: Any, *, mode: str = "implicit", card: JudgeCard | None = None,
                 reference_column: str = "reference", max_length: int | None = None, long_rows: str = "truncate",
                 pairwise_prompt: str | None = None, batch_tokens: int = 8192, prefix_sharing: bool = True,
                 merge_lora: bool = True, ref_model: Any = None, name: str = DEFAULT_NAME) -> None:
        if mode not in REWARD_MODES:
            raise BadInputError(f"reward mode {mode!r}: one of {', '.join(REWARD_MODES)}")
        self.mode = mode
        self.card = card or JudgeCard(name=str(getattr(model, "name_or_path", type(model).__name__)))
        self.reference_column = reference_column
        self.pairwise_prompt = pairwise_prompt or PAIRWISE_USER
        self.__name__ = name  # TRL names the reward by it: rewards/<name>/mean
        self.engine = ScoringEngine(model, tokenizer, ref_model=ref_model,
                                    scoring="judge" if mode == "judge" else "implicit", max_length=max_length,
                                    long_inputs=long_inputs_of(long_rows), batch_tokens=batch_tokens,
                                    prefix_sharing=prefix_sharing, merge_lora=merge_lora)
        if mode == "implicit" and ref_model is None and not self.engine.has_adapter_reference:
            logger.warning("implicit reward of a full model without ref_model: the reward is the completion's "
                           "log-likelihood (no reference to subtract)")
        if mode == "verdict":
            check_verdict_tokens(tokenizer)  # the verdicts must tokenise apart, naming A and B (RecipeError)
        self.totals = RewardTotals()
        self._lock = threading.Lock()  # one scoring at a time: the engine and the model are shared

    @classmethod
    def from_folder(cls, folder: str, *, mode: str = "implicit", dtype: str = "auto", device: str | None = None,
                    trust_remote_code: bool = False, **kwargs: Any) -> JudgeReward:
        """The reward of a judge folder (`judgetrain.rewards.loading`): its recipe's ``max_length``, ``long_rows`` and
        ``eval_pairwise_prompt`` unless given in ``kwargs``, and its card. The folder is checked before any weights
        load (BadInputError)."""
        if mode not in REWARD_MODES:
            raise BadInputError(f"reward mode {mode!r}: one of {', '.join(REWARD_MODES)}")
        source = judge_source(folder)
        kwargs.setdefault("max_length", source.max_length)
        kwargs.setdefault("long_rows", source.long_rows)
        kwargs.setdefault("pairwise_prompt", source.pairwise_prompt)
        where = Path(source.adapter or source.model)
        card = read_card(where) if where.is_dir() else JudgeCard(name=source.folder)
        model, tokenizer = load_judge(source, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, mode=mode, card=card, **kwargs)

    # ------------------------------------------------------------------------------------------ TRL's interface
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None,
                 log_metric: Callable[[str, float], None] | None = None, **kwargs: Any) -> list[float | None]:
        references = kwargs.get(self.reference_column) if self.mode == "verdict" else None
        if self.mode == "verdict" and references is None:
            columns = sorted(k for k in kwargs if k not in ("trainer_state", "log_extra", "environments"))
            raise BadInputError(f"verdict reward: no column {self.reference_column!r} with the reference answers "
                                f"(the dataset's columns: {', '.join(columns) or 'none'}); set reference_column")
        call = self.score(prompts, completions, references)
        if log_metric is not None:
            for key, value in call.metrics().items():
                log_metric(f"{self.__name__}/{key}", value)
        return call.rewards

    def as_async(self) -> AsyncJudgeReward:
        """The same reward as an async callable (TRL awaits it beside its other async reward functions)."""
        return AsyncJudgeReward(self)

    # ------------------------------------------------------------------------------------------ scoring
    def score(self, prompts: Sequence[Any], completions: Sequence[Any],
              references: Sequence[Any] | None = None) -> RewardCall:
        """One reward per completion of ``prompts[i]``, ``completions[i]`` (and ``references[i]`` in verdict mode)."""
        check_inputs(prompts, completions, references, self.mode)
        with self._lock:
            t0 = time.perf_counter()
            if self.mode == "verdict":
                call = self._verdict(prompts, completions, references)
            else:
                call = self._pointwise(prompts, completions)
            self._count(call, prompts, completions, time.perf_counter() - t0)
        return call

    def _count(self, call: RewardCall, prompts: Sequence[Any], completions: Sequence[Any], seconds: float) -> None:
        t = self.totals
        t.calls += 1
        t.completions += len(call.rewards)
        t.truncated += call.truncated
        t.skipped += call.skipped
        t.order_changed += call.order_changed or 0
        t.seconds += seconds
        t.last = [{"prompt": p, "completion": c, "reward": r} for p, c, r in zip(prompts, completions, call.rewards)]

    def _pointwise(self, prompts: Sequence[Any], completions: Sequence[Any]) -> RewardCall:
        """Implicit / judge: one engine row per distinct prompt holding its completions (a GRPO group's prompt runs
        once); a truncated row's completions are counted one by one by their own length."""
        groups = group_by_prompt(prompts)
        if self.mode == "implicit":
            requests = [Request("implicit", prompt=prompts[idx[0]], responses=[completions[i] for i in idx])
                        for idx in groups]
        else:
            requests = [Request("judge", judge_prompts=[rubric_prompt(prompts[i], completions[i]) for i in idx])
                        for idx in groups]
        rows = self.engine.score_requests(requests)
        rewards: list[float | None] = [None] * len(prompts)
        call = RewardCall(rewards)
        for idx, req, row in zip(groups, requests, rows):
            if row.skipped or row.scores is None:
                call.skipped += len(idx)
                continue
            for slot, i in enumerate(idx):
                rewards[i] = float(row.scores[slot])
            if row.truncated:
                call.truncated += sum(self._over_length(req, slot) for slot in range(len(idx)))
        return call

    def _over_length(self, req: Request, slot: int) -> bool:
        """Whether one completion of a row the engine truncated is itself over ``max_length``, built by the engine's
        own sequence builder (the judge prompt with its score prefix, or TRL's prompt + completion)."""
        seqs = self.engine.sequences
        if req.kind == "judge":
            return len(seqs.judge_ids(req.judge_prompts[slot])) > seqs.max_length
        prompt_ids, [completion_ids] = seqs.pair_ids(req.prompt, [req.responses[slot]])
        return len(prompt_ids) + len(completion_ids) > seqs.max_length

    def _verdict(self, prompts: Sequence[Any], completions: Sequence[Any], references: Sequence[Any]) -> RewardCall:
        """Both orders of (completion, reference) in the verdict prompt; the mean of the completion's log-odds."""
        requests = []
        for p, c, ref in zip(prompts, completions, references):
            row = {"prompt": message_text(p), "response_a": message_text(c), "response_b": message_text(ref)}
            requests += [Request("loglik_sum", prompt=messages, responses=list(VERDICTS))
                         for _, messages in both_orders(row, user=self.pairwise_prompt)]
        rows = self.engine.score_requests(requests)
        rewards: list[float | None] = [None] * len(prompts)
        call = RewardCall(rewards, order_changed=0)
        for i in range(len(prompts)):
            first, second = rows[2 * i], rows[2 * i + 1]
            call.truncated += int(first.truncated or second.truncated)
            if first.scores is None or second.scores is None:
                call.skipped += 1
                continue
            shown_first = first.scores[0] - first.scores[1]  # the completion is A: [[A>B]] is its win
            shown_second = second.scores[1] - second.scores[0]  # the completion is B: [[B>A]] is its win
            rewards[i] = (shown_first + shown_second) / 2
            call.order_changed += int((shown_first > 0) != (shown_second > 0))
        return call


class AsyncJudgeReward:
    """`JudgeReward` as an async callable: the scoring runs in a worker thread, the event loop stays free."""

    def __init__(self, reward: JudgeReward) -> None:
        self.reward = reward
        self.__name__ = reward.__name__
        self.card = reward.card

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None,
                       log_metric: Callable[[str, float], None] | None = None, **kwargs: Any) -> list[float | None]:
        return await asyncio.to_thread(self.reward, prompts, completions, completion_ids, log_metric, **kwargs)


def group_by_prompt(prompts: Sequence[Any]) -> list[list[int]]:
    """Indices of equal prompts, in first-seen order (a GRPO group; online DPO's two completions of one prompt)."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(json.dumps(p, sort_keys=True, ensure_ascii=False), []).append(i)
    return list(groups.values())


def _is_text(value: Any) -> bool:
    """A string, or a messages list of {role, content: str}."""
    if isinstance(value, str):
        return True
    return isinstance(value, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                           and isinstance(m.get("role"), str) for m in value)


def unencodable(text: str) -> str | None:
    """Why ``text`` cannot be encoded (a lone surrogate, which JSON's ``\\ud800`` escapes can carry and no tokenizer
    takes), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"not valid Unicode text (a lone surrogate {text[err.start]!r} at character {err.start})"
    return None


def check_inputs(prompts: Sequence[Any], completions: Sequence[Any], references: Sequence[Any] | None,
                 mode: str) -> None:
    """BadInputError naming the first field that cannot be scored: lengths that differ, a value that is neither a
    string nor a messages list, text that cannot be encoded, a missing reference in verdict mode."""
    if len(prompts) != len(completions):
        raise BadInputError(f"{len(prompts)} prompts but {len(completions)} completions: one prompt per completion")
    if mode == "verdict" and (references is None or len(references) != len(completions)):
        got = "none" if references is None else len(references)
        raise BadInputError(f"verdict reward: {got} references for {len(completions)} completions: one per completion")
    fields = [("prompt", prompts), ("completion", completions)] + ([("reference", references)] if references else [])
    for what, values in fields:
        for i, value in enumerate(values):
            if not _is_text(value):
                raise BadInputError(f"{what} {i}: a string or a list of {{role, content}} messages, got "
                                    f"{type(value).__name__}")
            texts = [value] if isinstance(value, str) else [m[k] for m in value for k in ("role", "content")]
            why = next((w for w in map(unencodable, texts) if w), None)
            if why:
                raise BadInputError(f"{what} {i}: {why}")
