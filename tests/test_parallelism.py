"""The parallelism a launch asks for is the one it gets, or the run stops with the reason (judgetrain.trainer.parallelism)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import QUICKSTART, REPO, free_port

from judgetrain.trainer.parallelism import LaunchRequest as Request, ParallelismError, check_request, honoured, requested_parallelism


def test_the_request_is_read_from_what_accelerate_launch_exports():
    fsdp = requested_parallelism({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                                  "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "false"})
    assert (fsdp.kind, fsdp.fsdp_version, fsdp.processes, fsdp.machines, fsdp.machine_rank) == ("fsdp", 2, 4, 2, 1)
    assert fsdp.fsdp_options == {"offload_params": "false"}
    ds = requested_parallelism({"WORLD_SIZE": "8", "ACCELERATE_USE_DEEPSPEED": "true",
                                "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"})
    assert (ds.kind, ds.zero_stage, ds.machines) == ("deepspeed", 3, 1)
    assert requested_parallelism({"WORLD_SIZE": "2"}).kind == "ddp"
    assert requested_parallelism({}).kind == "single"


@pytest.mark.parametrize("env, machines, machine_rank", [
    ({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1"}, 2, 1),  # torchrun / accelerate launch
    ({"WORLD_SIZE": "16", "CROSS_RANK": "1", "CROSS_SIZE": "2", "LOCAL_SIZE": "8"}, 2, 1),  # DeepSpeed's launcher
    ({"WORLD_SIZE": "32", "SLURM_NODEID": "3", "SLURM_NNODES": "4"}, 4, 3),  # srun, one task per GPU
    ({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, 2, None),  # no launcher says which machine: unknown, not 0
    ({}, 1, 0),
])
def test_the_machine_index_is_read_for_every_documented_launcher(env, machines, machine_rank):
    request = requested_parallelism(env)
    assert (request.machines, request.machine_rank) == (machines, machine_rank)


@pytest.mark.parametrize("request_, gpu, message", [
    (Request("deepspeed", 1, 1, 0, zero_stage=3), False, "ZeRO-3 in a single process on a machine without a GPU"),
    (Request("fsdp", 1, 1, 0, fsdp_version=2), True, "FSDP with a single process"),
    (Request("fsdp", 2, 1, 0, fsdp_version=1), False, "FSDP version 1 on a machine without a GPU"),
])
def test_requests_this_machine_would_downgrade_are_refused_before_loading(request_, gpu, message):
    with pytest.raises(ParallelismError, match=message):
        check_request(request_, gpu=gpu)


def test_fsdp_that_shards_nothing_is_not_honoured():
    req = Request("fsdp", 2, 1, 0, fsdp_version=2)
    ddp_like = {"distributed_type": "MULTI_CPU", "processes": 2, "sharded_tensors": 0, "fsdp_version": None}
    assert "Accelerate runs MULTI_CPU" in honoured(req, ddp_like)
    assert "no parameter" in honoured(req, dict(ddp_like, distributed_type="FSDP", fsdp_version=2))
    assert honoured(req, dict(ddp_like, distributed_type="FSDP", fsdp_version=2, sharded_tensors=54)) is None


def test_deepspeed_that_partitions_nothing_is_not_honoured():
    req = Request("deepspeed", 2, 1, 0, zero_stage=3)
    zero3 = {"distributed_type": "DEEPSPEED", "processes": 2, "zero_stage": 3, "sharded_tensors": 54,
             "optimizer_fraction_on_this_rank": 0.5}
    assert honoured(req, zero3) is None
    assert "DeepSpeed runs ZeRO-2" in honoured(req, dict(zero3, zero_stage=2))
    assert "no parameter of the prepared model is partitioned" in honoured(req, dict(zero3, sharded_tensors=0))
    zero2 = dict(zero3, zero_stage=2, sharded_tensors=0)
    assert honoured(Request("deepspeed", 2, 1, 0, zero_stage=2), zero2) is None
    assert "holds the optimizer state of every parameter" in honoured(
        Request("deepspeed", 2, 1, 0, zero_stage=2), dict(zero2, optimizer_fraction_on_this_rank=1.0))
    assert "Accelerate runs MULTI_CPU" in honoured(req, dict(zero3, distributed_type="MULTI_CPU"))


def _recipe(tmp_path) -> Path:
    text = QUICKSTART.read_text()
    recipe = tmp_path / "quick.yaml"
    recipe.write_text(text.replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", ""))
    return recipe


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None,
                    reason="deepspeed is installed here: the launch trains (tests/test_deepspeed.py)")
def test_a_deepspeed_launch_without_the_package_exits_with_the_reason(tmp_path):
    """accelerate launch itself stops a DeepSpeed config without the package; torchrun with Accelerate's variables
    (what a SLURM script may do) reaches judgetrain, which must not train it as DDP, and says how to install."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_DEEPSPEED": "true",
           "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "judgetrain.train", str(_recipe(tmp_path)), "--output_dir", str(tmp_path / "out"),
           "--eval_suites", "none", "--max_steps", "1"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    assert "ParallelismError: the launch asks for DeepSpeed ZeRO-3 but the deepspeed package is not installed: " \
        "pip install --no-build-isolation deepspeed" in proc.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed here")
