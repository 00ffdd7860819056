"""What the vLLM backend hands ``vllm.LLM`` (`judgetrain.eval.vllm.vllm_engine_kwargs`), built without vLLM: the
base model at the run's pinned revision (a hub id; a local folder as it is), LoRA sized to the adapter, sleep mode only
where vLLM has it (CUDA), and what a recipe's keys and a run's pinned revision pass down. The engine's memory before
and after, and sleep mode itself, need a GPU: scripts/gpu_check.py's ``vllm`` check."""

from __future__ import annotations

import logging

import pytest
import torch

from judgetrain.eval.generate import Generator
from judgetrain.eval.vllm import vllm_engine_kwargs, vllm_revision

PINNED, OTHER = "b" * 40, "c" * 40
HUB_ID = "judgetrain-test/judge"


def _model(tiny_judge, hub: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)
    if hub:  # what from_pretrained("owner/name") records: the hub id, not a folder
        model.config.name_or_path = HUB_ID
    return model, AutoTokenizer.from_pretrained(tiny_judge)


def _lora(model, r: int = 12, revision: str | None = None):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=r, target_modules=["q_proj", "v_proj"], revision=revision))


def test_a_lora_engine_loads_the_base_at_the_pinned_commit_from_the_run_or_the_adapter(tiny_judge):
    model, tok = _model(tiny_judge, hub=True)
    model = _lora(model, revision=PINNED)  # training records the pinned commit on the adapter
    kwargs, peft = vllm_engine_kwargs(Generator(model, tok, max_new_tokens=8, max_length=256, seed=3),
                                      {"gpu_memory_utilization": 0.3})
    assert peft is True
    assert kwargs["model"] == kwargs["tokenizer"] == HUB_ID
    assert kwargs["revision"] == kwargs["tokenizer_revision"] == PINNED
    assert (kwargs["enable_lora"], kwargs["max_lora_rank"], kwargs["max_loras"]) == (True, 16, 1)
    assert (kwargs["seed"], kwargs["max_model_len"], kwargs["dtype"], kwargs["trust_remote_code"]) == \
        (3, 256, "float32", False)
    # the run's pinned revision is what the engine loads, before the adapter's record
    gen = Generator(model, tok, max_new_tokens=8, max_length=256, model_revision=OTHER)
    assert vllm_engine_kwargs(gen, {})[0]["revision"] == OTHER
    assert gen.replace(seed=1).model_revision == OTHER  # kept by replace


def test_without_a_pin_a_hub_model_loads_as_it_was_and_a_local_folder_never_takes_a_revision(tiny_judge):
    model, tok = _model(tiny_judge, hub=True)
    lora = _lora(model)
    assert vllm_revision(lora, HUB_ID) is None  # nothing pinned, nothing recorded: main, as it loaded
    kwargs, _ = vllm_engine_kwargs(Generator(lora, tok, max_new_tokens=8), {})
    assert kwargs["model"] == HUB_ID
    assert "revision" not in kwargs and "tokenizer_revision" not in kwargs
    local, tok = _model(tiny_judge, hub=False)
    local = _lora(local, revision=PINNED)
    kwargs, _ = vllm_engine_kwargs(Generator(local, tok, max_new_tokens=8, model_revision=PINNED), {})
    assert kwargs["model"] == tiny_judge and "revision" not in kwargs  # the folder's files are what loaded
    assert vllm_revision(local, tiny_judge, PINNED) is None and vllm_revision(local, HUB_ID, None) == PINNED


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU half: on CUDA sleep mode is passed (gpu_check.py)")
def test_sleep_mode_and_the_gpu_share_are_dropped_where_vllm_has_no_gpu(tiny_judge, caplog):
    model, tok = _model(tiny_judge, hub=False)
    lora = _lora(model)
    with caplog.at_level(logging.WARNING, logger="judgetrain.eval.generate"):
        kwargs, _ = vllm_engine_kwargs(Generator(lora, tok, max_new_tokens=8),
                                       {"gpu_memory_utilization": 0.3, "enable_sleep_mode": True, "swap_space": 2})
    assert "enable_sleep_mode" not in kwargs and "gpu_memory_utilization" not in kwargs and kwargs["swap_space"] == 2
    assert "sleep mode needs CUDA" in caplog.text
    assert "distributed_executor_backend" not in kwargs  # one process
    # a full fine-tune is refused on vLLM's CPU build, before any engine (and without vLLM installed)
    with pytest.raises(RuntimeError, match="on vLLM's CPU build runs LoRA adapters only"):
        vllm_engine_kwargs(Generator(lora.get_base_model(), tok, max_new_tokens=8), {})


def test_the_recipe_and_the_run_pass_sleep_mode_and_the_pinned_revision_to_the_generator(tmp_path):
    from judgetrain.config.recipe import JudgeTrainArguments, Recipe
    from judgetrain.eval.callback import JudgeEvalCallback
    from judgetrain.eval.rows import recipe_specs
    from trl import DPOConfig, ModelConfig

    script = JudgeTrainArguments(eval_scoring=["implicit", "generate"], eval_generate_vllm_sleep=True,
                                 eval_suites=["judgebias"])
    assert script.generator_kwargs()["vllm_kwargs"] == {"gpu_memory_utilization": 0.3, "enable_sleep_mode": True}
    training = DPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    recipe = Recipe(script, training, ModelConfig(model_revision=PINNED), {})
    cb = JudgeEvalCallback.from_recipe(recipe, recipe_specs(recipe), None)
    assert cb.evaluation.model_revision == PINNED
    assert cb.evaluation.args.generator_kwargs()["vllm_kwargs"]["enable_sleep_mode"] is True
