"""JudgeEvalCallback inside a real TRL DPOTrainer run (tiny Qwen2 + LoRA, CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from judgetrain.config.recipe import EvalArguments
from judgetrain.eval.callback import JudgeEvalCallback
from judgetrain.eval.session import Evaluation
from judgetrain.eval.suites import SuiteSpec

SMALL = dict(vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from judgetrain.models.tiny import build_tiny_judge

    return build_tiny_judge(tmp_path_factory.mktemp("tiny"), seed=0, config=SMALL)


def _msg(role, text):
    return [{"role": role, "content": text}]


def _suites():
    rmbench = [{"id": f"{d}/{i}", "domain": d, "prompt": f"Question {i} about {d}?",
                "chosen": [f"Right {i}.", f"Right answer {i}, explained.", f"**Right** {i}."],
                "rejected": [f"Wrong {i}.", f"Wrong answer {i}, explained.", f"**Wrong** {i}."]}
               for d in ("chat", "code", "safety-refuse") for i in range(2)]
    judgebias = [{"prompt": [{"role": "system", "content": "Grade the recipe."}, {"role": "user", "content": f"Recipe {i}"}],
                  "chosen": _msg("assistant", f"Good recipe {i}. overall_score: 4"),
                  "rejected": _msg("assistant", f"Bad recipe {i}. overall_score: 2"),
                  "score_chosen": 4.0, "score_rejected": 2.0, "anchor_score": 4.0, "sample_id": i,
                  "perturbation_category": "error" if i % 2 else "represent",
                  "perturbation_type": "element_substitution" if i % 2 else "llm_to_formula"} for i in range(4)]
    ideation = [{"prompt": _msg("user", f"Propose research on topic {i}."), "chosen": _msg("assistant", f"Idea {i}: careful."),
                 "rejected": _msg("assistant", f"Idea {i}: sloppy."), "sample_id": f"s{i}", "pair_id": i} for i in range(3)]
    return [SuiteSpec("rmbench", rows=rmbench), SuiteSpec("judgebias", rows=judgebias), SuiteSpec("ideation", rows=ideation)]


@pytest.mark.slow
def test_callback_logs_eval_keys_each_epoch_in_a_dpo_run(tiny_dir, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from judgetrain.trainer.callbacks import MetricsJsonlCallback

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    train = Dataset.from_list([{"prompt": _msg("user", f"Rate recipe {i}"), "chosen": _msg("assistant", "Score 4"),
                                "rejected": _msg("assistant", "Score 1")} for i in range(4)])
    out = tmp_path / "run"
    args = DPOConfig(output_dir=str(out), per_device_train_batch_size=4, num_train_epochs=2, learning_rate=1e-2,
                     logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", max_length=128)
    torch.manual_seed(0)
    trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_dir), args=args, train_dataset=train,
                         processing_class=tok, peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                         callbacks=[MetricsJsonlCallback(str(out))])
    suites = _suites()
    for spec in suites:
        spec.generate_max_rows = 1  # generate mode on 1 row of each suite: 6 + 1 + 2 texts per eval
    evaluation = Evaluation(EvalArguments(eval_scoring=["implicit", "generate"], eval_batch_tokens=512,
                                          eval_generate_max_new_tokens=4))
    cb = JudgeEvalCallback(suites, evaluation, on_start=True, trainer=trainer)
    trainer.add_callback(cb)  # as TRL's own callbacks are added
    trainer.train()

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/rmbench/hard_acc" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]  # baseline + each epoch end
    for r in evals:
        for key in ("eval/rmbench/total_avg_acc", "eval/rmbench/chat/avg_acc", "eval/rmbench/safety/hard_acc",
                    "eval/judgebias/error/accuracy", "eval/judgebias/represent/margin",
                    "eval/judgebias/type/llm_to_formula/accuracy", "eval/ideation/accuracy"):
            assert key in r
            assert key.endswith("margin") or 0.0 <= r[key] <= 1.0
        assert not any(k.startswith("train/eval") for k in r)
        # generate mode, beside the bare implicit keys: every text counted, its tokens within max_new_tokens
        assert (r["eval/rmbench/generate/n_generated"], r["eval/judgebias/generate/n_generated"],
                r["eval/ideation/generate/n_verdicts"]) == (6, 1, 2)
        for suite, n in (("rmbench", 6), ("judgebias", 1), ("ideation", 2)):
            assert 0.0 <= r[f"eval/{suite}/generate/parse_rate"] <= 1.0
            assert r[f"eval/{suite}/generate/tokens_generated"] <= 4 * n
            fails = sum(v for k, v in r.items() if k.startswith(f"eval/{suite}/generate/parse_fail/"))
            assert fails == round(n * (1 - r[f"eval/{suite}/generate/parse_rate"]))
        assert "train/rewards/chosen" not in r  # TRL's pending train metrics stay in the train events
    # at step 0 the adapter is the identity: every implicit reward is exactly 0, so every comparison is a tie
    assert evals[0]["eval/ideation/accuracy"] == 0.0 and evals[0]["eval/judgebias/represent/margin"] == 0.0
    assert cb.engine.stats.ref_sequences_computed == 6 * 6 + 4 * 2 + 3 * 2  # reference computed once, for 3 evals
    assert cb.generator.stats.prompts == 3 * 9  # one Generator, reused by the 3 evals
    rows = [json.loads(line) for line in (out / "eval" / "2" / "rmbench.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and len(rows[0]["score_chosen"]) == 3 and rows[0]["id"] == "chat/0"
    generated = [json.loads(line) for line in (out / "eval" / "2" / "judgebias.generate.jsonl").read_text().splitlines()]
    assert len(generated) == 1 and all(isinstance(o["text"], str) and o["n_tokens"] <= 4 and o["expected"] is not None
                                       for g in generated for o in g["outputs"])
    summary = json.loads((out / "eval" / "2" / "results.json").read_text())  # the shape `judgetrain eval` writes
    assert summary["results"]["rmbench"]["missing_domains"] == ["math"]
    assert summary["step"] == 2 and summary["scoring"] == "implicit"
    assert summary["metrics"]["eval/rmbench/hard_acc"] == evals[-1]["eval/rmbench/hard_acc"]
    assert trainer.model.training  # the callback gave the model back in train mode
