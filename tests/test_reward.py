"""A trained judge as a reward (judgetrain.rewards): in a real trl GRPOTrainer and OnlineDPOTrainer with a tiny Qwen3
policy and a judge trained through judgetrain's train path as the only reward, the rewards the trainers log equal what
`judgetrain eval` scores for the same texts; the both-orders verdict cancels the order; lengths counted; the card.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from families import build_family_model
from helpers import read_jsonl

from judgetrain.cli import main as cli_main
from judgetrain.rewards import JudgeReward, RewardCall
from judgetrain.rewards.reward import group_by_prompt
from judgetrain.utils.errors import BadInputError

QUESTIONS = ["How do I boil an egg?", "Name a prime number above 10.", "What is the capital of France?",
             "Give one tip for sleeping well."]


def close(a, b, rel=1e-4, abs_=1e-3) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


@pytest.fixture(scope="module")
def policy(tiny_judge, tmp_path_factory) -> str:
    return build_family_model("qwen3", tiny_judge, tmp_path_factory.mktemp("policy") / "qwen3")


@pytest.fixture(scope="module")
def implicit_reward(trained_judge) -> JudgeReward:
    return JudgeReward.from_folder(str(trained_judge), mode="implicit")


def eval_scores(judge: Path, pairs: list[tuple[str, str, str]], out: Path, mode: str, max_length: int = 1024) -> list:
    """`judgetrain eval` on (prompt, response_a, response_b) rows written as a pairwise suite: each row's scores."""
    source = out / "pairs.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    source.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p, "response_a": a, "response_b": b,
                                          "label": "A>B"}) + "\n" for i, (p, a, b) in enumerate(pairs)))
    code = cli_main(["eval", "--model", str(judge / "checkpoint-2"), "--eval_suites", "pairwise",
                     "--eval_pairwise_source", str(source), "--eval_scoring", mode, "--max_length", str(max_length),
                     "--output_dir", str(out / "eval")])
    assert code == 0
    name = "pairwise.jsonl" if mode != "verdict" else "pairwise.verdict.jsonl"
    rows = {r["id"]: r["scores"] for r in read_jsonl(out / "eval" / "checkpoint-2" / name)}
    return [rows[f"r{i}"] for i in range(len(pairs))]


def grpo_args(tmp_path: Path, **kw):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=12, max_steps=2, logging_steps=1, report_to="none", beta=0.0,
                      learning_rate=1e-4, save_strategy="no", seed=0, use_cpu=True, **kw)


