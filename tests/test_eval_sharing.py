"""Prefix-shared scoring equals whole-sequence scoring (tiny Qwen2 + LoRA), and falls back loudly where it cannot run.

Multi-process equality (1, 2, 3 processes against the whole-sequence engine): tests/test_eval_cli.py."""

from __future__ import annotations

import logging

import pytest
import torch

from judgetrain.eval.runner import evaluate
from judgetrain.eval.scoring import Request, ScoringEngine
from judgetrain.eval.sharing import plan_rows
from judgetrain.models.attention import prefix_sharing_problem
from judgetrain.eval.suites import SuiteSpec

from test_eval_scoring import SMALL, tiny_dir, tokenizer  # noqa: F401 (the same small tiny judge and fixtures)

RTOL = 1e-4


def _model(tiny_dir, peft=True, **load):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32, **load)
    if not peft:
        return base
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    return get_peft_model(base, cfg)


@pytest.fixture()
def peft_model(tiny_dir):
    return _model(tiny_dir)


# RM-Bench-shaped rows: a short prompt, 3 chosen + 3 rejected responses of unequal lengths (one empty)
RMBENCH = [{"id": f"chat/{i}", "domain": "chat", "prompt": f"Question {i}: " + "why is the sky blue? " * (i % 3 + 1),
            "chosen": [f"Answer {i}.", "Because of Rayleigh scattering. " * (i + 1), f"**Answer** {i}."],
            "rejected": [f"Wrong {i}." if i else "", "Because the sea reflects. " * (i + 2), f"**Wrong** {i}."]}
           for i in range(5)]


def _judgebias_rows(n: int) -> list[dict]:
    """JudgeBias-shaped rows: a long shared rubric + a per-row recipe (2-4x the evaluation), short evaluations."""
    rubric = "You grade synthesis recipes for materials appropriateness, equipment and procedure. " * 6
    rows = []
    for i in range(n):
        recipe = f"Recipe {i}: mix Li2CO3 and Co3O4, heat at {800 + 10 * i} C for {i + 2} h. " * (2 + i % 3)
        rows.append({"sample_id": f"s{i}", "perturbation_category": "represent", "perturbation_type": f"t{i % 2}",
                     "anchor_score": 4.0, "score_chosen": 4.0, "score_rejected": 2.0,
                     "prompt": [{"role": "system", "content": rubric}, {"role": "user", "content": recipe}],
                     "chosen": [{"role": "assistant", "content": f'{{"overall_score": 4.0}} fine {i}'}],
                     "rejected": [{"role": "assistant", "content": f'{{"overall_score": 2.0}} bad {i} ' * 2}]})
    return rows


def _scores(model, tokenizer, specs, share, **kw):
    engine = ScoringEngine(model, tokenizer, prefix_sharing=share, merge_lora=share, **kw)
    results = evaluate(engine, specs)
    out = {}
    for name, res in results.items():
        for rec in res.records:
            for key in ("score_chosen", "score_rejected", "judge_score"):
                if key in rec and not (name == "judgebias" and engine.scoring == "judge" and key != "judge_score"):
                    out[(name, rec["row_index"], key)] = rec[key]
    return out, engine


def _assert_same(shared, whole):
    assert shared.keys() == whole.keys() and shared
    for k in whole:
        assert shared[k] == pytest.approx(whole[k], rel=RTOL, abs=1e-5), k


@pytest.mark.parametrize("batch_tokens", [8192, 300])
def test_implicit_scores_with_adapter_reference_equal_whole_sequence_scores(peft_model, tokenizer, batch_tokens):
    specs = [SuiteSpec("rmbench", rows=RMBENCH), SuiteSpec("judgebias", rows=_judgebias_rows(6))]
    whole, whole_engine = _scores(peft_model, tokenizer, specs, False, batch_tokens=batch_tokens)
    shared, engine = _scores(peft_model, tokenizer, specs, True, batch_tokens=batch_tokens)
    _assert_same(shared, whole)
    # every row shared its prompt, policy and reference pass; fewer tokens were computed
    assert engine.stats.shared_prompts == 2 * 11 and engine.stats.whole_sequences == 0
    assert whole_engine.stats.shared_prompts == 0
    assert engine.stats.real_tokens < whole_engine.stats.real_tokens
    if batch_tokens == 300:  # a small budget splits rows into groups and leaves into chunks: still equal
        assert engine.stats.policy_batches > 4


def test_judge_scores_equal_whole_sequence_scores_and_run_the_rubric_once(peft_model, tokenizer):
    specs = [SuiteSpec("rmbench", rows=RMBENCH), SuiteSpec("judgebias", rows=_judgebias_rows(6))]
    whole, whole_engine = _scores(peft_model, tokenizer, specs, False, scoring="judge")
    shared, engine = _scores(peft_model, tokenizer, specs, True, scoring="judge")
    _assert_same(shared, whole)
    # JudgeBias: the rubric (~100 tokens) runs once instead of once per row
    saved = whole_engine.stats.real_tokens - engine.stats.real_tokens
    rubric = len(tokenizer(_judgebias_rows(1)[0]["prompt"][0]["content"])["input_ids"])
    assert saved > 4 * rubric
    assert engine.stats.ref_batches == whole_engine.stats.ref_batches == 0