def test_judgetrain_train_with_a_deepspeed_config_says_how_to_install_deepspeed(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "judgetrain.cli", "train", str(_recipe(tmp_path)), "--accelerate_config",
                           "accelerate_configs/zero3.yaml", "--output_dir", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert ("judgetrain train: accelerate_configs/zero3.yaml is a DeepSpeed config but the deepspeed package is not "
            "installed: pip install --no-build-isolation deepspeed") in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_fsdp2_config_on_cpu_really_shards_the_model(tmp_path):
    """The GPU config (fsdp_version: 2, use_cpu: false) on 2 CPU processes: before judgetrain.trainer.parallelism this
    trained as plain DDP and exited 0. Now the model is sharded (half of every parameter on each rank)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/fsdp2.yaml",
           "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
           "-m", "judgetrain.train", str(_recipe(tmp_path)), "--output_dir", str(out), "--eval_suites", "none",
           "--max_steps", "1", "--save_strategy", "no", "--logging_steps", "1", "--bf16", "false"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    effect = json.loads((out / "parallelism.json").read_text())
    assert (effect["distributed_type"], effect["fsdp_version"], effect["processes"], effect["backend"]) == \
        ("FSDP", 2, 2, "gloo")
    assert effect["sharded"] == ["parameters", "gradients", "optimizer state"]
    assert effect["sharded_tensors"] > 0
    assert effect["parameters_on_this_rank"] < effect["parameters_full"]
    assert effect["fraction_on_this_rank"] == pytest.approx(0.5, abs=0.02)
    assert "Parallelism in effect: FSDP2, 2 process(es) on 1 machine(s), backend gloo" in proc.stderr


@pytest.mark.parametrize("config, stage", [("zero2.yaml", 2), ("zero3.yaml", 3), ("multinode_zero3.yaml", 3)])
def test_deepspeed_configs_load_into_accelerates_deepspeed_plugin(config, stage):
    """What can be checked without CUDA or the deepspeed package: the plugin Accelerate builds from each config."""
    from accelerate.commands.config.config_args import load_config_from_file

    from judgetrain.checks.dry_run import deepspeed_plugin_config

    cfg = load_config_from_file(str(REPO / "accelerate_configs" / config))
    ds = deepspeed_plugin_config(cfg)
    zero = ds["zero_optimization"]
    assert zero["stage"] == stage
    assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "none"
    # batch sizes, accumulation and clipping come from the recipe (TrainingArguments fills "auto")
    assert ds["train_micro_batch_size_per_gpu"] == ds["gradient_accumulation_steps"] == "auto"
    if stage == 3:  # the save path gathers the partitioned weights into one 16-bit model
        assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    if config.startswith("multinode"):
        assert (cfg.num_machines, cfg.rdzv_backend, cfg.same_network) == (2, "static", True)


@pytest.mark.parametrize("moe, recipe_value, expected", [(False, None, False), (True, None, True), (False, True, True)])
def test_ddp_looks_for_unused_parameters_only_where_a_model_can_leave_some(tiny_judge, tmp_path, moe, recipe_value,
                                                                           expected):
    """The tiny judge with LoRA uses every trainable parameter: DDP does not look for unused ones (transformers would
    for any PEFT model, and torch then warns every run that it found none); a mixture of experts (a token reaches 1 of
    4 experts) does; a recipe's own value stands."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, MixtralConfig
    from trl import DPOConfig

    from judgetrain.trainer.dpo import JudgeDPOTrainer

    tok = AutoTokenizer.from_pretrained(tiny_judge)
    if moe:
        config = MixtralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=1)
        model = AutoModelForCausalLM.from_config(config)
    else:
        model = AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32)
    rows = Dataset.from_list([{"prompt": "Which is right?", "chosen": " A", "rejected": " B"}] * 2)
    args = DPOConfig(output_dir=str(tmp_path), max_length=64, report_to="none", use_cpu=True, bf16=False,
                     activation_checkpointing=False, dataloader_num_workers=0, ddp_find_unused_parameters=recipe_value)
    trainer = JudgeDPOTrainer(model=model, args=args, train_dataset=rows, processing_class=tok,
                              peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]), prefix_sharing=False)
    assert trainer.args.ddp_find_unused_parameters is recipe_value  # the arguments stay as given
    assert trainer.accelerator.ddp_handler.find_unused_parameters is expected
