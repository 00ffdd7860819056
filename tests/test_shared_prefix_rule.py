"""One answer to "does this model allow shared prefixes": training's packed rows
and eval's shared key/value cache (``cache=True``) both ask `judgetrain.models.attention.prefix_sharing_problem`."""

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from judgetrain.models.attention import prefix_sharing_problem

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1)


@pytest.mark.parametrize("case, expected", [
    ({}, None),
    ({"attn_implementation": "eager"}, None),
    ({"attn_implementation": "flash_attention_2"}, "attn_implementation='flash_attention_2' takes no custom 4D"),
    ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}, "sliding_attention layers (cache "
                                                                                  "layers DynamicSlidingWindowLayer)"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 4]}},
     "multimodal rotary positions"),
])
def test_training_and_eval_give_the_same_answer(case, expected):
    attn = case.pop("attn_implementation", "sdpa")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**SMALL, **case), attn_implementation="sdpa")
    model.config._attn_implementation = attn  # flash attention is not installed here: the config says it is asked
    got = prefix_sharing_problem(model.config)
    assert prefix_sharing_problem(model) == prefix_sharing_problem(model, cache=True) == got
    assert (got is None) if expected is None else (expected in got), got
