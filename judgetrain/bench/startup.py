"""The start-up part (`judgetrain bench --only startup`): time from launch to the first optimizer step, judgetrain
(``python -m judgetrain.train`` on a recipe) against a bare TRL script (`judgetrain.bench.startup_clock.bare_trl`),
on the same JudgeBias-shaped rows at real lengths (``scripts/make_judgebias_rows.py``: prompts 1.6-3k tokens,
completions ~0.64k), SmolLM2-135M-Instruct's real tokenizer and weights (the ``smollm2-135m-instruct`` alias),
the same max_length, batch, LoRA and dataset_num_proc; one optimizer step.

Each side starts twice: cold (empty datasets cache, fresh output_dir; the loop stops after step 1, whose
checkpoint is saved) and on resume (the same output_dir: judgetrain with ``--resume auto``, TRL with
``resume_from_checkpoint=True``) to its first new step. For the resume it records which cache files the start
created (none: nothing was re-tokenised) and judgetrain's log lines that say what it loaded. Ratios
judgetrain / TRL from the one invocation. Time is wall clock from just before the process is launched to the
clock callback's ``on_step_begin`` of the first step; a cold start runs that step (and saves its checkpoint), a
resume ends there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from judgetrain.bench.common import BenchError, overrides_argv, ratio, recipe_parts

SIDES = ("judgetrain", "trl")
CLOCK_SCRIPT = Path(__file__).with_name("startup_clock.py")
GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "make_judgebias_rows.py"
# judgetrain's log lines that say what a start loaded rather than computed (the resume's evidence)
CACHE_LOG = re.compile(r"Training rows:|Resuming from|Restarting|Data audit \[|Loading cached|cache file")


def startup_recipe(data_dir: Path, num_proc: int | None, device: str, max_length: int) -> dict:
    """The recipe both sides run (the TRL side takes its DPOConfig keys and its LoRA)."""
    recipe = {
        "model_name_or_path": "smollm2-135m-instruct", "use_peft": True, "lora_r": 8, "lora_alpha": 16,
        "lora_dropout": 0.0, "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "train_datasets": [{"dataset": "judgebias", "source": str(data_dir), "split": "train"}],
        "long_rows": "error", "eval_suites": [],
        "max_length": max_length, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1,
        "max_steps": 2, "learning_rate": 1.0e-4, "logging_steps": 1, "save_strategy": "steps", "save_steps": 1,
        "bf16": False, "activation_checkpointing": False, "report_to": "none", "disable_tqdm": True, "seed": 42,
        "data_seed": 42, "dataloader_num_workers": 0,
    }
    if num_proc and num_proc > 1:
        recipe["dataset_num_proc"] = num_proc
    if device == "cpu":
        recipe["use_cpu"] = True
    return recipe


def bare_spec(recipe_path: Path, data_dir: Path, model_path: str, output_dir: Path, resume: bool) -> dict:
    dpo, model, _ = recipe_parts(str(recipe_path))
    lora = {"r": model["lora_r"], "lora_alpha": model["lora_alpha"], "lora_dropout": model["lora_dropout"],
            "target_modules": model["lora_target_modules"]}
    return {"data": str(data_dir / "train.parquet"), "model": model_path, "lora": lora, "resume": resume,
            "dpo": {**dpo, "output_dir": str(output_dir)}}


def cache_files(*folders: Path) -> set[str]:
    return {str(p) for folder in folders if folder.is_dir() for p in folder.rglob("*.arrow")}


def launch(cmd: list[str], env: dict, clock: Path, log: Path, timeout: float) -> dict:
    """Run one start; its clock's times as seconds after launch."""
    clock.unlink(missing_ok=True)
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    wall = time.time() - t0
    if proc.returncode != 0 or not clock.is_file():
        tail = log.read_text(errors="replace")[-3000:]
        raise BenchError(f"start-up run {' '.join(cmd[3:5])} failed with exit code {proc.returncode} ({log}):\n{tail}")
    times = json.loads(clock.read_text())
    out = {
        "to_train_begin_s": times["train_begin_time"] - t0,
        "to_first_step_s": times["first_step_begin_time"] - t0,
        "first_global_step": times["first_step_begin_global_step"] + 1,
        "process_wall_s": wall,
    }
    if "first_step_end_time" in times:  # cold starts run their step (its checkpoint is the resume's)
        out["first_step_s"] = times["first_step_end_time"] - times["first_step_begin_time"]
    return out


