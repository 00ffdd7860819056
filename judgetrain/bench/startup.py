"""The start-up part (`judgetrain bench --only startup`): time from launch to the first optimizer step, judgetrain
(``python -m judgetrain.train`` on a recipe) against a bare TRL script (`judgetrain.bench.startup_clock.bare_trl`),
on the same JudgeBias-shaped rows at real lengths (``scripts/make_judgebias_rows.py``: prompts 1.6-3k tokens,
completions ~0.64k), SmolLM2-135M-Instruct's real tokenizer and weights (the ``smollm2-135m-instruct`` alias),
the same max_length, batch, LoRA and dataset_num_proc; one optimizer step. With ``--startup-eval-rows N`` both
sides also get a validation split of N rows (the real one: 10,183): TRL tokenises it as its ``eval_dataset``,
judgetrain reads, validates and length-audits it as its ``judgebias`` eval suite; either way it is start-up time.

Each side starts twice: cold (empty datasets cache, fresh output_dir; the loop stops after step 1, whose
checkpoint is saved) and on resume (the same output_dir: judgetrain with ``--resume auto``, TRL with
``resume_from_checkpoint=True``) to its first new step. For the resume it records which cache files the start
created (none: nothing was re-tokenised) and judgetrain's log lines that say what it loaded. Ratios
judgetrain / TRL from the one invocation. Time is wall clock from just before the process is launched to the
clock callback's ``on_step_begin`` of the first step; a cold start runs that step (and saves its checkpoint), a
resume ends there.

Memory of each start: ``peak_rss_mb``, the launched process's own high-water resident set (``VmHWM``) when the
first step begins (the clock reads it: the kernel's count for ``wait4`` would include the bench process's own pages,
copied at the fork before the exec), and ``peak_tree_pss_mb``, the largest sum over the whole process tree (data
workers included) of proportional set sizes (pages shared between a parent and its forked workers counted once),
sampled every half second until the first step begins, and ``peak_tree_anon_pss_mb``, the same for the anonymous
pages alone (the memory the processes made, without the file pages they mapped: Arrow files read memory-mapped count
in PSS while they are read, and the kernel can drop them). Both are the start-up's memory: the step itself (the same
model, batch and max_length on both sides) is not in them.

The environment is the user's: ``TOKENIZERS_PARALLELISM`` is passed through as the bench's own environment has it
(unset, the tokenizers library's default: a batch of texts is encoded on every core, which judgetrain's tokenisation
uses and TRL's one-text-at-a-time tokenisation cannot).
"""

# Late imports: judgetrain.models, pyarrow (inside the functions that use them): each benchmark part loads only what
# it measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from judgetrain.bench.common import BenchError, overrides_argv, ratio, recipe_parts

SIDES = ("judgetrain", "trl")
CLOCK_SCRIPT = Path(__file__).with_name("startup_clock.py")
GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "make_judgebias_rows.py"
# judgetrain's log lines that say what a start loaded rather than computed (the resume's evidence)
CACHE_LOG = re.compile(r"Training rows:|Resuming from|Restarting|Data audit \[|Loading cached|cache file")


def startup_recipe(data_dir: Path, num_proc: int | None, device: str, max_length: int, eval_rows: bool = False) -> dict:
    """The recipe both sides run (the TRL side takes its DPOConfig keys and its LoRA). ``eval_rows``: the rows
    folder has a validation split, read at start as the judgebias eval suite (every row, no cap; scored every
    million steps: never in the bench, and a step stopped by the clock ends no epoch that would evaluate)."""
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
    if eval_rows:
        recipe.update(eval_suites=["judgebias"], eval_judgebias_source=str(data_dir), eval_judgebias_split="validation",
                      eval_strategy="steps", eval_steps=1_000_000)
    if device == "cpu":
        recipe["use_cpu"] = True
    return recipe


def bare_spec(recipe_path: Path, data_dir: Path, model_path: str, output_dir: Path, resume: bool) -> dict:
    dpo, model, rest = recipe_parts(str(recipe_path))
    lora = {"r": model["lora_r"], "lora_alpha": model["lora_alpha"], "lora_dropout": model["lora_dropout"],
            "target_modules": model["lora_target_modules"]}
    eval_file = data_dir / "validation.parquet"
    spec = {"data": str(data_dir / "train.parquet"), "model": model_path, "lora": lora, "resume": resume,
            "dpo": {**dpo, "output_dir": str(output_dir)}}
    if rest.get("eval_suites"):
        spec["eval_data"] = str(eval_file)
    return spec


