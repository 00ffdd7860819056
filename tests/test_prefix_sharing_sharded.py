"""The prefix-sharing probe under DeepSpeed ZeRO-3 and FSDP2 (2 CPU processes over gloo): it runs at the first
training step, once the weights are placed, keeps prefix sharing on for a right mask and turns it off on every rank
for a wrong one (the rejected completion seeing the chosen one)."""

import importlib.util
import os
import subprocess
import sys

import pytest
from helpers import QUICKSTART, REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.extended(reason="four 2-process ZeRO-3 / FSDP2 launches, ~5-7 min on 2 cores")]

# judgetrain.train, with the packed rows' mask broken when JUDGETRAIN_TEST_FAULT=mask
LAUNCHED = """
import os, sys, torch
from judgetrain.trainer import prefix_sharing as ps
if os.environ.get("JUDGETRAIN_TEST_FAULT") == "mask":
    sys.path.insert(0, "tests")
    from test_prefix_sharing_dtypes import _mask_without_the_pair_rule
    ps.PackedPairs.attention_mask = _mask_without_the_pair_rule
from judgetrain.train import process_main
sys.exit(process_main(sys.argv[1:]))
"""


def _recipe(path):
    text = QUICKSTART.read_text()
    text = text.replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", "")
    text = text.replace("per_device_train_batch_size: 8", "per_device_train_batch_size: 2")
    text += "\nmax_steps: 1\nsave_strategy: 'no'\neval_strategy: 'no'\neval_on_start: false\nlogging_steps: 1\n"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("config", ["zero3.yaml", "fsdp2_cpu.yaml"])
@pytest.mark.parametrize("fault", [None, "mask"])
def test_the_probe_runs_at_the_first_step_once_the_weights_are_placed(tmp_path, config, fault):
    if config.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("the deepspeed package is not installed")
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED)
    out, log = tmp_path / "run", tmp_path / "log.txt"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"accelerate_configs/{config}",
           "--mixed_precision", "no", "--num_processes", "2", "--main_process_port", str(free_port()), str(script),
           _recipe(tmp_path / "recipe.yaml"), "--output_dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JUDGETRAIN_TEST_FAULT": fault or ""}
    proc = subprocess.run(cmd, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, timeout=600)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    assert "the start-up probe runs at the first step" in text
    assert "the start-up probe is skipped" not in text
    if fault is None:
        assert "prefix_sharing: the start-up probe passed at the first step" in text, text[-4000:]
        assert "prefix_sharing: OFF" not in text
    else:
        assert "prefix_sharing: OFF for this run" in text and "does not honour the custom mask" in text, text[-4000:]
