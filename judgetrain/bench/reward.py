"""The reward part (``--only reward``): a judge as a reward function (`judgetrain.rewards.JudgeReward`, implicit mode)
against a per-completion loop of the same model, on GRPO groups: ``--reward_group`` completions of one prompt.

Two groups, as the two uses of a judge as a reward shape them:

- ``chat``: a policy answering a user (RM-Bench's first chat prompt, a short request, with its own six responses, then
  the next chat rows' responses: the lengths of real answers, the completions' tokens nearly all of the work);
- ``judge``: a generative judge trained by GRPO, as RM-R1 and J1 train theirs (a JudgeBias judge prompt, a rubric
  and the item to grade, long, with evaluations as the completions: the shared prompt most of the work).

The loop is the reward function a user writes by hand: for each completion, the prompt + completion through the policy
and through the reference (the adapter disabled), the full log-softmax, one completion at a time, as the public DPO
scoring scripts do (`judgetrain.bench.eval.NaiveEvaluator` at batch size 1). A third side calls the reward once per
completion (no batching, no group to share a prompt with), which says what the call over the whole group gains.
Rewards per second of each side, their ratio (target >= 3x, SmolLM2-135M-Instruct), the prompt and completion
lengths, and whether the rewards are equal (the bench fails if not). The model carries the recipe's LoRA adapter,
randomly initialised (`judgetrain.bench.eval.load_eval_model`).
"""

# Late imports: torch, numpy, judgetrain.rewards (inside the functions that use them): each benchmark part loads only
# what it measures.

from __future__ import annotations

import argparse
import logging
from typing import Any

from judgetrain.bench.common import BenchError, load_average, median, ratio, timed_sides
from judgetrain.bench.eval import NaiveEvaluator, _judgebias_rows, rmbench_rows
from judgetrain.bench.generation import bench_models

logger = logging.getLogger(__name__)

REWARD_GROUPS = ("chat", "judge")


def grpo_group(kind: str, source: str, size: int) -> tuple[list[dict], list[list[dict]]]:
    """(prompt messages, ``size`` completions as assistant messages) of the group ``kind`` (see the module doc)."""
    if kind == "judge":
        rows = _judgebias_rows(None)
        prompt = list(rows[0]["prompt"])
        texts = [x[0]["content"] for r in rows for x in (r["chosen"], r["rejected"])][:size]
    else:
        rows = [r for r in rmbench_rows(source, None) if str(r.get("domain", r.get("id", ""))).startswith("chat")] \
            or rmbench_rows(source, None)
        prompt = [{"role": "user", "content": rows[0]["prompt"]}]
        texts = [x for r in rows for x in list(r["chosen"]) + list(r["rejected"])][:size]
    if len(texts) < size:
        raise BenchError(f"reward bench: {len(texts)} completions for the {kind} group; --reward_group {size} asked")
    return prompt, [[{"role": "assistant", "content": t}] for t in texts]


def bench_reward_model(cfg: argparse.Namespace, model: Any, tokenizer: Any) -> dict:
    return {kind: bench_reward_group(cfg, model, tokenizer, kind) for kind in REWARD_GROUPS}


def bench_reward_group(cfg: argparse.Namespace, model: Any, tokenizer: Any, kind: str) -> dict:
    import numpy as np

    from judgetrain.rewards import JudgeReward

    prompt, completions = grpo_group(kind, cfg.rmbench_source, cfg.reward_group)
    prompts = [prompt] * len(completions)
    reward = JudgeReward(model, tokenizer, mode="implicit", max_length=cfg.eval_max_length,
                         batch_tokens=cfg.eval_batch_tokens)
    loop = NaiveEvaluator(model, tokenizer, batch_size=1, max_length=cfg.eval_max_length)
    items = [(prompt, [c]) for c in completions]
    run = {"reward": lambda: reward(prompts, completions),
           "per_completion_loop": lambda: [s[0] for s in loop.score(items)],
           "reward_one_at_a_time": lambda: [reward([prompt], [c])[0] for c in completions]}
    run["reward"]()  # untimed: first-call allocations, lazy imports
    times, outs = timed_sides(run, cfg.repeats)
    a, b = np.asarray(outs["reward"], dtype=float), np.asarray(outs["per_completion_loop"], dtype=float)
    worst = float(np.max(np.abs(a - b)))
    if not np.allclose(a, b, rtol=1e-4, atol=1e-3):
        raise BenchError(f"reward bench, {kind} group: the reward and the per-completion loop differ (max abs "
                         f"difference {worst:.3g})")

    def side(key: str) -> dict:
        sec = median(times[key])
        return {"seconds": sec, "seconds_runs": times[key], "rewards_per_s": len(completions) / sec}

    lengths = loop.sequences(items)
    sides = {key: side(key) for key in run}
    return {"group": len(completions), "prompt_tokens": min(start for _, start in lengths),
            "completion_tokens_mean": sum(len(ids) - start for ids, start in lengths) / len(lengths),
            **sides, "rewards_per_s_ratio": ratio(sides["reward"]["rewards_per_s"],
                                                  sides["per_completion_loop"]["rewards_per_s"]),
            "vs_one_at_a_time_ratio": ratio(sides["reward"]["rewards_per_s"],
                                            sides["reward_one_at_a_time"]["rewards_per_s"]),
            "scores_equal": True, "max_abs_difference": worst, "rewards": outs["reward"],
            "engine_stats": reward.engine.stats.as_dict(), "load_average": load_average()}


def bench_reward(cfg: argparse.Namespace) -> dict:
    import torch

    return {"group": cfg.reward_group, "torch_threads": torch.get_num_threads(),
            "models": bench_models(cfg.reward_models, cfg.recipe, "reward",
                                   lambda model, tokenizer: bench_reward_model(cfg, model, tokenizer))}
