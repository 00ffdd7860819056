"""The zero-shot readings of a probe set, every forward pass batched through the scoring engine
(`judgetrain.eval.scoring.ScoringEngine`).

- ``implicit``: the log-likelihood of each text as the assistant's turn after its sample's question (the user turn of
  the sample's template with the text left out): a base model has no reference, so what implicit mode reads of it is
  its plain log-likelihood (the engine's ``loglik`` requests: one per sample, its texts as the responses, the question
  run once), named by its readings as everywhere else: per token (``loglik_mean``: the sum over the text's tokens
  divided by their number) and summed (``loglik_sum``).
- ``judge``: the expected overall score of the judge prompt holding the text (the item's own prompt; the source's is
  its sample's template around it), read after the engine's forced score prefix.
- ``verdict``: the verdict prompt of the pairwise suites (`judgetrain.data.pairwise.verdict_messages`: the question,
  then the two texts as assistants A and B) in both orders; in each, the likelier of ``[[A>B]]`` and ``[[B>A]]`` is
  the verdict. ``verdict``: the share of the two orders whose verdict picks the better text; ``verdict_both``: 1 when
  both do. Cross pairs are many (every rewrite against every error copy of a source): verdict mode reads at most
  ``verdict_cross`` rewrites per error copy, drawn with the seed.

A pointwise figure is 1 where the better text's score is strictly higher, 0 otherwise (a tie is wrong, as in every
figure of judgetrain), NaN where the engine left a text unscored.
"""

from __future__ import annotations

import logging
import random
import sys
from dataclasses import dataclass, field

import numpy as np

from judgetrain.data.pairwise import verdict_messages
from judgetrain.eval.benchmarks.verdicts import VERDICTS, swap_verdict, verdict_from_scores
from judgetrain.eval.requests import Request
from judgetrain.eval.scoring import ScoringEngine
from judgetrain.eval.sequences import SequenceBuilder
from judgetrain.probe.pairs import ProbeSet

logger = logging.getLogger(__name__)

MODE_METHODS = {"implicit": ("loglik_mean", "loglik_sum"), "judge": ("judge",),
                "verdict": ("verdict", "verdict_both")}


@dataclass
class Readings:
    """Per text: the summed log-likelihood, its token count, the judge's expected score (NaN: not read). Per pair
    read in verdict mode (its index in `ProbeSet.pairs`): whether each order's verdict picks the better text."""

    loglik: np.ndarray
    n_tokens: np.ndarray
    judge: np.ndarray
    verdicts: dict[int, tuple[float, float]] = field(default_factory=dict)


def user_turn(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def response_sequences(tokenizer, probe: ProbeSet) -> list[tuple[list[int], int]]:
    """(token ids, where the text's tokens start) of each text after its question, built as the engine builds an
    implicit row (`judgetrain.eval.sequences.SequenceBuilder`: TRL's DPOTrainer ids under a chat template, TRL's plain
    text path without one), whole: no length cut."""
    builder = SequenceBuilder(tokenizer, max_length=sys.maxsize)
    requests = [Request("implicit", prompt=user_turn(probe.questions[t.sample_id]), responses=[t.text])
                for t in probe.texts]
    seqs, _ = builder.build(requests)
    return [(s.ids, s.start) for s in seqs]


def _by_sample(probe: ProbeSet) -> dict:
    rows: dict = {}
    for i, t in enumerate(probe.texts):
        rows.setdefault(t.sample_id, []).append(i)
    return rows


def read_loglik(engine: ScoringEngine, probe: ProbeSet) -> np.ndarray:
    """The summed log-likelihood of every text after its question: one engine row per sample."""
    rows = _by_sample(probe)
    requests = [Request("loglik_sum", prompt=user_turn(probe.questions[sid]),
                        responses=[probe.texts[i].text for i in idx]) for sid, idx in rows.items()]
    return _spread(engine.score_requests(requests), rows, len(probe.texts))


def read_judge(engine: ScoringEngine, probe: ProbeSet) -> np.ndarray:
    """The judge's expected overall score of every text's judge prompt: one engine row per sample."""
    rows = _by_sample(probe)
    requests = [Request("judge", judge_prompts=[probe.judge_prompts[i] for i in idx]) for idx in rows.values()]
    return _spread(engine.score_requests(requests), rows, len(probe.texts))


def _spread(scored, rows: dict, n: int) -> np.ndarray:
    out = np.full(n, np.nan)
    for row, idx in zip(scored, rows.values()):
        if row.scores is not None:
            out[idx] = row.scores
    return out


def verdict_pairs(probe: ProbeSet, verdict_cross: int, seed: int) -> list[int]:
    """The pairs verdict mode reads: every error and represent pair, and of the cross pairs at most
    ``verdict_cross`` per error copy (its rewrites drawn with ``seed``)."""
    chosen, cross = [], {}
    for i, p in enumerate(probe.pairs):
        if p.kind == "cross":
            cross.setdefault(p.worse, []).append(i)
        else:
            chosen.append(i)
    for worse, idx in cross.items():
        rng = random.Random(f"{seed}|{probe.texts[worse].sample_id}|{worse}")
        chosen += sorted(rng.sample(idx, min(verdict_cross, len(idx))))
    return sorted(chosen)


def read_verdicts(engine: ScoringEngine, probe: ProbeSet, pair_index: list[int]) -> dict[int, tuple[float, float]]:
    """Per pair: (the AB verdict picks the better text, the BA verdict does), 1.0 / 0.0, NaN where unscored. AB
    shows the better text as A."""
    requests = []
    for i in pair_index:
        p = probe.pairs[i]
        question, better, worse = probe.questions[p.sample_id], probe.texts[p.better].text, probe.texts[p.worse].text
        requests += [Request("loglik_sum", prompt=verdict_messages(question, better, worse), responses=list(VERDICTS)),
                     Request("loglik_sum", prompt=verdict_messages(question, worse, better), responses=list(VERDICTS))]
    scored = engine.score_requests(requests)
    out = {}
    for k, i in enumerate(pair_index):
        ab, ba = scored[2 * k].scores, scored[2 * k + 1].scores
        right_ab = np.nan if ab is None else float(verdict_from_scores(*ab) == "A>B")
        right_ba = np.nan if ba is None else float(swap_verdict(verdict_from_scores(*ba)) == "A>B")
        out[i] = (right_ab, right_ba)
    return out


def better_share(scores: np.ndarray, probe: ProbeSet) -> np.ndarray:
    """Per pair: 1.0 where the better text scores strictly higher, 0.0 where not, NaN where either is unscored."""
    better = scores[[p.better for p in probe.pairs]]
    worse = scores[[p.worse for p in probe.pairs]]
    out = (better > worse).astype(np.float64)
    out[~(np.isfinite(better) & np.isfinite(worse))] = np.nan
    return out


def pair_values(probe: ProbeSet, readings: Readings, modes: list[str]) -> dict[str, np.ndarray]:
    """{method: per-pair 1 / 0 / NaN} of the modes read (`MODE_METHODS`)."""
    out: dict[str, np.ndarray] = {}
    if "implicit" in modes:
        out["loglik_mean"] = better_share(readings.loglik / np.maximum(readings.n_tokens, 1), probe)
        out["loglik_sum"] = better_share(readings.loglik, probe)
    if "judge" in modes:
        out["judge"] = better_share(readings.judge, probe)
    if "verdict" in modes:
        mean, both = np.full(len(probe.pairs), np.nan), np.full(len(probe.pairs), np.nan)
        for i, (ab, ba) in readings.verdicts.items():
            mean[i], both[i] = (ab + ba) / 2, float(ab == 1.0 and ba == 1.0) if np.isfinite(ab + ba) else np.nan
        out["verdict"], out["verdict_both"] = mean, both
    return out


def read_all(engine: ScoringEngine, probe: ProbeSet, modes: list[str], n_tokens: np.ndarray, *,
             verdict_cross: int, seed: int) -> Readings:
    """Every mode of ``modes`` read (the others left NaN)."""
    n = len(probe.texts)
    readings = Readings(np.full(n, np.nan), n_tokens, np.full(n, np.nan))
    if "implicit" in modes:
        readings.loglik = read_loglik(engine, probe)
    if "judge" in modes:
        readings.judge = read_judge(engine, probe)
    if "verdict" in modes:
        chosen = verdict_pairs(probe, verdict_cross, seed)
        logger.info("probe: verdict mode on %d pairs (%d prompts)", len(chosen), 2 * len(chosen))
        readings.verdicts = read_verdicts(engine, probe, chosen)
    return readings
