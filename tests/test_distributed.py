"""Distributed training correctness: 2 processes x batch b follow the same loss curve as 1 process x batch 2b.

(Eval across 1, 2 and 3 processes on a row count that does not divide evenly: tests/test_eval_cli.py.)"""

import sys

import pytest

from helpers import QUICKSTART, free_port, read_jsonl, run


def _train(out, processes, batch):
    recipe = out.parent / f"r{processes}.yaml"
    text = QUICKSTART.read_text()
    text = text.replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", "")
    recipe.write_text(text)
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no", "--num_processes", str(processes)]
    launcher += ["--multi_gpu", "--main_process_port", str(free_port())] if processes > 1 else ["--cpu"]
    cmd = launcher + ["-m", "judgetrain.train", str(recipe), "--output_dir", str(out), "--eval_suites", "none",
                      "--max_steps", "4", "--logging_steps", "1", "--save_strategy", "no",
                      "--per_device_train_batch_size", str(batch), "--lr_scheduler_type", "constant", "--warmup_steps", "0"]
    run(cmd, env={"OMP_NUM_THREADS": "1"}, timeout=600)
    return read_jsonl(out / "metrics.jsonl")


@pytest.mark.slow
def test_two_processes_of_batch_b_follow_the_loss_curve_of_one_process_of_batch_2b(tmp_path):
    one = [r for r in _train(tmp_path / "one", 1, 4) if "train/loss" in r]
    two = [r for r in _train(tmp_path / "two", 2, 2) if "train/loss" in r]
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2, 3, 4]
    # Same global batches (accelerate shards each global batch of the seeded sampler across ranks), gradients
    # averaged by DDP, losses and rewards gathered for logging: equal up to float reduction order.
    for a, b in zip(one, two):
        for key in ("train/loss", "train/rewards/margins", "train/rewards/accuracies", "train/logps/chosen"):
            assert b[key] == pytest.approx(a[key], rel=2e-3, abs=2e-3), (a["step"], key, a[key], b[key])
    assert one[-1]["train/loss"] < one[0]["train/loss"]  # and it is learning, not a flat line
