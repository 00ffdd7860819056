"""The scoring engine against hand computations from the model's own logits (tiny Qwen2 + LoRA)."""

from __future__ import annotations

import math

import pytest
import torch

from judgetrain.eval.runner import evaluate
from judgetrain.eval.scoring import Request, ScoringEngine
from judgetrain.data.sampling import balanced_sample as even_sample
from judgetrain.eval.suites import SuiteSpec

SMALL = dict(vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from judgetrain.models.tiny import build_tiny_judge

    return build_tiny_judge(tmp_path_factory.mktemp("tiny"), seed=0, config=SMALL)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture()
def peft_model(tiny_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(base, cfg)


PROMPTS = [
    [{"role": "system", "content": "You grade recipes."}, {"role": "user", "content": "Rate: heat Li2CO3 at 850 C."}],
    [{"role": "user", "content": "Is water wet?"}],
    [{"role": "user", "content": "Name a metal that reacts with water, with a long and winding explanation please."}],
]
RESPONSES = [
    ["The recipe is sound. Score 4.", "The recipe heats far too hot, score 2."],
    ["Yes.", "Water is wet because it adheres to surfaces and that is what wet means in everyday use."],
    ["Sodium.", "Gold, which is famous for reacting violently with water."],
]


def hand_logp(model, tokenizer, prompt, response) -> tuple[float, int]:
    """(summed log-prob of the response's tokens after the prompt, how many tokens), from the model's own logits."""
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    full = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": response}], tokenize=True,
                                         return_dict=True)["input_ids"]
    start = 0
    while start < len(prompt_ids) and prompt_ids[start] == full[start]:
        start += 1
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0].double()
    logps = torch.log_softmax(logits, -1)
    return sum(float(logps[t - 1, full[t]]) for t in range(start, len(full))), len(full) - start


def test_implicit_score_equals_policy_minus_adapter_disabled_reference_by_hand(peft_model, tokenizer):
    requests = [Request("implicit", prompt=p, responses=[[{"role": "assistant", "content": r}] for r in rs])
                for p, rs in zip(PROMPTS, RESPONSES)]
    # a small token budget forces several batches of unequal lengths (left padding must not change a score)
    engine = ScoringEngine(peft_model, tokenizer, batch_tokens=120)
    rows = engine.score_requests(requests)
    peft_model.eval()
    for row, prompt, responses in zip(rows, PROMPTS, RESPONSES):
        for got, response in zip(row.scores, responses):
            policy = hand_logp(peft_model, tokenizer, prompt, response)[0]
            with peft_model.disable_adapter():
                ref = hand_logp(peft_model, tokenizer, prompt, response)[0]
            assert abs(policy - ref) > 1e-3  # the adapter really changes the model
            assert got == pytest.approx(policy - ref, abs=2e-4)
    assert engine.stats.padded_tokens > engine.stats.real_tokens  # batches did pad
    assert engine.stats.policy_batches >= 2


def test_second_eval_runs_no_reference_forward(peft_model, tokenizer):
    rows = [{"id": f"chat/{i}", "domain": "chat", "prompt": f"Question {i}?",
             "chosen": [f"Answer {i}.", f"A longer answer {i}.", f"**Answer** {i}."],
             "rejected": [f"Wrong {i}.", f"A longer wrong {i}.", f"**Wrong** {i}."]} for i in range(5)]
    engine = ScoringEngine(peft_model, tokenizer, batch_tokens=256)
    spec = SuiteSpec("rmbench", rows=rows)
    first = evaluate(engine, [spec])["rmbench"]
    assert engine.stats.ref_batches > 0 and engine.stats.ref_sequences_computed == 30
    ref_batches = engine.stats.ref_batches
    # the policy moves (as after a training epoch): scores change, the reference is read from the cache
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(2.0)
    second = evaluate(engine, [spec])["rmbench"]
    assert engine.stats.ref_batches == ref_batches
    assert second.stats["ref_batches"] == 0 and second.stats["ref_cache_hits"] == 30
    assert second.records[0]["score_chosen"] != first.records[0]["score_chosen"]
    assert first.metrics["domains"] == ["chat"] and first.metrics["n_rows"] == 5


