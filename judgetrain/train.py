"""Train an LLM judge with DPO (full fine-tune or LoRA) from a recipe, evaluated every epoch.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m judgetrain.train recipes/quickstart.yaml
    judgetrain train recipes/quickstart.yaml --learning_rate 1e-4      # hands over to accelerate launch
    judgetrain train recipes/judgebias_qwen3_8b_lora.yaml --dry-run    # validate without loading weights
    ... --resume auto                                                  # continue a killed run

A recipe holds `JudgeTrainArguments` (judgetrain/recipe.py), `trl.DPOConfig` and `trl.ModelConfig` keys; any key can
be overridden as ``--key value``.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

from judgetrain.recipe import RecipeError, parse_recipe, save_recipe, split_recipe_argv

logger = logging.getLogger("judgetrain.train")

DEFAULT_AUDIT_ROWS = 64


# ----------------------------------------------------------------------------------------------- data


def build_train_dataset(script_args, training_args, *, max_rows_each: int | None = None):
    """The recipe's training mixture through the validating adapters."""
    from judgetrain.data import load_mixture

    if not script_args.train_datasets:
        raise RecipeError("train_datasets is empty: a recipe needs at least one training component")
    components = []
    rejects_dir = Path(training_args.output_dir) / "rejects"
    for i, comp in enumerate(script_args.train_datasets):
        comp = dict(comp)
        comp.setdefault("on_bad_row", script_args.on_bad_row)
        comp.setdefault("rejects_path", str(rejects_dir / f"{comp['dataset']}_{i}.jsonl"))
        if max_rows_each is not None:
            comp["max_rows"] = min(comp.get("max_rows") or max_rows_each, max_rows_each)
            comp.pop("rows", None)
            comp.setdefault("weight", 1.0)
        components.append(comp)
    return load_mixture(components, seed=training_args.seed)


def _lengths_batched(batch, tokenizer):
    """Token counts as TRL will see them: prompt with generation prompt, prompt + each completion."""
    def count(conversations, gen):
        texts = tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=gen)
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    prompts = batch["prompt"]
    p = count(prompts, True)
    c = count([a + b for a, b in zip(prompts, batch["chosen"])], False)
    r = count([a + b for a, b in zip(prompts, batch["rejected"])], False)
    return {"_prompt_len": p, "_full_len": [max(x, y) for x, y in zip(c, r)]}


def _shorten_prompt(example, tokenizer, max_length: int):
    """Cut the middle of the last user message so prompt + the longer completion fits ``max_length``."""
    over = example["_full_len"] - max_length
    prompt = [dict(m) for m in example["prompt"]]
    user = max((i for i, m in enumerate(prompt) if m["role"] == "user"), default=None)
    if user is None:
        return example, False
    content_ids = tokenizer(prompt[user]["content"], add_special_tokens=False)["input_ids"]
    marker = "\n[... shortened to fit max_length ...]\n"
    cut = over + len(tokenizer(marker, add_special_tokens=False)["input_ids"]) + 4
    for _ in range(4):  # re-tokenising at the two seams can cost a few tokens more than counted: cut again
        if cut >= len(content_ids) - 16:
            return example, False
        keep = (len(content_ids) - cut) // 2
        prompt[user]["content"] = tokenizer.decode(content_ids[:keep]) + marker + tokenizer.decode(content_ids[-keep:])
        new = dict(example, prompt=[dict(m) for m in prompt])
        counted = _lengths_batched({k: [new[k]] for k in ("prompt", "chosen", "rejected")}, tokenizer)
        new.update({k: v[0] for k, v in counted.items()})
        if new["_full_len"] <= max_length:
            return new, True
        cut += new["_full_len"] - max_length + 2
    return example, False


