"""Evals on the live training model under DeepSpeed ZeRO-3 and FSDP2 (2 CPU processes over gloo) leave training as
it was: a run that scores and generates at step 2 trains steps 3 and 4 to the same losses and the same final adapter
as a run without evals. Under ZeRO-3 generation gathers the parameters once per generate call (TRL's
``unwrap_model_for_generation``): no padding generate calls keep the ranks' forwards in step."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers import QUICKSTART, REPO, free_port, read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.extended(reason="four 2-process ZeRO-3 / FSDP2 launches, ~2-4 min on 2 cores")]

STEPS, EVAL_AT = 4, 2
TIMED = ("runtime", "per_second", "_seconds")


def _recipe(path, evals: bool) -> str:
    text = QUICKSTART.read_text()
    text = text.replace("  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n", "")
    text = text.replace("per_device_train_batch_size: 8", "per_device_train_batch_size: 2")
    text = text.replace("eval_suites: [rmbench, judgebias, ideation]",
                        "eval_suites: [judgebias]" if evals else "eval_suites: none")
    text = text.replace("eval_scoring: [implicit, judge]", "eval_scoring: [implicit, generate]")
    text = text.replace("eval_max_rows: null", "eval_max_rows: 6")
    text += (f"\nmax_steps: {STEPS}\nsave_strategy: 'no'\neval_steps: {EVAL_AT}\neval_on_start: false\nlogging_steps: 1\n"
             "lr_scheduler_type: constant\nwarmup_steps: 0\neval_generate_max_rows: 3\neval_generate_max_new_tokens: 4\n"
             "eval_batch_tokens: 1024\n")
    path.write_text(text)
    return str(path)


def _launch(config: str, recipe: str, out, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"accelerate_configs/{config}",
           "--mixed_precision", "no", "--num_processes", "2", "--main_process_port", str(free_port()),
           "-m", "judgetrain.train", recipe, "--output_dir", str(out)]
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def _train_records(out) -> dict[int, dict]:
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("train/") and not k.endswith(TIMED)}
            for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r}


@pytest.mark.parametrize("config", ["zero3.yaml", "fsdp2_cpu.yaml"])
def test_training_after_an_eval_that_scored_and_generated_equals_training_without_evals(tmp_path, config):
    if config.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("the deepspeed package is not installed")
    from safetensors.torch import load_file

    runs = {}
    for evals in (True, False):
        out, log = tmp_path / f"evals-{evals}", tmp_path / f"evals-{evals}.log"
        runs[evals] = (out, log, _launch(config, _recipe(tmp_path / f"recipe-{evals}.yaml", evals), out, log))
    for out, log, proc in runs.values():
        assert proc.wait(timeout=900) == 0, log.read_text(errors="replace")[-4000:]
    (with_eval, _, _), (without, _, _) = runs[True], runs[False]

    # the eval ran at step 2 (and at the last step), scored and generated every sampled row
    results = json.loads((with_eval / "eval" / str(EVAL_AT) / "results.json").read_text())
    stats = results["mode_stats"]["judgebias"]["generate"]
    zero3 = config.startswith("zero")
    # rank 0's 2 of the 3 prompts; ZeRO-3: one gather for the call, no padding call (FSDP2: synced_gpus, rank 0 has
    # the longer share and runs none either)
    assert (stats["prompts"], stats["padding_batches"], stats["gathered_calls"]) == (2, 0, int(zero3)), stats
    said = "the parameters are gathered whole once per generate call" in runs[True][1].read_text(errors="replace")
    assert said == zero3
    generated = read_jsonl(with_eval / "eval" / str(EVAL_AT) / "judgebias.generate.jsonl")
    assert len(generated) == 3 and all(o["n_tokens"] > 0 for r in generated for o in r["outputs"])
    assert not (without / "eval").exists()

    # every training figure of every step, and the final adapter, as without evals
    a, b = _train_records(with_eval), _train_records(without)
    assert sorted(a) == list(range(1, STEPS + 1)) and len(a[1]) >= 5, a
    assert a == b
    wa, wb = load_file(with_eval / "adapter_model.safetensors"), load_file(without / "adapter_model.safetensors")
    assert wa.keys() == wb.keys() and len(wa) > 0
    for name in wa:
        assert wa[name].equal(wb[name]), name
