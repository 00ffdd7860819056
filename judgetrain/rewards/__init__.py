"""A trained judge at work as a reward: TRL's ``reward_funcs`` (`judgetrain.rewards.reward`), the judge folder read
(`judgetrain.rewards.loading`), its card (`judgetrain.rewards.card`) and the batcher `judgetrain serve` puts in front
of it (`judgetrain.rewards.batcher`)."""

from judgetrain.rewards.card import JudgeCard, read_card
from judgetrain.rewards.reward import REWARD_MODES, AsyncJudgeReward, JudgeReward, RewardCall

__all__ = ["REWARD_MODES", "AsyncJudgeReward", "JudgeCard", "JudgeReward", "RewardCall", "read_card"]
