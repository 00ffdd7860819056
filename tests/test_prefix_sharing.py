"""Prefix sharing in DPO training: the packed forward gives TRL's own loss, rewards, metrics and gradients.

Compared on one batch against the real `trl.DPOTrainer` (same model weights, same rows): the tiny judge (Qwen2, sdpa,
LoRA: the reference is the adapter-disabled model), a random Llama with eager attention and a separate reference
model (full fine-tune), a random Qwen3 (LoRA), and `precompute_ref_log_probs`. Then where it must fall back.
"""

from __future__ import annotations

import logging

import pytest
import torch

from judgetrain.trainer.dpo import JudgeDPOTrainer
from judgetrain.trainer.prefix_sharing import PackedPairs, pack_pairs

RTOL = 1e-4
BETA = 0.1


# ----------------------------------------------------------------------------------------------- packing layout


def test_pack_pairs_shares_the_prompt_and_restarts_positions_for_each_completion():
    # TRL's layout for one pair: prompt [5, 6, 7], chosen [8, 9], rejected [10]; right padded
    input_ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 10, 0]])
    labels = torch.tensor([[-100, -100, -100, 8, 9], [-100, -100, -100, 10, -100]])
    packed = pack_pairs(input_ids, labels)
    assert isinstance(packed, PackedPairs)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 7]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert packed.segment.tolist() == [[0, 0, 1, 1, 2]]
    assert packed.shift_labels.tolist() == [[-100, -100, 8, 9, 10]]
    # TRL's per-token column t scores token t+1: chosen 8, 9 at columns 2, 3; rejected 10 at column 2
    assert packed.gather.tolist() == [[-1, -1, 2, 3], [-1, -1, 4, -1]]
    mask = packed.attention_mask(None)[0, 0]
    assert mask[4].tolist() == [True, True, False, False, True]  # rejected head: prompt[:-1] and itself, not chosen
    assert mask[3].tolist() == [True, True, True, True, False]
    additive = packed.attention_mask(torch.float32)[0, 0]
    assert additive[4, 2] == torch.finfo(torch.float32).min and additive[4, 4] == 0
    assert packed.tokens == 5  # TRL computes 5 + 4 real tokens for this pair


def test_packing_is_chosen_only_where_it_computes_less():
    from transformers import Qwen2Config

    from judgetrain.trainer.prefix_sharing import forward_cost, packing_pays

    cost = forward_cost(Qwen2Config(vocab_size=2048, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2))

    def pair(prompt, chosen, rejected):
        length = prompt + max(chosen, rejected)
        ids = torch.arange(2 * length).reshape(2, length) % 50 + 3
        ids[1, :prompt] = ids[0, :prompt]
        labels = torch.full_like(ids, -100)
        labels[0, prompt : prompt + chosen] = ids[0, prompt : prompt + chosen]
        labels[1, prompt : prompt + rejected] = ids[1, prompt : prompt + rejected]
        return ids, pack_pairs(ids, labels)

    ids, packed = pair(400, 180, 170)  # JudgeBias-shaped: the prompt is twice the completion
    assert packing_pays(tuple(ids.shape), packed, cost)
    ids, packed = pair(50, 400, 380)  # RM-Bench-shaped: packed attention over 830 tokens costs more than 2 x 450
    assert not packing_pays(tuple(ids.shape), packed, cost)


def test_pack_pairs_refuses_pairs_whose_prompts_differ():
    input_ids = torch.tensor([[5, 6, 8], [5, 7, 9]])
    labels = torch.tensor([[-100, -100, 8], [-100, -100, 9]])
    assert "do not share their prompt" in pack_pairs(input_ids, labels)


# ----------------------------------------------------------------------------------------------- equivalence


def _rows(n: int = 6) -> list[dict]:
    rubric = "You are a strict judge. Score the evaluation below for accuracy, completeness and bias. " * 2
    rows = []
    for i in range(n):
        body = " ".join(f"claim {j} about item {i}" for j in range(3 + 4 * i))
        rows.append({
            "prompt": [{"role": "system", "content": rubric}, {"role": "user", "content": f"Evaluation {i}: {body}"}],
            "chosen": [{"role": "assistant", "content": f"Score: {4 - i % 3}. " + "Well argued. " * (1 + i % 2)}],
            "rejected": [{"role": "assistant", "content": f"Score: {i % 5}."}],
        })
    return rows


def _random_model(kind: str, vocab: int, attn: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False)
    config = {"llama": LlamaConfig, "qwen3": Qwen3Config}[kind](**common, head_dim=16)
    config._attn_implementation = attn
    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn)


def _trainer(cls, model_factory, tokenizer, tmp_path, *, lora: bool, ref_factory=None, task_type=None, **dpo):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig

    args = DPOConfig(output_dir=str(tmp_path / cls.__name__), per_device_train_batch_size=3, max_length=512,
                     report_to="none", use_cpu=True, seed=0, beta=BETA, **dpo)
    peft = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"],
                      init_lora_weights=False, task_type=task_type) if lora else None
    torch.manual_seed(0)
    return cls(model=model_factory(), ref_model=ref_factory() if ref_factory else None, args=args,
               train_dataset=Dataset.from_list(_rows()), processing_class=tokenizer, peft_config=peft)


def _loss_metrics_grads(trainer):
    trainer.model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = trainer._prepare_inputs(batch)
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return loss.detach(), metrics, grads


def _assert_same(reference, shared):
    (loss_a, met_a, grad_a), (loss_b, met_b, grad_b) = reference, shared
    torch.testing.assert_close(loss_b, loss_a, rtol=RTOL, atol=1e-6)
    for key in ("logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected", "entropy", "mean_token_accuracy"):
        assert met_b[key] == pytest.approx(met_a[key], rel=RTOL, abs=1e-6), key
    # a reward is beta x (policy logps - reference logps): a small difference of two sums of hundreds of log probs,
    # so its error is the logps' error (RTOL of |logps|) times beta, not RTOL of the reward itself
    reward_tol = BETA * RTOL * max(abs(met_a["logps/chosen"]), abs(met_a["logps/rejected"]))
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert met_b[key] == pytest.approx(met_a[key], abs=max(reward_tol, 1e-6)), key
    assert grad_a and set(grad_a) == set(grad_b)
    for name, g in grad_a.items():
        scale = g.abs().max().clamp(min=1e-8)
        assert ((grad_b[name] - g).abs().max() / scale).item() < RTOL, name
    assert any(g.abs().sum() > 0 for g in grad_a.values())


def _tokenizer(path):
    from judgetrain.models.loading import load_recipe_tokenizer as load_tokenizer
    from trl import DPOConfig

    return load_tokenizer(path, DPOConfig(output_dir="unused", report_to="none", use_cpu=True))


def test_tiny_judge_lora_matches_trl(tiny_judge, tmp_path):
    from transformers import AutoModelForCausalLM
    from trl import DPOTrainer

    tok = _tokenizer(tiny_judge)
    factory = lambda: AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)  # noqa: E731
    # task_type CAUSAL_LM as recipes set it: PEFT's causal-LM forward passes inputs_embeds=None and friends along
    ref = _loss_metrics_grads(_trainer(DPOTrainer, factory, tok, tmp_path, lora=True, task_type="CAUSAL_LM"))
    trainer = _trainer(JudgeDPOTrainer, factory, tok, tmp_path, lora=True, task_type="CAUSAL_LM")
    assert trainer.prefix_sharing is True
    _assert_same(ref, _loss_metrics_grads(trainer))
    stats = trainer.prefix_sharing_stats
    assert stats["batches_packed"] == 2 and stats["batches_fallback"] == 0  # policy + adapter-disabled reference
    assert stats["tokens_computed"] < 0.75 * stats["tokens_unshared"]


@pytest.mark.parametrize("kind,attn,lora", [("llama", "eager", False), ("qwen3", "sdpa", True)])
def test_random_architectures_match_trl(tiny_judge, tmp_path, kind, attn, lora):
    from trl import DPOTrainer

    tok = _tokenizer(tiny_judge)
    factory = lambda: _random_model(kind, len(tok), attn)  # noqa: E731
    ref_factory = None if lora else factory  # full fine-tune: a separate reference model
    ref = _loss_metrics_grads(_trainer(DPOTrainer, factory, tok, tmp_path, lora=lora, ref_factory=ref_factory))
    trainer = _trainer(JudgeDPOTrainer, factory, tok, tmp_path, lora=lora, ref_factory=ref_factory)
    assert trainer.prefix_sharing is True
    _assert_same(ref, _loss_metrics_grads(trainer))


def test_precomputed_reference_log_probs_match_trl(tiny_judge, tmp_path):
    from transformers import AutoModelForCausalLM
    from trl import DPOTrainer

    tok = _tokenizer(tiny_judge)
    factory = lambda: AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)  # noqa: E731
    plain = _trainer(DPOTrainer, factory, tok, tmp_path / "a", lora=True, precompute_ref_log_probs=True)
    shared = _trainer(JudgeDPOTrainer, factory, tok, tmp_path / "b", lora=True, precompute_ref_log_probs=True)
    assert shared.prefix_sharing_stats["batches_packed"] == 2  # the precompute pass ran packed: 6 rows, batches of 3
    for col in ("ref_chosen_logps", "ref_rejected_logps"):
        a, b = torch.tensor(plain.train_dataset[col]), torch.tensor(shared.train_dataset[col])
        torch.testing.assert_close(b, a, rtol=RTOL, atol=1e-6)
    _assert_same(_loss_metrics_grads(plain), _loss_metrics_grads(shared))


# ----------------------------------------------------------------------------------------------- fallbacks


def test_sliding_window_model_falls_back_loudly(tiny_judge, tmp_path, caplog):
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = _tokenizer(tiny_judge)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=16,
                         max_window_layers=0)
    factory = lambda: AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="judgetrain.trainer.prefix_sharing"):
        trainer = _trainer(JudgeDPOTrainer, factory, tok, tmp_path, lora=True)
    assert trainer.prefix_sharing is False
    assert "prefix_sharing: OFF" in caplog.text and "sliding" in caplog.text
    loss, _, _ = _loss_metrics_grads(trainer)  # still trains, on TRL's forward
    assert torch.isfinite(loss) and trainer.prefix_sharing_stats["batches_packed"] == 0


def test_attention_without_4d_masks_falls_back_loudly(tiny_judge, tmp_path, caplog):
    from transformers import AutoModelForCausalLM

    tok = _tokenizer(tiny_judge)
    factory = lambda: AutoModelForCausalLM.from_pretrained(tiny_judge, attn_implementation="flex_attention")  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="judgetrain.trainer.prefix_sharing"):
        trainer = _trainer(JudgeDPOTrainer, factory, tok, tmp_path, lora=True)
    assert trainer.prefix_sharing is False
    assert "attn_implementation='flex_attention'" in caplog.text