def cache_files(*folders: Path) -> set[str]:
    return {str(p) for folder in folders if folder.is_dir() for p in folder.rglob("*.arrow")}


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc), best effort: a process may end while it is read."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _tree_pss_mb(pid: int) -> tuple[float, float]:
    """(PSS, anonymous PSS) summed over ``pid``'s process tree, MB. The anonymous part is the memory the processes
    made (heaps, tensors); the rest is file pages they mapped (Arrow files read memory-mapped, libraries), which the
    kernel can drop and read again."""
    total = anon = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                fields = dict(line.split()[:2] for line in f if line.startswith(("Pss:", "Pss_Anon:")))
            total += int(fields.get("Pss:", 0))
            anon += int(fields.get("Pss_Anon:", 0))
        except (OSError, ValueError):
            continue
    return total / 1024, anon / 1024


def _wait(proc: subprocess.Popen, timeout: float, clock: Path | None = None) -> tuple[int, list[float]]:
    """Wait for ``proc`` (killed after ``timeout`` s); its exit code and its tree's peak [PSS, anonymous PSS] in MB
    (`_tree_pss_mb`), sampled every 0.5 s until the process ends or, with ``clock``, until the clock says the first
    step began (the start-up's peak, not the step's)."""
    peak, done = [0.0, 0.0], threading.Event()

    def sample():
        while not done.wait(0.5):
            if clock is not None and clock.is_file() and "first_step_begin_time" in clock.read_text(errors="replace"):
                return
            peak[:] = [max(a, b) for a, b in zip(peak, _tree_pss_mb(proc.pid))]

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        returncode = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        returncode = proc.wait()
    finally:
        done.set()
        sampler.join()
    return returncode, peak


def launch(cmd: list[str], env: dict, clock: Path, log: Path, timeout: float) -> dict:
    """Run one start; its clock's times as seconds after launch and its memory (see the module doc)."""
    clock.unlink(missing_ok=True)
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        returncode, tree_pss = _wait(proc, timeout, clock)
    wall = time.time() - t0
    if returncode != 0 or not clock.is_file():
        tail = log.read_text(errors="replace")[-3000:]
        raise BenchError(f"start-up run {' '.join(cmd[3:5])} failed with exit code {returncode} ({log}):\n{tail}")
    times = json.loads(clock.read_text())
    out = {
        "to_train_begin_s": times["train_begin_time"] - t0,
        "to_first_step_s": times["first_step_begin_time"] - t0,
        "first_global_step": times["first_step_begin_global_step"] + 1,
        "process_wall_s": wall,
        "peak_rss_mb": times.get("first_step_begin_vm_hwm_mb"),
        "peak_tree_pss_mb": tree_pss[0],
        "peak_tree_anon_pss_mb": tree_pss[1],
    }
    if "first_step_end_time" in times:  # cold starts run their step (its checkpoint is the resume's)
        out["first_step_s"] = times["first_step_end_time"] - times["first_step_begin_time"]
    return out