def run_side(side: str, phase: str, recipe_path: Path, data_dir: Path, model_path: str, workdir: Path,
             timeout: float) -> dict:
    out_dir, hf_cache = workdir / f"{side}-out", workdir / f"{side}-hf-datasets"
    env = dict(os.environ, HF_DATASETS_CACHE=str(hf_cache), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               WANDB_MODE="disabled", HF_DATASETS_DISABLE_PROGRESS_BARS="1", TQDM_DISABLE="1")
    env.pop("WORLD_SIZE", None)
    resume = phase == "resume"
    clock, log = workdir / f"{side}-{phase}.clock.json", workdir / f"{side}-{phase}.log"
    cmd = [sys.executable, str(CLOCK_SCRIPT), str(clock), "exit-at-first" if resume else "stop-after-first", side]
    if side == "trl":
        spec = workdir / f"trl-{phase}.spec.json"
        spec.write_text(json.dumps(bare_spec(recipe_path, data_dir, model_path, out_dir, resume)))
        cmd.append(str(spec))
    else:
        cmd += [str(recipe_path), *overrides_argv({"output_dir": str(out_dir)})]
        if resume:
            cmd += ["--resume", "auto"]
    before = cache_files(out_dir, hf_cache)
    result = launch(cmd, env, clock, log, timeout)
    created = sorted(cache_files(out_dir, hf_cache) - before)
    result["cache_files_created"] = [str(Path(p).relative_to(workdir)) for p in created]
    result["log"] = str(log)
    if side == "judgetrain":
        result["log_cache_lines"] = [re.sub(r"^.*?(?=(" + CACHE_LOG.pattern + "))", "", line).strip()
                                     for line in log.read_text(errors="replace").splitlines() if CACHE_LOG.search(line)]
    if resume and result["first_global_step"] != 2:
        raise BenchError(f"{side} resume started at step {result['first_global_step']}, not at step 2 ({log})")
    return result


def startup_data(cfg: argparse.Namespace, workdir: Path) -> Path:
    """The rows folder: ``--startup-data``, or ``--startup-rows`` rows written by scripts/make_judgebias_rows.py."""
    if cfg.startup_data:
        data = Path(cfg.startup_data)
        if not (data / "train.parquet").is_file():
            raise BenchError(f"--startup-data {data}: no train.parquet there (write one with {GENERATOR.name})")
        return data
    if not GENERATOR.is_file():
        raise BenchError(f"the start-up part needs scripts/{GENERATOR.name} (a judgetrain checkout) or --startup-data DIR")
    data = workdir / f"judgebias-{cfg.startup_rows}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(GENERATOR.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(GENERATOR), str(data), "--rows", str(cfg.startup_rows)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"{GENERATOR.name} failed: {proc.stderr[-2000:]}")
    return data


def bench_startup(cfg: argparse.Namespace, workdir: Path) -> dict:
    from judgetrain.models.smollm2 import ensure_smollm2

    workdir.mkdir(parents=True, exist_ok=True)
    data = startup_data(cfg, workdir)
    model_path = ensure_smollm2()  # converted once per machine before anything is timed
    recipe = startup_recipe(data, cfg.startup_num_proc, cfg.device, cfg.startup_max_length)
    recipe_path = workdir / "startup.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    runs: dict = {side: {} for side in SIDES}
    # cold: judgetrain then TRL; resume in the other order, so neither side always runs on the warmer machine
    for side, phase in (("judgetrain", "cold"), ("trl", "cold"), ("trl", "resume"), ("judgetrain", "resume")):
        runs[side][phase] = run_side(side, phase, recipe_path, data, model_path, workdir, cfg.startup_timeout)
    report = {"rows": int(_rows(data)), "data": str(data), "model": model_path, "recipe": recipe,
              "dataset_num_proc": recipe.get("dataset_num_proc"), **runs}
    for phase in ("cold", "resume"):
        report[f"{phase}_ratio"] = ratio(runs["judgetrain"][phase]["to_first_step_s"], runs["trl"][phase]["to_first_step_s"])
    report["resume_s"] = runs["judgetrain"]["resume"]["to_first_step_s"]
    report["resume_recomputed"] = {side: runs[side]["resume"]["cache_files_created"] for side in SIDES}
    return report


def _rows(data: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(data / "train.parquet").metadata.num_rows