def test_separate_reference_model_equals_whole_sequence_scores(tiny_dir, tokenizer):
    policy = _model(tiny_dir, peft=False)
    ref = _model(tiny_dir, peft=False)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    specs = [SuiteSpec("rmbench", rows=RMBENCH[:3])]
    whole, _ = _scores(policy, tokenizer, specs, False, ref_model=ref)
    shared, engine = _scores(policy, tokenizer, specs, True, ref_model=ref)
    _assert_same(shared, whole)
    assert engine.stats.shared_prompts == 6 and abs(shared[("rmbench", 1, "score_chosen")][1]) > 1e-3


def test_eager_attention_shares_too(tiny_dir, tokenizer):
    model = _model(tiny_dir, attn_implementation="eager")
    assert prefix_sharing_problem(model, cache=True) is None
    specs = [SuiteSpec("rmbench", rows=RMBENCH[:2])]
    _assert_same(_scores(model, tokenizer, specs, True)[0], _scores(model, tokenizer, specs, False)[0])


def test_rows_whose_prompt_was_cut_differently_per_response_are_scored_whole(peft_model, tokenizer):
    long_prompt = [{"role": "user", "content": "word " * 60}]
    requests = [
        Request("implicit", prompt=long_prompt, responses=[[{"role": "assistant", "content": "ok"}],
                                                           [{"role": "assistant", "content": "ok " * 20}]]),
        Request("implicit", prompt=[{"role": "user", "content": "Is water wet?"}],
                responses=[[{"role": "assistant", "content": "Yes."}], [{"role": "assistant", "content": "No."}]]),
    ]
    whole = ScoringEngine(peft_model, tokenizer, max_length=48, prefix_sharing=False,
                          merge_lora=False).score_requests(requests)
    engine = ScoringEngine(peft_model, tokenizer, max_length=48)
    shared = engine.score_requests(requests)
    assert shared[0].truncated and not shared[1].truncated
    for a, b in zip(shared, whole):
        assert a.scores == pytest.approx(b.scores, rel=RTOL, abs=1e-5)
    # row 0's responses cut different prompt tokens: they went whole (policy and reference), row 1 shared
    assert engine.stats.whole_sequences == 4 and engine.stats.shared_prompts == 2


def test_plan_splits_at_the_token_ids_of_the_whole_sequence():
    from judgetrain.eval.sequences import TokenSequence

    seqs = [TokenSequence(0, 0, [1, 2, 3, 7, 8], 3), TokenSequence(0, 1, [1, 2, 3, 9], 3),  # same prompt tokens: shared
            TokenSequence(1, 0, [1, 2, 4, 7], 3), TokenSequence(1, 1, [1, 2, 5, 7], 3),  # prompt tokens differ: whole
            TokenSequence(2, 0, [1, 6, 7], 2), TokenSequence(2, 1, [1, 6, 8, 9], 2), TokenSequence(2, 2, [6, 6, 8], 2)]  # 2 share, 1 was cut
    rows, whole = plan_rows(seqs, judge=False)
    assert [(r.row, r.prefix, r.leaves) for r in rows] == [(0, [1, 2, 3], [[7, 8], [9]]), (2, [1, 6], [[7], [8, 9]])]
    assert [(s.row, s.slot) for s in whole] == [(1, 0), (1, 1), (2, 2)]
    judge_rows, _ = plan_rows([TokenSequence(0, 0, [1, 2, 3], 3), TokenSequence(0, 1, [1, 2, 3, 4], 4), TokenSequence(1, 0, [5, 6], 2)],
                              judge=True)
    assert [(r.prefix, r.leaves, r.terminal) for r in judge_rows] == [([1, 2], [[3], [3, 4]], False),
                                                                       ([5, 6], [], True)]


def test_sliding_window_model_falls_back_loudly_with_the_same_scores(tiny_dir, tokenizer, caplog):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_dir, use_sliding_window=True, sliding_window=16,
                                        layer_types=["sliding_attention"] * SMALL["num_hidden_layers"])
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, config=config, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    assert "DynamicSlidingWindowLayer" in prefix_sharing_problem(model, cache=True)
    specs = [SuiteSpec("rmbench", rows=RMBENCH[:2])]
    with caplog.at_level(logging.WARNING, logger="judgetrain.eval.scoring"):
        shared, engine = _scores(model, tokenizer, specs, True)
    assert any("prefix sharing off" in r.message and "DynamicSlidingWindowLayer" in r.message for r in caplog.records)
    assert engine.stats.shared_prompts == 0 and engine.stats.whole_sequences == 24
    _assert_same(shared, _scores(model, tokenizer, specs, False)[0])