def audit_lengths(dataset, tokenizer, max_length: int | None, action: str, rejects_path: str | None, num_proc=None):
    """Count, per mixture component, rows whose prompt alone fills max_length (TRL would drop them) and rows whose
    completion would be cut (the judge's score lost), then apply the recipe's action. Returns (dataset, report)."""
    if max_length is None:
        return dataset, {"max_length": None}
    with_len = dataset.map(
        _lengths_batched, fn_kwargs={"tokenizer": tokenizer}, batched=True, batch_size=256, num_proc=num_proc,
        desc="Auditing sequence lengths",
    )
    names = with_len["dataset"] if "dataset" in with_len.column_names else ["train"] * len(with_len)
    prompt_lens, full_lens = with_len["_prompt_len"], with_len["_full_len"]
    report: dict = {"max_length": max_length, "action": action, "datasets": {}}
    bad_rows = []
    for i, (name, p, f) in enumerate(zip(names, prompt_lens, full_lens)):
        entry = report["datasets"].setdefault(
            name, {"rows": 0, "prompt_fills_max_length": 0, "completion_cut": 0, "max_tokens": 0}
        )
        entry["rows"] += 1
        entry["max_tokens"] = max(entry["max_tokens"], f)
        if p >= max_length:
            entry["prompt_fills_max_length"] += 1
            bad_rows.append((i, "prompt_fills_max_length"))
        elif f > max_length:
            entry["completion_cut"] += 1
            bad_rows.append((i, "completion_cut"))
    for name, entry in report["datasets"].items():
        logger.info(
            "Data audit [%s]: %d rows, %d with a prompt that fills max_length=%d, %d whose completion would be cut, "
            "longest %d tokens",
            name, entry["rows"], entry["prompt_fills_max_length"], max_length, entry["completion_cut"], entry["max_tokens"],
        )
    if bad_rows and action == "error":
        first = ", ".join(f"row {i} ({why})" for i, why in bad_rows[:5])
        raise RecipeError(
            f"{len(bad_rows)} training rows do not fit max_length={max_length}: {first}. Raise max_length, or set "
            "long_rows to skip, truncate or shorten_prompt."
        )
    drop: dict[int, str] = {}
    if action == "skip":
        drop = dict(bad_rows)
    elif action == "shorten_prompt" and bad_rows:
        fixed = 0
        rows = {}
        for i, why in bad_rows:
            new, ok = _shorten_prompt(with_len[i], tokenizer, max_length)
            if ok:
                rows[i] = new
                fixed += 1
            else:
                drop[i] = f"{why}_unfixable"
        if rows:
            def replace(example, idx):
                return rows.get(idx, example)

            with_len = with_len.map(replace, with_indices=True, desc="Shortening long prompts")
        report["shortened"] = fixed
        logger.info("Data audit: shortened the prompt of %d rows; %d could not be shortened and are skipped", fixed, len(drop))
    if drop:
        if rejects_path:
            Path(rejects_path).parent.mkdir(parents=True, exist_ok=True)
            with open(rejects_path, "a", encoding="utf-8") as f:
                for i, why in sorted(drop.items()):
                    row = {k: v for k, v in with_len[i].items() if not k.startswith("_")}
                    f.write(json.dumps({"row": i, "reason": why, "tokens": full_lens[i], "data": row}, default=str) + "\n")
        keep = [i for i in range(len(with_len)) if i not in drop]
        with_len = with_len.select(keep)
        logger.warning("Data audit: skipped %d rows that do not fit max_length (written to %s)", len(drop), rejects_path)
    report["skipped"] = len(drop)
    if action == "truncate" and bad_rows:
        logger.warning("Data audit: %d rows will be truncated by TRL (their completion end is lost)", len(bad_rows))
    return with_len.remove_columns(["_prompt_len", "_full_len"]), report


# ----------------------------------------------------------------------------------------------- model


def model_init_kwargs(model_args, training_args) -> dict:
    from trl import get_quantization_config

    kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        from accelerate import PartialState

        # k-bit weights cannot move after loading: put each process's copy on its own device
        kwargs["device_map"] = {"": PartialState().local_process_index}
        kwargs["quantization_config"] = quantization_config
    if training_args.model_init_kwargs:
        kwargs.update(training_args.model_init_kwargs)
    return {k: v for k, v in kwargs.items() if v is not None}


