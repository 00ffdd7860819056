"""The recipe's ddp_timeout is the process group's: judgetrain joins the group before the recipe is fully parsed, and
Accelerate does not create it again, so without this the group keeps the backend's default (NCCL: 10 minutes) while
rank 0 alone prepares data behind barriers.

Rank 0 is made slow for real: a ``sitecustomize`` on the workers' path holds rank 0's first read of the training file
for 12 s (an audit hook on open), as a large dataset's preparation does, with no hook in judgetrain itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import QUICKSTART, REPO
from judgetrain.trainer.process import ddp_timeout_of

SLOW_RANK0 = '''
import os, sys, time
_delay = float(os.environ.get("JUDGETRAIN_TEST_SLOW_READ") or 0)
if _delay and os.environ.get("RANK") == "0":
    _done = []

    def _hook(event, args):
        if event == "open" and not _done and str(args[0]).endswith("slow_train.jsonl"):
            _done.append(1)
            time.sleep(_delay)

    sys.addaudithook(_hook)
'''


def test_ddp_timeout_is_read_from_the_command_line_the_recipe_and_the_default(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(QUICKSTART.read_text() + "\nddp_timeout: 600\n")
    assert ddp_timeout_of([str(QUICKSTART)]) == 1800  # TrainingArguments' default
    assert ddp_timeout_of([str(recipe)]) == 600
    assert ddp_timeout_of([str(recipe), "--ddp_timeout", "42"]) == 42
    assert ddp_timeout_of([str(recipe), "--ddp_timeout=7"]) == 7


def _launch(tmp_path, timeout_s: int, name: str):
    from pyarrow import parquet as pq

    from judgetrain.data.io import sample_source

    rows = pq.read_table(f"{sample_source('judgebias')}/train.parquet").to_pylist()[:40]
    data = tmp_path / "slow_train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(QUICKSTART.read_text().replace(
        "  - {dataset: judgebias, source: bundled, split: train}\n", f"  - {{dataset: judgebias, source: {data}, split: train}}\n"
    ).replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", ""))
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SLOW_RANK0)
    env = {**os.environ, "JUDGETRAIN_TEST_SLOW_READ": "12",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu.yaml",
           "-m", "judgetrain.train", str(recipe), "--output_dir", str(tmp_path / name), "--max_steps", "1",
           "--eval_suites", "none", "--save_strategy", "no", "--ddp_timeout", str(timeout_s)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.extended(reason="two 2-process launches, one waiting out a DDP timeout")
def test_a_short_ddp_timeout_stops_a_run_whose_rank_0_is_slow_and_a_long_one_passes(tmp_path):
    short = _launch(tmp_path, 5, "short")
    assert short.returncode != 0, short.stderr[-3000:]
    assert "5000ms" in short.stderr or "Timed out" in short.stderr or "timeout" in short.stderr.lower(), short.stderr[-3000:]
    long = _launch(tmp_path, 300, "long")
    assert long.returncode == 0, long.stderr[-3000:]
    assert (tmp_path / "long" / "adapter_model.safetensors").is_file()