@pytest.mark.slow  # a few training steps of a real trainer
def test_a_grpo_run_rewards_equal_judgetrain_eval_scores(policy, trained_judge, implicit_reward, tmp_path):
    """GRPO with the judge as its only reward: the last generation batch's logged rewards are `judgetrain eval`'s
    implicit scores of the same prompt and completion texts; the call's figures reach the trainer's logs; each group's
    prompt ran once (prefix sharing)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS])
    trainer = GRPOTrainer(model=policy, reward_funcs=implicit_reward, args=grpo_args(tmp_path), train_dataset=data)
    shared_before = implicit_reward.engine.stats.shared_prompts
    trainer.train()
    assert implicit_reward.engine.stats.shared_prompts - shared_before >= 2 * 2  # 2 prompts a step, 2 steps
    prompts, completions = list(trainer._logs["prompt"]), list(trainer._logs["completion"])
    logged = list(trainer._logs["rewards"]["judge_reward"])
    assert len(logged) == 8 and len(group_by_prompt(prompts)) == 2
    texts = [(p[-1]["content"], c[0]["content"]) for p, c in zip(prompts, completions)]
    pairs = [(texts[i][0], texts[i][1], texts[i + 1][1]) for i in range(0, 8, 2)]  # a group's completions in pairs
    scored = [s for row in eval_scores(trained_judge, pairs, tmp_path / "eval", "implicit") for s in row]
    assert all(close(a, b) for a, b in zip(logged, scored)), (logged, scored)
    assert len(set(round(x, 3) for x in logged)) > 1  # real, differing rewards
    history = [h for h in trainer.state.log_history if "judge_reward/reward_mean" in h]
    assert len(history) == 2 and all(h["judge_reward/truncated"] == 0 for h in history)
    assert close(history[-1]["judge_reward/reward_mean"], sum(logged) / 8)
    assert close(history[-1]["rewards/judge_reward/mean"], sum(logged) / 8)
    assert close(history[-1]["judge_reward/reward_std"], history[-1]["rewards/judge_reward/std"])


@pytest.mark.slow  # a few training steps of a real trainer
def test_an_online_dpo_run_rewards_equal_judgetrain_eval_scores(policy, trained_judge, tmp_path):
    """OnlineDPOTrainer (trl.experimental) with the judge-mode reward: the rewards of its last call are `judgetrain
    eval`'s judge-mode scores of the same texts, and their mean is the trainer's logged objective/scores."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    reward = JudgeReward.from_folder(str(trained_judge), mode="judge")
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS])
    args = OnlineDPOConfig(output_dir=str(tmp_path / "odpo"), per_device_train_batch_size=2, max_new_tokens=12,
                           max_steps=2, logging_steps=1, report_to="none", learning_rate=1e-4, save_strategy="no",
                           seed=0, use_cpu=True)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(policy), AutoTokenizer.from_pretrained(policy)
    trainer = OnlineDPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                               processing_class=tokenizer)
    trainer.train()
    last = reward.totals.last
    assert len(last) == 4 and reward.totals.calls == 2
    assert len(group_by_prompt([r["prompt"] for r in last])) == 2  # prompts*2: each prompt's two completions
    pairs = [(last[i]["prompt"][-1]["content"], last[i]["completion"][0]["content"],
              last[i + 2]["completion"][0]["content"]) for i in range(2)]
    scores = eval_scores(trained_judge, pairs, tmp_path / "eval", "judge")
    assert all(close(last[i]["reward"], scores[i][0]) and close(last[i + 2]["reward"], scores[i][1])
               for i in range(2)), (last, scores)
    assert all(1.0 <= r["reward"] <= 5.0 for r in last)
    logged = [h["objective/scores"] for h in trainer.state.log_history if "objective/scores" in h]
    assert close(logged[-1], sum(r["reward"] for r in last) / 4)


def test_the_verdict_reward_reads_both_orders_against_the_reference(trained_judge, tmp_path):
    """Verdict mode: the reward is the mean of the completion's log-odds over the two orders (`judgetrain eval
    --eval_scoring verdict` of the same pair), so swapping completion and reference negates it exactly; the share whose
    verdict changed with the order is logged."""
    reward = JudgeReward.from_folder(str(trained_judge), mode="verdict")
    prompts = ["What is 2+2?", "Name a colour."]
    completions, references = ["It is 4.", "Blue."], ["Four.", "Red is a colour."]
    logged: dict[str, float] = {}
    got = reward(prompts, completions, log_metric=logged.__setitem__, reference=references)
    swapped = reward(prompts, references, reference=completions)
    assert all(math.isclose(a, -b, abs_tol=1e-6) for a, b in zip(got, swapped)), (got, swapped)
    rows = eval_scores(trained_judge, list(zip(prompts, completions, references)), tmp_path / "eval", "verdict")
    expected = [((s[0] - s[1]) + (s[3] - s[2])) / 2 for s in rows]  # stored order, then swapped
    assert all(close(a, b) for a, b in zip(got, expected)), (got, expected)
    changed = sum((s[0] > s[1]) != (s[3] > s[2]) for s in rows) / 2
    assert logged["judge_reward/order_changed"] == changed
    with pytest.raises(BadInputError, match="no column 'reference'.*answer"):
        reward(prompts, completions, answer=references)


def test_the_logged_std_is_the_sample_std_trl_logs():
    """``reward_std`` is TRL's ``rewards/<name>/std`` (its nanstd: n - 1, a skipped completion left out; NaN for one
    reward), not the population std (1.633 for these three)."""
    import torch
    from trl.trainer.utils import nanstd

    metrics = RewardCall([0.0, 2.0, None, 4.0], skipped=1).metrics()
    assert metrics["reward_std"] == pytest.approx(2.0) == nanstd(torch.tensor([0.0, 2.0, math.nan, 4.0])).item()
    assert math.isnan(RewardCall([1.0]).metrics()["reward_std"]) and math.isnan(nanstd(torch.tensor([1.0])).item())


