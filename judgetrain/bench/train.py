"""The train part: judgetrain's trainer path against a bare `trl.DPOTrainer` on the same rows, seed and DPOConfig
(speed, peak memory, the speed options), and the train_shapes part: prefix sharing on JudgeBias- and RM-Bench-shaped
rows.
"""

# Late imports: torch, datasets, judgetrain.config, judgetrain.data, judgetrain.models (inside the functions that use
# them): each benchmark part loads only what it measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import argparse
import importlib.util
import logging
from pathlib import Path
from typing import Any

from judgetrain.bench.common import BenchError, alternating, median, overrides_argv, ratio, recipe_parts, run_worker
from judgetrain.bench.eval import rmbench_rows

logger = logging.getLogger(__name__)


class TrainBench:
    """Prepares the shared rows and builds the worker specs of both sides."""

    def __init__(self, recipe: str, workdir: Path, steps: int, batch_size: int | None, device: str):
        from judgetrain.config.recipe import parse_recipe
        from judgetrain.data.lengths import audit_lengths
        from judgetrain.data.prepare import build_train_dataset
        from judgetrain.models.aliases import resolve_model
        from judgetrain.models.loading import load_recipe_tokenizer, model_init_kwargs

        self.recipe, self.workdir, self.steps, self.device = recipe, workdir, steps, device
        self.base = {"eval_suites": "none", "eval_strategy": "no", "eval_on_start": False, "save_strategy": "no",
                     "report_to": "none", "logging_steps": 1_000_000, "disable_tqdm": True}
        if batch_size:
            self.base["per_device_train_batch_size"] = batch_size
        if device == "cpu":
            self.base["use_cpu"] = True
        parsed = parse_recipe(
            [recipe, *overrides_argv({**self.base, "output_dir": str(workdir / "prep"), "max_steps": steps})]
        )
        script_args, training_args, model_args = parsed.script_args, parsed.training_args, parsed.model_args
        self.model_path = resolve_model(model_args.model_name_or_path)
        tokenizer = load_recipe_tokenizer(self.model_path, training_args, model_args)
        dataset = build_train_dataset(parsed)
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
        dpo, model_keys, _ = recipe_parts(recipe)
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
            return {"kind": "train_judgetrain", "argv": [self.recipe, *overrides_argv(over)], "output_dir": out}
        trainer = options.pop("trainer", "trl")
        allocator = options.pop("cpu_allocator", "system")  # set by the worker process (not a DPOConfig key)
        dpo = {**self.dpo, **options, "output_dir": out, "max_steps": steps}
        return {"kind": "train_bare", "data": self.data_path, "model": self.model_path, "dpo": dpo, "lora": self.lora,
                "trainer": trainer, "cpu_allocator": allocator}


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
    runs = _side_runs(cfg, tb, workdir)
    out.update(_side_figures(runs, tb))
    out["options"] = {}
    options = _speed_options(cfg, out)
    if cfg.options:  # --options: these alone
        options = {k: v for k, v in options.items() if k in cfg.options}
    if not cfg.skip_options:
        out["options"] = _option_figures(cfg, tb, workdir, options)
    out["_bench"] = tb
    return out


def _side_runs(cfg: argparse.Namespace, tb: TrainBench, workdir: Path) -> dict[str, list[dict]]:
    """judgetrain as a recipe runs it (prefix_sharing on, the default), judgetrain with prefix_sharing off (its own
    overhead over TRL: adapters, audit, callbacks), and the bare TRL script, in alternating order: the results of
    each side's measured rounds (warm-up rounds left out)."""
    runs: dict[str, list[dict]] = {"judgetrain": [], "judgetrain_unshared": [], "bare_trl": []}
    sides = {"judgetrain": ("judgetrain", None), "judgetrain_unshared": ("judgetrain", {"prefix_sharing": False}),
             "bare_trl": ("bare", None)}
    for i, warm, order in alternating(cfg.warmup, cfg.repeats, list(runs)):
        for name in order:
            side, options = sides[name]
            res = run_worker(tb.spec(side, f"{name}-{i}", options=options), workdir, f"{name}-{i}")
            logger.info("train %s round %d%s: %.2f samples/s, peak %.0f MB", name, i, " (warm-up)" if warm else "",
                        res["train_samples_per_second"], res["peak_rss_mb"])
            if not warm:
                runs[name].append(res)
    return runs


def _side_figures(runs: dict[str, list[dict]], tb: TrainBench) -> dict[str, Any]:
    """Whether both sides trained with the same arguments, each side's figures and their ratios to bare TRL."""
    out: dict[str, Any] = {}
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
    return out


def _speed_options(cfg: argparse.Namespace, out: dict[str, Any]) -> dict[str, dict]:
    """The speed options measured (TRL DPOConfig switches): liger's on a GPU where it is installed, else said in
    ``out["options_skipped"]``."""
    options = {"precompute_ref_log_probs": {"precompute_ref_log_probs": True},
               "activation_checkpointing": {"activation_checkpointing": True}}
    import torch

    if cfg.device == "cpu":  # judgetrain.utils.allocator: the large blocks of each step kept in the heap
        options["cpu_allocator"] = {"cpu_allocator": "keep"}

    if cfg.device == "cuda" and torch.cuda.is_available():
        if importlib.util.find_spec("liger_kernel") is not None:
            options["use_liger_kernel"] = {"use_liger_kernel": True}
        else:  # not a dependency: measured only where installed, and said so in bench.json
            out["options_skipped"] = {"use_liger_kernel": "liger-kernel is not installed (pip install liger-kernel)"}
            logger.warning("bench: use_liger_kernel not measured: liger-kernel is not installed")
    return options


def _option_figures(cfg: argparse.Namespace, tb: TrainBench, workdir: Path, options: dict[str, dict]) -> dict:
    """Each speed option against the same run without it. One epoch over exactly steps x batch rows, so a one-off
    cost (precompute_ref_log_probs scores the whole train set before step 1) is paid for the rows it serves; the
    bare-TRL worker takes that row subset directly."""
    out = {}
    subset = str(workdir / "option_rows.parquet")
    tb.dataset.select(range(min(tb.rows, cfg.train_steps * tb.batch))).to_parquet(subset)
    for opt, extra in options.items():
        o_runs: dict[str, list[dict]] = {"plain": [], opt: []}
        for i, warm, order in alternating(0, cfg.option_repeats, list(o_runs)):
            for name in order:
                spec = tb.spec("bare", f"{opt}-{name}-{i}", options=extra if name == opt else None)
                spec["data"] = subset
                o_runs[name].append(run_worker(spec, workdir, f"opt-{opt}-{name}-{i}"))
        plain, on = (_train_figures(o_runs[k], tb.tokens_per_sample, tb.batch) for k in ("plain", opt))
        out[opt] = {
            "plain": plain, "on": on,
            "samples_per_s_ratio": ratio(on["samples_per_s"], plain["samples_per_s"]),
            "wall_ratio": ratio(on["wall_s"], plain["wall_s"]),
            "peak_memory_ratio": ratio(on["peak_rss_mb"], plain["peak_rss_mb"]),
        }
    return out

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
            for r in rmbench_rows(rmbench_source, None) for c, j in zip(r["chosen"], r["rejected"])
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
                       dpo_extra: dict | None = None, shapes: list[str] | None = None) -> dict:
    """The bare TRL script against the same script with `JudgeDPOTrainer`, on JudgeBias- and RM-Bench-shaped
    rows: samples/s, peak memory and tokens computed per response. ``model_path``: another model than the recipe's
    (the GPU part's real shape), with ``dpo_extra`` DPOConfig keys (bf16). ``shapes``: of ``cfg.train_shapes``, these
    only (None: all)."""
    out: dict[str, Any] = {}
    n = cfg.train_steps * tb.batch
    wanted = getattr(cfg, "train_shapes", None) or TRAIN_SHAPES
    for shape in [s for s in wanted if shapes is None or s in shapes]:
        rows = _shape_rows(tb, shape, n, cfg.rmbench_source)
        path = str(workdir / f"shape_{shape}.parquet")
        from datasets import Dataset

        Dataset.from_list(rows).to_parquet(path)
        runs: dict[str, list[dict]] = {"trl": [], "prefix_sharing": []}
        for i, warm, order in alternating(cfg.warmup, cfg.repeats, list(runs)):
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