def load_tokenizer(model_path: str, training_args):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=training_args.trust_remote_code)
    if tokenizer.chat_template is None:
        raise RecipeError(
            f"the tokenizer of {model_path} has no chat template; judgetrain's data is conversational. Use an "
            "instruct model or set one with `chat_template_path`."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_eval_callback(script_args, training_args, model_args, tokenizer):
    """The evaluation seam: a TrainerCallback that scores the configured suites each epoch (None when disabled)."""
    if not script_args.eval_suites:
        return None
    from judgetrain.eval.callback import JudgeEvalCallback

    return JudgeEvalCallback.from_recipe(script_args, training_args, model_args, tokenizer)


# ----------------------------------------------------------------------------------------------- entry points


def setup_logging(training_args) -> None:
    from accelerate import PartialState

    is_main = PartialState().is_main_process
    level = logging.INFO if is_main else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level, force=True)
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity(logging.WARNING if is_main else logging.ERROR)
    if not is_main:
        datasets.utils.logging.disable_progress_bar()


def resolve_resume(resume: str | None, output_dir: str) -> str | None:
    from judgetrain.callbacks import checkpoint_problem, find_resume_checkpoint

    if resume in (None, "", "none", "no"):
        return None
    if resume == "auto":
        ckpt = find_resume_checkpoint(output_dir)
        if ckpt is None:
            logger.info("--resume auto: no complete checkpoint in %s, starting from scratch", output_dir)
        return ckpt
    problem = checkpoint_problem(Path(resume)) if Path(resume).is_dir() else "not a directory"
    if problem:
        raise RecipeError(f"--resume {resume}: cannot resume from it: {problem}")
    return resume


def train(script_args, training_args, model_args, resolved: dict, command: str | None = None) -> dict:
    """Run one recipe to the end. Returns a summary (output_dir, final metrics, audit, resumed_from, stop reason)."""
    import torch
    from accelerate import PartialState
    from trl import DPOTrainer, get_peft_config

    from judgetrain.callbacks import (
        CheckpointMarkerCallback,
        GracefulStop,
        MetricsJsonlCallback,
        NonFiniteGuard,
        RunStopped,
        truncate_metrics,
    )
    from judgetrain.aliases import resolve_model

    state = PartialState()
    out = Path(training_args.output_dir)
    if training_args.trust_remote_code:
        logger.warning("trust_remote_code is ON: this recipe runs Python code shipped with %s", model_args.model_name_or_path)
    model_path = resolve_model(model_args.model_name_or_path)
    tokenizer = load_tokenizer(model_path, training_args)

    resume_from = resolve_resume(script_args.resume, training_args.output_dir)
    if state.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        if resume_from:
            step = int(Path(resume_from).name.split("-")[-1])
            dropped = truncate_metrics(training_args.output_dir, step)
            logger.info("Resuming from %s (step %d); %d metrics.jsonl records after it were dropped", resume_from, step, dropped)
        elif (out / "metrics.jsonl").exists():
            (out / "metrics.jsonl").unlink()  # a fresh run in an old directory starts a fresh log
        save_recipe(resolved, out / "recipe.yaml", command=command)
    state.wait_for_everyone()

    with state.main_process_first():
        dataset = build_train_dataset(script_args, training_args)
        dataset, audit = audit_lengths(
            dataset, tokenizer, training_args.max_length, script_args.long_rows,
            str(out / "rejects" / "long_rows.jsonl") if state.is_main_process else None,
            num_proc=training_args.dataset_num_proc,
        )
    if state.is_main_process:
        (out / "data_audit.json").write_text(json.dumps(audit, indent=1))
    if len(dataset) == 0:
        raise RecipeError(f"no training rows left after validation and the length audit (see {out / 'rejects'} and "
                          f"{out / 'data_audit.json'}): raise max_length or change long_rows / on_bad_row")
    # TRL's own length filter must find nothing left to drop silently: error/skip/shorten_prompt removed such rows.
    train_dataset = dataset.select_columns(["prompt", "chosen", "rejected"])

    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    stopper = GracefulStop().install()
    guard = NonFiniteGuard(script_args.nonfinite)
    callbacks = [MetricsJsonlCallback(training_args.output_dir), CheckpointMarkerCallback(), guard, stopper]
    eval_cb = build_eval_callback(script_args, training_args, model_args, tokenizer)
    if eval_cb is not None:
        callbacks.append(eval_cb)

    trainer = DPOTrainer(
        model=model_path,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )
    if eval_cb is not None and hasattr(eval_cb, "attach"):
        eval_cb.attach(trainer)

    summary = {"output_dir": str(out), "resumed_from": resume_from, "audit": audit}
    try:
        result = trainer.train(resume_from_checkpoint=resume_from)
    except RunStopped as stop:  # SIGTERM / Ctrl-C after its checkpoint, or a non-finite step: nothing more is written
        result = None
        summary["stopped"] = str(stop)
        summary["stop_reason"], summary["stopped_at"] = stop.reason, stop.step
        if stop.checkpoint:
            summary["checkpoint"] = stop.checkpoint
    summary["global_step"] = trainer.state.global_step
    if guard.skipped_steps:
        summary["nonfinite_skipped_steps"] = list(guard.skipped_steps)
        logger.warning("nonfinite: skip: %d batches with a non-finite gradient were skipped (steps %s)",
                       len(guard.skipped_steps), guard.skipped_steps)
    if result is not None:
        trainer.save_model(training_args.output_dir)
        if state.is_main_process:
            tokenizer.save_pretrained(training_args.output_dir)
            logger.info("Final %s saved to %s (safetensors) with recipe.yaml", "adapter" if model_args.use_peft else "model", out)
        summary["train_metrics"] = result.metrics
    _finish_wandb(trainer)
    if hasattr(trainer, "end"):
        trainer.end()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    stopper.uninstall()  # after the final save: a SIGTERM during it only sets the flag
    return summary