def test_merged_lora_forward_equals_peft_forward_and_leaves_the_model_untouched(peft_model):
    from judgetrain.eval.merged import merged_lora

    ids = torch.randint(0, SMALL["vocab_size"], (3, 40))
    before = {k: v.clone() for k, v in peft_model.state_dict().items()}
    peft_model.eval()
    with torch.no_grad():
        plain = peft_model(input_ids=ids).logits
        with merged_lora(peft_model) as n:
            merged = peft_model(input_ids=ids).logits
        after = peft_model(input_ids=ids).logits
    assert n == 2 * 3  # q_proj, v_proj, up_proj in each of the 2 layers
    assert torch.allclose(merged, plain, rtol=1e-4, atol=1e-5) and not torch.equal(merged, plain)  # it really ran
    assert torch.equal(after, plain)  # PEFT's forward is back
    assert all(torch.equal(v, before[k]) for k, v in peft_model.state_dict().items())
    assert not any("forward" in vars(m) for m in peft_model.modules())


def test_merged_lora_leaves_half_precision_layers_to_peft(tiny_dir):
    from judgetrain.eval.merged import merged_lora

    model = _model(tiny_dir).to(torch.bfloat16)
    with merged_lora(model) as n:
        assert n == 0


def test_merged_lora_holds_at_most_its_budget_and_leaves_the_weights_bit_for_bit_even_on_an_error(peft_model):
    """Layers beyond ``cache_bytes`` merge in their own forward: the context then holds nothing, scores are the same
    bits as with every layer merged up front, and the weights are byte-identical after it, also when the scoring
    inside it raises."""
    from judgetrain.bench.memory import LiveTensorBytes
    from judgetrain.checks.memory import merged_extra_bytes
    from judgetrain.eval.merged import merged_lora

    adapted = [m.base_layer.weight for m in peft_model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    sizes = [w.numel() * w.element_size() for w in adapted]
    assert len(sizes) == 6
    before = {k: v.detach().clone().numpy().tobytes() for k, v in peft_model.state_dict().items()}
    ids = torch.randint(0, SMALL["vocab_size"], (3, 40))
    peft_model.eval()
    held = {}
    with torch.no_grad():
        plain = peft_model(input_ids=ids).logits
        for budget in (0, sizes[0], sum(sizes)):
            tracker = LiveTensorBytes()
            for t in list(peft_model.parameters()) + list(peft_model.buffers()):
                tracker.track(t)
            model_bytes = tracker.current
            with tracker, merged_lora(peft_model, cache_bytes=budget) as n:
                held[budget] = tracker.current - model_bytes
                logits = peft_model(input_ids=ids).logits
            assert n == 6 and torch.allclose(logits, plain, rtol=1e-4, atol=1e-5) and not torch.equal(logits, plain)
            held.setdefault("logits", logits)
            assert torch.equal(logits, held["logits"])  # the same ops, up front or in the forward
        with pytest.raises(RuntimeError, match="inside the context"):
            with merged_lora(peft_model, cache_bytes=0):
                peft_model(input_ids=ids)
                raise RuntimeError("inside the context")
        assert torch.equal(peft_model(input_ids=ids).logits, plain)
        # generation's way: the layers past the budget keep PEFT's forward (no per-forward merge at decode steps)
        with merged_lora(peft_model, cache_bytes=sizes[0], per_forward=False) as n:
            assert n == 1 and sum("forward" in vars(m) for m in peft_model.modules()) == 1
            assert torch.allclose(peft_model(input_ids=ids).logits, plain, rtol=1e-4, atol=1e-5)
    assert (held[0], held[sizes[0]], held[sum(sizes)]) == (0, sizes[0], sum(sizes))
    assert merged_extra_bytes(sizes, 0) == max(sizes) and merged_extra_bytes(sizes, sum(sizes)) == sum(sizes)
    assert merged_extra_bytes([10, 30, 10], 25) == 20 + 30
    assert {k: v.detach().numpy().tobytes() for k, v in peft_model.state_dict().items()} == before
    assert not any("forward" in vars(m) for m in peft_model.modules())


def test_a_batch_closes_before_a_sequence_it_would_pad_by_more_than_a_fifth():
    from judgetrain.eval.batching import MIN_FILL, budget_batches

    lengths = [100, 95, 81, 79, 60, 50, 47, 10]
    plain = budget_batches(lengths, lambda n: n, 10_000, 64)
    assert plain == [lengths]  # the budget alone: one batch, 522 real tokens in 800 slots
    filled = budget_batches(lengths, lambda n: n, 10_000, 64, min_fill=MIN_FILL)
    assert filled == [[100, 95, 81], [79], [60, 50], [47], [10]]
    assert all(min(b) >= MIN_FILL * max(b) for b in filled)
    # the padded length may differ from the cost: the leaves of one row group attend over a shared past
    past = 1000
    assert budget_batches([100, 70], lambda n: past + n, 10_000, 64, padded=lambda n: n, min_fill=0.8) == [[100], [70]]
