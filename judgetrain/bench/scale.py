"""The scale part (engine eval time at 1x, 2x, 4x rows: `bench_eval_scale`, which lives beside the engine bench it
extends; train time at 1x, 2x, 4x steps) and the quickstart overhead
(the quickstart recipe run for real; its eval time as a share of its epoch time).
"""

# Late imports: judgetrain.config (inside the functions that use them): each benchmark part loads only what it
# measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import argparse
import math
from pathlib import Path

from judgetrain.bench.common import alternating, median, overrides_argv, ratio, run_worker
from judgetrain.bench.train import TrainBench


def bench_train_scale(cfg: argparse.Namespace, tb: TrainBench, workdir: Path) -> dict:
    factors = [1, 2, 4]
    base = cfg.scale_train_steps
    runs: dict[int, list[dict]] = {f: [] for f in factors}
    for i, warm, order in alternating(0, cfg.scale_repeats, factors):
        for f in order:
            runs[f].append(run_worker(tb.spec("judgetrain", f"scale-{f}x-{i}", steps=base * f), workdir, f"scale-{f}x-{i}"))
    times = {f: median([r["train_runtime"] for r in runs[f]]) for f in factors}
    return {"base_steps": base, "train_runtime_s": {f"{f}x": t for f, t in times.items()},
            "scale_2x": ratio(times[2], times[1]), "scale_4x": ratio(times[4], times[1])}


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
        over.update(max_steps=steps, eval_strategy="steps", eval_steps=max(steps // 2, 1))
    over.update(cfg.quickstart_overrides)
    spec = {"kind": "quickstart", "argv": [cfg.recipe, *overrides_argv(over)], "output_dir": str(out_dir)}
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
        from judgetrain.config.recipe import parse_recipe

        targs = parse_recipe([cfg.recipe, "--output_dir", str(out_dir)]).training_args
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