def _finish_wandb(trainer) -> None:
    """Close the W&B run now: its history is otherwise flushed by an exit hook, which a busy machine can cut short
    (an offline run then holds no history at all)."""
    for cb in trainer.callback_handler.callbacks:
        wandb = getattr(cb, "_wandb", None)
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish()


def dry_run(script_args, training_args, model_args, resolved: dict) -> dict:
    """Check a recipe without loading weights: schema (already parsed), files, accelerate config, data and lengths
    on the first ``audit_rows`` rows. Hub sources and tokenizers unreachable offline are reported, not fatal."""
    from judgetrain.aliases import is_alias, resolve_model

    report: dict = {"recipe": "ok", "problems": [], "notes": []}
    if script_args.accelerate_config:
        from accelerate.commands.config.config_args import load_config_from_file

        if not Path(script_args.accelerate_config).is_file():
            raise RecipeError(f"accelerate_config {script_args.accelerate_config}: file not found")
        cfg = load_config_from_file(script_args.accelerate_config)
        report["accelerate"] = {"distributed_type": str(cfg.distributed_type), "num_processes": cfg.num_processes}
    n = script_args.audit_rows or DEFAULT_AUDIT_ROWS
    for i, comp in enumerate(script_args.train_datasets):
        src = comp.get("source", "bundled")
        if src != "bundled" and (src.startswith((".", "/")) or os.path.sep in src and not _looks_like_hub_id(src)):
            if not Path(src).exists():
                raise RecipeError(f"train_datasets[{i}].source {src}: file or folder not found")
    try:
        dataset = build_train_dataset(script_args, training_args, max_rows_each=n)
        report["rows_audited"] = len(dataset)
    except RecipeError:
        raise
    except Exception as e:  # the hub is unreachable offline: audit the bundled samples of the same datasets
        if not _is_offline_error(e):
            raise
        report["notes"].append(f"a hub source is unreachable ({type(e).__name__}); audited the bundled samples instead")
        logger.warning("Dry run: %s; auditing the bundled samples of the same datasets in its place", e)
        script_args.train_datasets = [dict(c, source="bundled") for c in script_args.train_datasets]
        dataset = build_train_dataset(script_args, training_args, max_rows_each=n)
        report["rows_audited"] = len(dataset)
    model = model_args.model_name_or_path
    action = script_args.long_rows
    try:
        tokenizer = load_tokenizer(resolve_model(model) if is_alias(model) else model, training_args)
        report["tokenizer"] = model
    except Exception as e:
        if isinstance(e, RecipeError) or not _is_offline_error(e):
            raise
        from judgetrain.tiny import ensure_tiny_judge

        report["notes"].append(
            f"tokenizer of {model} unreachable offline; lengths measured with the tiny judge's tokenizer (approximate, "
            "so long rows are counted, not acted on)"
        )
        tokenizer = load_tokenizer(ensure_tiny_judge(), training_args)
        action = "truncate"  # count only
    # the recipe's own action: long_rows=error fails the dry run exactly as it would fail the real run
    _, audit = audit_lengths(dataset, tokenizer, training_args.max_length, action, None)
    report["audit"] = audit
    return report


def _looks_like_hub_id(src: str) -> bool:
    parts = src.split("/")
    return len(parts) == 2 and all(parts) and not src.startswith((".", "/"))


def _is_offline_error(e: Exception) -> bool:
    text = f"{type(e).__name__}: {e}".lower()
    return any(
        s in text
        for s in ("offline", "connection", "couldn't reach", "could not reach", "not found on the hub",
                  "does not appear to have", "is not a local folder", "repository not found", "huggingface.co",
                  "localentrynotfound", "cannot find the requested files", "doesn't exist on the hub")
    )


def _die_with_launcher() -> None:
    """Ask Linux to send this process SIGTERM when its `accelerate launch` / torchrun parent dies.

    accelerate's single-process launcher does not forward signals: a SIGTERM to `accelerate launch` (what a
    scheduler or spot reclaim sends to the command it started) killed the launcher and left the training process
    running on, orphaned, to the end of the run. With the parent-death signal the child gets SIGTERM too and
    GracefulStop saves a checkpoint and stops. Only when the parent is a launcher: a shell parent exiting must not
    stop a `nohup python -m judgetrain.train` run."""
    if not sys.platform.startswith("linux"):
        return
    ppid = os.getppid()
    try:
        cmdline = Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return
    if not any(s in cmdline for s in ("accelerate", "torchrun", "torch.distributed.run")):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return
        if os.getppid() != ppid:  # the launcher died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def init_process_state():
    """Join the launcher's process group before anything reads the device.

    On a machine without a GPU, `accelerate launch --multi_gpu --num_processes N` (or accelerate_configs/cpu.yaml)
    starts N processes, but accelerate only groups them (gloo) when the state is created with cpu=True; Trainer
    would otherwise run N independent copies."""
    import torch
    from accelerate import PartialState

    _die_with_launcher()
    has_gpu = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    if not has_gpu and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        os.environ["ACCELERATE_USE_CPU"] = "true"
    return PartialState(cpu=not has_gpu)


def run(argv: list[str] | None = None) -> dict:
    """The `accelerate launch -m judgetrain.train` entry point (runs in each process)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    init_process_state()
    script_args, training_args, model_args, resolved = parse_recipe(argv)
    setup_logging(training_args)
    command = "accelerate launch -m judgetrain.train " + " ".join(shlex.quote(a) for a in argv)
    if script_args.dry_run:
        report = dry_run(script_args, training_args, model_args, resolved)
        print(json.dumps(report, indent=1, default=str))
        return report
    return train(script_args, training_args, model_args, resolved, command=command)


def main(argv: list[str] | None = None) -> int:
    """`judgetrain train RECIPE [overrides]`: validate, then hand over to `accelerate launch` (or dry-run here)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = ["--dry_run" if a == "--dry-run" else a for a in argv]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        script_args, _, _, _ = parse_recipe(argv)
    except RecipeError as e:
        print(f"judgetrain train: {e}", file=sys.stderr)
        return 2
    if script_args.dry_run:
        try:
            run(argv)
        except (RecipeError, ValueError) as e:
            print(f"judgetrain train --dry-run: {e}", file=sys.stderr)
            return 2
        return 0
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    if script_args.accelerate_config:
        launch += ["--config_file", script_args.accelerate_config]
    recipe, overrides = split_recipe_argv(argv)
    cmd = launch + ["-m", "judgetrain.train"] + ([recipe] if recipe else []) + overrides
    logging.getLogger(__name__).info("Launching: %s", " ".join(shlex.quote(c) for c in cmd))
    return subprocess.call(cmd)


if __name__ == "__main__":
    from judgetrain.data import DataValidationError

    try:
        outcome = run()
    except (RecipeError, DataValidationError, FileNotFoundError) as e:  # bad recipe, bad rows, missing data: one message
        print(f"judgetrain.train: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
    if isinstance(outcome, dict) and outcome.get("stop_reason") == "nonfinite":
        print(f"judgetrain.train: {outcome['stopped']}", file=sys.stderr)
        sys.exit(3)