def run_side(side: str, phase: str, recipe_path: Path, data_dir: Path, model_path: str, workdir: Path,
             timeout: float, cold_only: bool = False) -> dict:
    out_dir, hf_cache = workdir / f"{side}-out", workdir / f"{side}-hf-datasets"
    # TOKENIZERS_PARALLELISM as the user's launch has it (unset: the tokenizers library's default, batches encoded on
    # every core; TRL encodes one text at a time either way)
    env = dict(os.environ, HF_DATASETS_CACHE=str(hf_cache), HF_HUB_OFFLINE="1", WANDB_MODE="disabled",
               HF_DATASETS_DISABLE_PROGRESS_BARS="1", TQDM_DISABLE="1")
    env.pop("WORLD_SIZE", None)
    resume = phase == "resume"
    clock, log = workdir / f"{side}-{phase}.clock.json", workdir / f"{side}-{phase}.log"
    mode = "exit-at-first" if resume or cold_only else "stop-after-first"  # cold_only: no step, no checkpoint
    cmd = [sys.executable, str(CLOCK_SCRIPT), str(clock), mode, side]
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
        if cfg.startup_eval_rows and not (data / "validation.parquet").is_file():
            raise BenchError(f"--startup-data {data}: --startup-eval-rows needs a validation.parquet there "
                             f"({GENERATOR.name} --validation-rows N)")
        return data
    if not GENERATOR.is_file():
        raise BenchError(f"the start-up part needs scripts/{GENERATOR.name} (a judgetrain checkout) or --startup-data DIR")
    data = workdir / f"judgebias-{cfg.startup_rows}-{cfg.startup_eval_rows}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(GENERATOR.parent), os.environ.get("PYTHONPATH", "")]))
    extra = ["--validation-rows", str(cfg.startup_eval_rows)] if cfg.startup_eval_rows else []
    proc = subprocess.run([sys.executable, str(GENERATOR), str(data), "--rows", str(cfg.startup_rows), *extra],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"{GENERATOR.name} failed: {proc.stderr[-2000:]}")
    return data


def bench_startup(cfg: argparse.Namespace, workdir: Path) -> dict:
    from judgetrain.models.smollm2 import ensure_smollm2

    workdir.mkdir(parents=True, exist_ok=True)
    data = startup_data(cfg, workdir)
    model_path = ensure_smollm2()  # converted once per machine before anything is timed
    recipe = startup_recipe(data, cfg.startup_num_proc, cfg.device, cfg.startup_max_length, bool(cfg.startup_eval_rows))
    recipe_path = workdir / "startup.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    runs: dict = {side: {} for side in SIDES}
    earlier = _earlier_trl(cfg.startup_trl_from, recipe, data) if cfg.startup_trl_from else None
    # cold: judgetrain then TRL; resume in the other order, so neither side always runs on the warmer machine
    phases = ("cold",) if cfg.startup_cold_only else ("cold", "resume")
    for side, phase in (("judgetrain", "cold"), ("trl", "cold"), ("trl", "resume"), ("judgetrain", "resume")):
        if phase not in phases:
            continue
        if side == "trl" and earlier is not None:
            runs[side][phase] = earlier[phase]
            continue
        runs[side][phase] = run_side(side, phase, recipe_path, data, model_path, workdir, cfg.startup_timeout,
                                     cold_only=cfg.startup_cold_only)
    if earlier is not None:
        runs["trl"]["from"] = str(cfg.startup_trl_from)
    report = {"rows": int(_rows(data / "train.parquet")), "data": str(data), "model": model_path, "recipe": recipe,
              "eval_rows": int(_rows(data / "validation.parquet")) if cfg.startup_eval_rows else 0,
              "dataset_num_proc": recipe.get("dataset_num_proc"), **runs}
    for phase in phases:
        report[f"{phase}_ratio"] = ratio(runs["judgetrain"][phase]["to_first_step_s"], runs["trl"][phase]["to_first_step_s"])
        for key in ("peak_rss_mb", "peak_tree_pss_mb", "peak_tree_anon_pss_mb"):
            report[f"{phase}_{key.removesuffix('_mb')}_ratio"] = ratio(runs["judgetrain"][phase][key], runs["trl"][phase][key])
    if "resume" in phases:
        report["resume_s"] = runs["judgetrain"]["resume"]["to_first_step_s"]
        report["resume_recomputed"] = {side: runs[side]["resume"]["cache_files_created"] for side in SIDES}
    return report


def _earlier_trl(path: str, recipe: dict, data: Path) -> dict:
    """The bare TRL side of an earlier start-up report (``--startup-trl-from``): TRL's figures do not change with
    judgetrain's code, and at full size they are the longest part of the bench. Refused unless that report ran the
    same recipe (every key) on the same rows folder."""
    report = json.loads(Path(path).read_text())
    report = report.get("startup", report)
    same = report.get("recipe") == recipe and Path(report.get("data", "")) == data
    if not same or "trl" not in report:
        raise BenchError(f"--startup-trl-from {path}: not a start-up report of this recipe and these rows ({data})")
    return report["trl"]


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows
