"""A warm start from an adapter (`init_adapter`): the run's first step continues the adapter against the base model
as the reference. Its first loss and rewards equal those of the same step continued by hand (TRL's DPOTrainer on a
PeftModel of the adapter, with the reference adapter TRL would add removed, so that the reference is the base), and
differ from ln 2, the first loss of a run whose reference were the adapter itself. A recipe that names no adapter
folder, or a full fine-tune, is refused at parse."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, read_jsonl

ROWS = [("Which is right: 2 + 2?", "4", "5"), ("Capital of France?", "Paris", "Lyon"),
        ("Is water wet?", "Yes, it is.", "No."), ("Boiling point of water at sea level?", "100 °C", "50 °C")]
TRAIN = ["--eval_suites", "none", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--warmup_steps", "0",
         "--learning_rate", "5e-2", "--lr_scheduler_type", "constant", "--save_strategy", "no"]


def preference_rows(path: Path) -> Path:
    rows = [{"prompt": [{"role": "user", "content": q}], "chosen": [{"role": "assistant", "content": c}],
             "rejected": [{"role": "assistant", "content": r}], "sample_id": k} for k, (q, c, r) in enumerate(ROWS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def train(data: Path, out: Path, *extra: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "judgetrain.train", "recipes/quickstart.yaml", "--train_datasets",
                           f"{{dataset: preference, source: {data}, split: train}}", "--output_dir", str(out), *TRAIN,
                           *extra], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [m for m in read_jsonl(out / "metrics.jsonl") if "train/loss" in m]


def test_a_warm_start_continues_the_adapter_against_the_base(tmp_path, tiny_judge):
    data = preference_rows(tmp_path / "pairs.jsonl")
    first = train(data, tmp_path / "round1", "--max_steps", "2")
    assert first[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-4)  # a fresh adapter is the reference
    assert (tmp_path / "round1" / "adapter_model.safetensors").is_file()
    warm = train(data, tmp_path / "round2", "--max_steps", "1", "--init_adapter", str(tmp_path / "round1"))[0]
    assert abs(warm["train/loss"] - math.log(2)) > 0.02, warm  # the policy starts away from its reference

    # the same step continued by hand: TRL's trainer on the adapter, the reference the base model
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    from judgetrain.data.preference import load_preference
    from judgetrain.models.loading import load_tokenizer

    torch.manual_seed(0)
    tokenizer = load_tokenizer(tiny_judge, require_chat_template=True)
    base = AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(tmp_path / "round1"), is_trainable=True)
    args = DPOConfig(output_dir=str(tmp_path / "by-hand"), per_device_train_batch_size=4, max_steps=1,
                     logging_steps=1, learning_rate=5e-2, lr_scheduler_type="constant", warmup_steps=0,
                     beta=0.1, max_length=1024, report_to=[], save_strategy="no", seed=42, bf16=False,
                     use_cpu=True, gradient_checkpointing=False)
    trainer = DPOTrainer(model=model, args=args, train_dataset=load_preference(str(data)), processing_class=tokenizer)
    assert "ref" in trainer.model.peft_config  # TRL's default: the reference is a frozen copy of the adapter
    trainer.model.delete_adapter("ref")  # continued by hand against the base model
    trainer.model.set_adapter("default")
    trainer.train()
    hand = trainer.state.log_history[0]
    assert warm["train/loss"] == pytest.approx(hand["loss"], rel=1e-4, abs=1e-5)
    for key in ("rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected"):
        assert warm[f"train/{key}"] == pytest.approx(hand[key], rel=1e-4, abs=1e-4), key


def test_init_adapter_needs_an_adapter_folder_and_lora(tmp_path):
    from judgetrain.config.recipe import RecipeError, parse_recipe

    with pytest.raises(RecipeError, match=r"init_adapter: .* holds no adapter_config.json and no "
                                          r"adapter_model.safetensors"):
        parse_recipe([str(REPO / "recipes" / "quickstart.yaml"), "--init_adapter", str(tmp_path)])
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(RecipeError, match="init_adapter: .* starts from a LoRA adapter; set use_peft: true"):
        parse_recipe([str(REPO / "recipes" / "quickstart.yaml"), "--init_adapter", str(tmp_path), "--use_peft", "false"])
