"""What a row asks the scoring engine (`Request`) and what the engine answers (`RowScore`): plain dataclasses,
without torch, so that the suites (`judgetrain.eval.benchmarks`) build them and the metric functions stay numpy only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# the kinds whose responses are scored by their log-likelihood after the prompt: ``implicit`` (minus the reference's),
# ``loglik_sum`` (summed over the response tokens), ``loglik_mean`` (per response token)
LIKELIHOOD_KINDS = ("implicit", "loglik_sum", "loglik_mean")


@dataclass
class Request:
    """What one row asks the engine to score.

    kind ``implicit`` / ``loglik_sum`` / ``loglik_mean`` (`LIKELIHOOD_KINDS`): ``prompt`` (messages list or plain
    string) and ``responses`` (each an assistant message list, or a string). kind ``judge``: ``judge_prompts``, each a messages list that a judge answers.
    """

    kind: str
    prompt: Any = None
    responses: Sequence[Any] = ()
    judge_prompts: Sequence[Any] = ()
    row_index: int | None = None  # global row index (set by score_sharded)
    cache_key: str | None = None  # names the row across evals (set by runner.evaluate): its token ids are kept


@dataclass
class RowScore:
    """The engine's answer for one row: ``scores`` (one float per response, None when the row was skipped)."""

    scores: list[float] | None
    truncated: bool = False
    skipped: bool = False
    no_reference: bool = False  # implicit: the frozen reference cache has no value for it (skipped, counted apart)