def test_async_equals_sync_and_plain_prompts_score(implicit_reward):
    prompts, completions = ["Q: 2+2?\nA:"] * 2, [" 4", " five"]
    sync = implicit_reward(prompts, completions)
    assert asyncio.run(implicit_reward.as_async()(prompts=prompts, completions=completions)) == sync
    assert implicit_reward.as_async().__name__ == "judge_reward"


def test_long_completions_follow_the_recipe_rule_and_are_counted(trained_judge):
    """Over max_length: cut from the prompt's start and counted one by one (a group's short completion is not
    counted); with long_rows skip: unscored (None) and counted."""
    long_text = " ".join(["word"] * 400)
    prompts = [[{"role": "user", "content": "Say something."}]] * 2
    completions = [[{"role": "assistant", "content": long_text}], [{"role": "assistant", "content": "Hi."}]]
    cut = JudgeReward.from_folder(str(trained_judge), mode="implicit", max_length=64)
    logged: dict[str, float] = {}
    got = cut(prompts, completions, log_metric=logged.__setitem__)
    assert all(isinstance(x, float) for x in got) and logged["judge_reward/truncated"] == 1
    skip = JudgeReward(cut.engine.model, cut.engine.tokenizer, mode="judge", max_length=64, long_rows="skip")
    got = skip(prompts, completions, log_metric=logged.__setitem__)
    assert got == [None, None] and logged["judge_reward/skipped"] == 2  # judge mode: one row per prompt


def test_the_reward_carries_the_judge_card(implicit_reward):
    card = implicit_reward.card
    assert card.base == "tiny-judge" and card.adapter
    assert [(d["dataset"], d["source"], d.get("mode")) for d in card.training_data] == [
        ("judgebias", "bundled", None), ("ideation", "bundled", "pairwise")]
    rows = {r["figure"]: r for r in card.against_base["rows"]}
    assert "judgebias/error/accuracy" in rows
    assert all(r["ci_low"] <= r["trained"] <= r["ci_high"] for r in rows.values())
    assert card.text.startswith("---") and "against_base" in card.as_dict() and "text" not in card.as_dict()


def test_bad_inputs_are_refused_before_any_weights_load(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInputError, match="a folder without a model"):
        JudgeReward.from_folder(str(tmp_path / "empty"))
    with pytest.raises(BadInputError, match="no such folder"):
        JudgeReward.from_folder(str(tmp_path / "nope"))
    with pytest.raises(BadInputError, match="reward mode 'score'"):
        JudgeReward.from_folder(str(tmp_path / "empty"), mode="score")


def test_bad_texts_name_the_field(implicit_reward):
    with pytest.raises(BadInputError, match="2 prompts but 1 completions"):
        implicit_reward(["a", "b"], ["c"])
    with pytest.raises(BadInputError, match="completion 1: a string or a list"):
        implicit_reward(["a", "b"], ["c", 3])
    with pytest.raises(BadInputError, match="prompt 1: not valid Unicode text .a lone surrogate '.udfff' at char"):
        implicit_reward(["a", [{"role": "user", "content": "ok\udfff"}]], ["c", "d"])


def test_the_bench_reward_part_times_the_group_against_a_per_completion_loop(tmp_path):
    """`judgetrain bench --quick --only reward`: the reward over a group of 8 against the per-completion loop, the
    rewards equal (the bench fails otherwise), the group's prompt run once."""
    out = tmp_path / "bench.json"
    assert cli_main(["bench", "--quick", "--only", "reward", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    for group in ("chat", "judge"):
        part = report["reward"]["models"]["tiny_judge"][group]
        assert part["group"] == 8 and part["scores_equal"] and part["max_abs_difference"] < 1e-3
        assert part["engine_stats"]["shared_prompts"] >= 1
        assert part["rewards_per_s_ratio"] > 1.0, part
        assert report["summary"][f"reward_tiny_judge_{group}_rewards_per_s_ratio"] == part["rewards_per_s_ratio"]
    judge = report["reward"]["models"]["tiny_judge"]["judge"]
    assert judge["prompt_tokens"] > judge["completion_tokens_mean"]  # the judge group's long shared prompt
