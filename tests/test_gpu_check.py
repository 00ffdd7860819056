"""scripts/gpu_check.py in its CPU mode (tiny shapes): every check runs and passes, and the JSON holds the figures a
person reads on a GPU machine, so the script cannot rot between GPU loans."""

import json
import sys

import pytest
from helpers import REPO, run


@pytest.mark.slow
def test_the_gpu_check_runs_every_check_on_cpu_and_writes_its_figures(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--out", out, "--workdir", tmp_path / "w"],
               cwd=REPO, env={"OMP_NUM_THREADS": "1"}, timeout=600, check=False)
    report = json.loads(out.read_text())
    checks = report["checks"]
    assert list(checks) == ["quickstart", "prefix_sharing", "eval_engine", "memory", "bench"]
    assert {k: v["ok"] for k, v in checks.items()} == dict.fromkeys(checks, True), (proc.stderr[-3000:], checks)
    assert proc.returncode == 0 and report["ok"] is True
    assert all(0 < v["seconds"] <= v["cap_s"] for v in checks.values())
    quick = checks["quickstart"]["figures"]
    assert quick["steps"] == 1 and quick["prefix_sharing_line"].startswith("prefix_sharing: on")
    assert "eval/rmbench/total_avg_acc" in quick["eval"]
    share = checks["prefix_sharing"]["figures"]
    assert share["probe"]["max_abs_diff"] <= share["probe"]["allowed"][1]
    assert share["sdpa"]["loss_rel_diff"] <= share["tolerance"]["loss_rel"]
    engine = checks["eval_engine"]["figures"]
    assert engine["float32"]["max_rel_score_diff"] <= 1e-4 and engine["bfloat16"]["shared_prompts"] > 0
    mem = checks["memory"]["figures"]["cases"]
    assert [(c["lora_r"], c["checkpointing"]) for c in mem] == [(16, False), (None, True)]
    assert all(c["measured_mib"] > 0 and c["bf16"] for c in mem)
    assert checks["bench"]["figures"]["tiny"]["train_tokens_per_s"] > 0
    assert report["environment"]["device"] == "cpu" and report["setup"]["missing"] == []