def test_long_inputs_are_truncated_or_skipped_and_counted(peft_model, tokenizer):
    long_prompt = [{"role": "user", "content": "word " * 300}]
    requests = [Request("implicit", prompt=long_prompt, responses=[[{"role": "assistant", "content": "ok"}]] * 2),
                Request("implicit", prompt=PROMPTS[1], responses=[[{"role": "assistant", "content": "Yes."}]] * 2)]
    trunc = ScoringEngine(peft_model, tokenizer, max_length=64).score_requests(requests)
    assert trunc[0].truncated and not trunc[1].truncated
    assert all(math.isfinite(x) for x in trunc[0].scores)
    skip = ScoringEngine(peft_model, tokenizer, max_length=64, long_inputs="skip").score_requests(requests)
    assert skip[0].skipped and skip[0].scores is None and not skip[1].skipped
    # the short row scores the same either way (batch composition differs: float noise only)
    assert trunc[1].scores == pytest.approx(skip[1].scores, abs=1e-5)


def test_judge_score_is_expectation_over_score_tokens(peft_model, tokenizer):
    engine = ScoringEngine(peft_model, tokenizer, scoring="judge")
    token_ids, values = engine.score_token_ids()
    assert len(token_ids) == len(set(token_ids)) >= 2
    rows = engine.score_requests([Request("judge", judge_prompts=[PROMPTS[0], PROMPTS[1]])])
    text = tokenizer.apply_chat_template(PROMPTS[0], tokenize=False, add_generation_prompt=True) + engine.judge_prefix
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    peft_model.eval()
    with torch.no_grad():
        probs = torch.softmax(peft_model(torch.tensor([ids])).logits[0, -1].double(), -1)[token_ids]
    expected = float((probs * torch.tensor(values, dtype=torch.float64)).sum() / probs.sum())
    assert rows[0].scores[0] == pytest.approx(expected, abs=1e-5)
    assert min(values) <= rows[0].scores[1] <= max(values)


def test_row_cap_samples_evenly_across_groups_and_is_deterministic():
    keys = ["chat"] * 50 + ["code"] * 5 + ["safety"] * 30
    picked = even_sample(keys, 12, seed=3)
    assert picked == even_sample(keys, 12, seed=3) and picked == sorted(picked)
    counts = {k: sum(keys[i] == k for i in picked) for k in set(keys)}
    assert counts == {"chat": 4, "code": 4, "safety": 4}


def test_judge_mode_on_bundled_suites_reports_anchor_mae_detect_rate_and_position_consistency(peft_model, tokenizer):
    from judgetrain.eval.metrics import flatten_eval_metrics

    from judgetrain.eval.generate import Generator

    engine = ScoringEngine(peft_model, tokenizer, scoring="judge", max_length=384)
    specs = [SuiteSpec("judgebias", max_rows=8, generate_max_rows=1), SuiteSpec("ideation", max_rows=4, mode="pairwise")]
    results = evaluate(engine, specs[:1], modes=["judge", "generate"],
                       generator=Generator(peft_model, tokenizer, max_new_tokens=8, max_length=384))
    results.update(evaluate(engine, specs[1:]))
    jb = results["judgebias"]
    assert len(jb.records) == 8
    values = engine.score_token_ids()[1]
    assert all(min(values) <= r["judge_score"] <= max(values) for r in jb.records)
    # score_chosen / score_rejected of a judge-mode record are the dataset's recorded verdicts
    assert all(r["score_chosen"] in {x / 2 for x in range(1, 12)} for r in jb.records)
    flat = jb.flat()
    assert "eval/judgebias/represent/anchor_mae" in flat and "eval/judgebias/error/detect_rate" in flat
    mae = sum(abs(r["judge_score"] - r["anchor_score"]) for r in jb.records if r["perturbation_category"] == "represent")
    n_rep = sum(r["perturbation_category"] == "represent" for r in jb.records)
    assert flat["eval/judgebias/represent/anchor_mae"] == pytest.approx(mae / n_rep)
    # generate-and-parse ran on one row only, and its parse rate is reported
    assert len(jb.modes["generate"].records) == 1 and "generate" not in results["ideation"].modes
    assert 0.0 <= jb.modes["generate"].metrics["parse_rate"] <= 1.0
    ide = results["ideation"]
    assert len(ide.records) == 4 and {r["order"] for r in ide.records} == {"AB", "BA"}
    assert ide.metrics["n_pairs_both_orders"] == 2
    assert "eval/ideation/position_consistency" in flatten_eval_metrics("ideation", ide.metrics)
    assert engine.stats.ref_batches == 0  # judge mode never needs the reference
