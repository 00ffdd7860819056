"""Train an LLM judge with DPO (full fine-tune or LoRA) from a recipe, evaluated every epoch.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m judgetrain.train recipes/quickstart.yaml
    judgetrain train recipes/quickstart.yaml --learning_rate 1e-4      # hands over to accelerate launch
    judgetrain train recipes/judgebias_qwen3_8b_lora.yaml --dry-run    # validate without loading weights
    ... --resume auto                                                  # continue a killed run

A recipe holds `JudgeTrainArguments` (judgetrain/config/recipe.py), `trl.DPOConfig` and `trl.ModelConfig` keys; any key can
be overridden as ``--key value``.

DeepSpeed (accelerate_configs/zero2.yaml, zero3.yaml) is installed apart, into the environment that has torch:
``pip install --no-build-isolation deepspeed``. Without a GPU the ZeRO configs run on DeepSpeed's CPU accelerator:
    judgetrain train recipes/quickstart.yaml --accelerate_config accelerate_configs/zero3.yaml --num_processes 2 --mixed_precision no
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

from judgetrain.config.recipe import RecipeError, parse_recipe, save_recipe, split_recipe_argv
from judgetrain.run.state import decided_on_main

logger = logging.getLogger("judgetrain.train")


# ----------------------------------------------------------------------------------------------- data and model


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
    """The model's tokenizer with a pad token; a tokenizer without a chat template stops the run here."""
    from judgetrain.models import loading as modeling

    tokenizer = modeling.load_tokenizer(model_path, trust_remote_code=training_args.trust_remote_code)
    if tokenizer.chat_template is None:
        raise RecipeError(
            f"the tokenizer of {model_path} has no chat template; judgetrain's data is conversational. Use an "
            "instruct model or set one with `chat_template_path`."
        )
    return tokenizer


# ----------------------------------------------------------------------------------------------- the steps of a run


def prepare_output_dir(script_args, training_args, resolved: dict) -> tuple[str | None, dict, dict]:
    """Before anything is written: take the output_dir lock (one run per folder), pick the checkpoint to resume from
    (verified), and decide how this run starts there (`judgetrain.run.state.plan_start`: a resume of the same run, a
    restart, a fresh run; refused with the reason otherwise). Returns (checkpoint or None, identity without the data
    fingerprint yet, plan)."""
    from accelerate import PartialState

    from judgetrain.run.checkpoints import resolve_resume
    from judgetrain.run.state import clear_run, hold_output_dir, plan_start, run_identity

    out = Path(training_args.output_dir)
    decided_on_main(lambda: hold_output_dir(out))  # held until this process exits, however it exits
    resume_from = decided_on_main(lambda: resolve_resume(script_args.resume, training_args.output_dir))
    identity = run_identity(resolved, num_processes=PartialState().num_processes, data=None)

    def decide():
        plan = plan_start(out, identity, checkpoint=resume_from, resume_asked=bool(script_args.resume),
                          force=script_args.resume_force, overwrite=script_args.overwrite_output_dir)
        if plan["clear"]:
            clear_run(out, plan["clear"])
        return plan

    return resume_from, identity, decided_on_main(decide)


def record_run(out: Path, identity: dict, plan: dict, resolved: dict, command, resume_from, script_args) -> dict:
    """Once the rows are known: compare their fingerprint with the resumed run's, then (main process) write the
    identity, the recipe (recipe.yaml stays the first run's; each resume adds recipe.resume-<step>.yaml) and cut
    metrics.jsonl back to the resumed step."""
    from judgetrain.run.checkpoints import COMPLETE_MARKER, METRICS_FILE, checkpoint_step, truncate_metrics
    from judgetrain.run.state import IDENTITY_FILE, checkpoint_identity, read_json, record_start, recipe_path

    step = checkpoint_step(resume_from) if resume_from else 0

    def decide():
        if plan["kind"] != "fresh":
            old = checkpoint_identity(resume_from) if resume_from else (read_json(out / IDENTITY_FILE) or {}).get("current")
            if old and old.get("data") and old["data"] != identity["data"]:
                line = f"data: {old['data']!r} -> {identity['data']!r}"
                if not script_args.resume_force:
                    raise RecipeError(f"--resume: the training rows differ from the resumed run's ({line}); pass "
                                      "--resume_force to continue on the new rows, or start a new run in another output_dir")
                plan["forced"].append(line)
        if plan["forced"]:
            logger.warning("--resume_force: continuing with the new values of: %s", "; ".join(plan["forced"]))
        record_start(out, identity, plan, step=step, checkpoint=resume_from)
        save_recipe(resolved, recipe_path(out, plan, step), command=command)
        (out / COMPLETE_MARKER).unlink(missing_ok=True)  # a final model of an earlier segment is not this run's end
        if plan["kind"] == "resume":
            dropped = truncate_metrics(str(out), step)
            logger.info("Resuming from %s (step %d); %d metrics.jsonl records after it were dropped", resume_from, step, dropped)
        elif (out / METRICS_FILE).exists():
            (out / METRICS_FILE).unlink()  # a restart from step 0 of the same run starts a fresh log
            logger.info("Restarting %s from step 0 (no complete checkpoint to resume)", out)
        return plan

    return decided_on_main(decide)


def load_audited_dataset(script_args, training_args, tokenizer):
    """The training mixture after the length audit, as TRL takes it (prompt, chosen, rejected), and the audit
    report (also written to data_audit.json). The main process prepares it first; the others reuse its cache."""
    from accelerate import PartialState

    from judgetrain.data.chat import neutralise_dataset
    from judgetrain.data.lengths import audit_lengths

    state = PartialState()
    out = Path(training_args.output_dir)
    with state.main_process_first():
        dataset = build_train_dataset(script_args, training_args)
        # Content is text (judgetrain.data.chat): a control string in a row cannot fake a turn, here or in TRL.
        dataset = neutralise_dataset(dataset, tokenizer)
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
    return reload_memory_mapped(dataset.select_columns(["prompt", "chosen", "rejected"]), out / "train_rows", state), audit


def reload_memory_mapped(dataset, path: Path, state):
    """The audited rows, written once (main process) and read back memory-mapped, with the adapters' in-memory
    objects released first. What the adapters and the audit parsed otherwise stays resident for the whole run
    (~15-30 MB over a bare TRL script that reads one parquet file)."""
    import gc

    from datasets import load_from_disk

    # One copy per machine, written by that machine's main process: every process reads its own machine's copy,
    # whether output_dir is on a shared file system or not.
    path = path / f"node-{os.environ.get('GROUP_RANK', '0')}"
    if state.is_local_main_process:
        if path.exists():  # a resumed run writes its rows afresh (and drops the old run's tokenization caches)
            import shutil

            shutil.rmtree(path)
        dataset.save_to_disk(str(path))
    state.wait_for_everyone()
    del dataset
    gc.collect()
    release_freed_memory()
    return load_from_disk(str(path))


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (Arrow's pool and glibc's arenas keep them otherwise)."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def build_trainer(script_args, training_args, model_args, model_path: str, tokenizer, train_dataset,
                  identity: dict | None = None, forced: list[str] | None = None):
    """The DPOTrainer (`PrefixSharingDPOTrainer` with `prefix_sharing`) with judgetrain's callbacks: metrics.jsonl,
    checkpoint markers (with the run identity, and the checkpoint rotation), the non-finite guard, the graceful stop
    (its signal handlers installed), the recipe's values over a restored optimizer on a forced resume and, when the
    recipe names suites, the per-epoch evaluation."""
    from trl import DPOTrainer, get_peft_config

    from judgetrain.trainer.callbacks import (
        CheckpointMarkerCallback,
        ForcedResume,
        GracefulStop,
        MetricsJsonlCallback,
        NonFiniteGuard,
        NoStepsLeft,
    )

    from judgetrain.trainer.parallelism import (
        ParallelismReport,
        allow_deepspeed_on_cpu,
        allow_fsdp_on_cpu,
        requested_parallelism,
    )

    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    keep, training_args.save_total_limit = training_args.save_total_limit, None  # rotated after each marker instead
    stopper = GracefulStop().install()
    guard = NonFiniteGuard(script_args.nonfinite)
    request = requested_parallelism()
    logger.info("Launch asks for %s (what is in effect is checked at the first step)", request.describe())
    _ = training_args.device  # TrainingArguments re-creates Accelerate's process state here ...
    allow_fsdp_on_cpu(request)  # ... so an FSDP2 request on CPU is let through again, checked at the first step
    allow_deepspeed_on_cpu(request)  # and a DeepSpeed one (on CPU: DeepSpeed's CPU accelerator over gloo)
    report = ParallelismReport(request, training_args.output_dir)
    callbacks = [NoStepsLeft(), report, MetricsJsonlCallback(training_args.output_dir),
                 CheckpointMarkerCallback(keep, identity), guard, stopper]
    if forced:
        callbacks.append(ForcedResume(forced))
    trainer_cls = DPOTrainer
    if script_args.prefix_sharing:
        from judgetrain.trainer.prefix_sharing import PrefixSharingDPOTrainer as trainer_cls
    trainer = trainer_cls(
        model=model_path,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )
    report.attach(trainer)
    guard.attach(trainer)
    if script_args.eval_suites:
        from judgetrain.eval.callback import JudgeEvalCallback

        trainer.add_callback(JudgeEvalCallback.from_recipe(script_args, training_args, tokenizer, trainer=trainer))
    return trainer, guard, stopper


def run_training(trainer, resume_from: str | None, guard) -> tuple[dict, object | None]:
    """``trainer.train()``; a stop (SIGTERM / Ctrl-C after its checkpoint, or a non-finite step) ends it with
    nothing more written. Returns (summary, TrainOutput or None when stopped)."""
    from judgetrain.trainer.callbacks import RunStopped

    summary: dict = {}
    try:
        result = trainer.train(resume_from_checkpoint=resume_from)
    except RunStopped as stop:
        if stop.reason == "complete":  # resumed at max_steps: no step trained; the final model is saved as usual
            from transformers.trainer_utils import TrainOutput

            logger.info("%s: %s; saving the final model from it", resume_from, stop)
            summary["nothing_left_to_train"] = True
            result = TrainOutput(trainer.state.global_step, 0.0, {})
        else:
            result = None
            summary["stopped"] = str(stop)
            summary["stop_reason"], summary["stopped_at"] = stop.reason, stop.step
            if stop.checkpoint:
                summary["checkpoint"] = stop.checkpoint
    summary["global_step"] = trainer.state.global_step
    if getattr(trainer, "prefix_sharing", None) is not None:
        summary["prefix_sharing"] = {"on": trainer.prefix_sharing, **trainer.prefix_sharing_stats}
    if guard.skipped_steps:
        summary["nonfinite_skipped_steps"] = list(guard.skipped_steps)
        logger.warning("nonfinite: skip: %d batches with a non-finite loss or gradient were skipped (steps %s)",
                       len(guard.skipped_steps), guard.skipped_steps)
    if guard.scaler_skipped_steps:
        summary["scaler_skipped_steps"] = list(guard.scaler_skipped_steps)
        logger.info("fp16 loss scaler: %d overflow steps skipped (steps %s)", len(guard.scaler_skipped_steps),
                    guard.scaler_skipped_steps)
    if result is not None:
        summary["train_metrics"] = result.metrics
    return summary, result


def save_final(trainer, tokenizer, training_args, model_args) -> None:
    """The final model or adapter (safetensors) and its tokenizer, beside recipe.yaml, then its completion marker
    (the model files with their SHA-256, as for a checkpoint)."""
    from judgetrain.run.checkpoints import write_final_marker

    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(training_args.output_dir)
        write_final_marker(training_args.output_dir)
        logger.info("Final %s saved to %s (safetensors) with recipe.yaml", "adapter" if model_args.use_peft else "model",
                    training_args.output_dir)


def finish(trainer, stopper) -> None:
    """Close the trackers and wait for every process; the signal handlers go last, so a SIGTERM during the final
    save only set the stop flag."""
    import torch

    _finish_wandb(trainer)
    if hasattr(trainer, "end"):
        trainer.end()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    stopper.uninstall()


def _finish_wandb(trainer) -> None:
    """Close the W&B run now: its history is otherwise flushed by an exit hook, which a busy machine can cut short
    (an offline run then holds no history at all)."""
    for cb in trainer.callback_handler.callbacks:
        wandb = getattr(cb, "_wandb", None)
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish()


def train(script_args, training_args, model_args, resolved: dict, command: str | None = None) -> dict:
    """Run one recipe to the end. Returns a summary (output_dir, final metrics, audit, resumed_from, stop reason,
    exit_code); ``judgetrain_status.jsonl`` records how it ended, for `judgetrain train` and schedulers."""
    from judgetrain.data import DataValidationError
    from judgetrain.trainer.parallelism import ParallelismError
    from judgetrain.run.state import EXIT_BAD_INPUT, EXIT_FAILED, outcome_code, write_status

    out = Path(training_args.output_dir)
    try:
        summary = _train(script_args, training_args, model_args, resolved, command)
    except (RecipeError, DataValidationError, FileNotFoundError, ParallelismError) as e:
        write_status(out, "refused", EXIT_BAD_INPUT, message=f"{type(e).__name__}: {e}")
        raise
    except BaseException as e:
        write_status(out, "failed", EXIT_FAILED, message=f"{type(e).__name__}: {e}")
        raise
    status, summary["exit_code"] = outcome_code(summary)
    write_status(out, status, summary["exit_code"], step=summary.get("global_step"), message=summary.get("stopped"))
    return summary


def _train(script_args, training_args, model_args, resolved: dict, command: str | None) -> dict:
    from judgetrain.models.aliases import resolve_model
    from judgetrain.run.state import data_fingerprint

    from accelerate import PartialState

    from judgetrain.config.recipe import remote_code_routes, remote_code_warning

    warning = remote_code_warning(remote_code_routes(training_args, model_args), model_args.model_name_or_path)
    if warning and PartialState().is_main_process:
        logger.warning(warning)
    model_path = resolve_model(model_args.model_name_or_path)
    tokenizer = load_tokenizer(model_path, training_args)
    resume_from, identity, plan = prepare_output_dir(script_args, training_args, resolved)
    train_dataset, audit = load_audited_dataset(script_args, training_args, tokenizer)
    identity["data"] = data_fingerprint(train_dataset)
    out = Path(training_args.output_dir)
    plan = record_run(out, identity, plan, resolved, command, resume_from, script_args)
    forced = plan["forced"] if plan["kind"] == "resume" else None
    keep = training_args.save_total_limit
    trainer, guard, stopper = build_trainer(script_args, training_args, model_args, model_path, tokenizer,
                                            train_dataset, identity, forced)
    try:
        outcome, result = run_training(trainer, resume_from, guard)
    finally:  # the recipe's value back in the arguments (Trainer's own rotation was off during training)
        training_args.save_total_limit = keep
    if result is not None:
        save_final(trainer, tokenizer, training_args, model_args)
    finish(trainer, stopper)
    return {"output_dir": str(out), "resumed_from": resume_from, "audit": audit, "start": plan["kind"], **outcome}


# ----------------------------------------------------------------------------------------------- entry points


def run(argv: list[str] | None = None) -> dict:
    """The `accelerate launch -m judgetrain.train` entry point (runs in each process)."""
    from judgetrain.trainer.process import init_process_state, setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    init_process_state()
    script_args, training_args, model_args, resolved = parse_recipe(argv)
    setup_logging()
    command = "accelerate launch -m judgetrain.train " + " ".join(shlex.quote(a) for a in argv)
    if script_args.dry_run:
        from judgetrain.config.dry_run import dry_run

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
        script_args, training_args, _, _ = parse_recipe(argv)
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
    from judgetrain.run.state import EXIT_BAD_INPUT, output_dir_in_use

    busy = output_dir_in_use(Path(training_args.output_dir))
    if busy:
        print(f"judgetrain train: {busy}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from judgetrain.trainer.parallelism import deepspeed_missing

    missing = deepspeed_missing(script_args.accelerate_config)
    if missing:
        print(f"judgetrain train: {missing}", file=sys.stderr)
        return EXIT_BAD_INPUT
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    if script_args.accelerate_config:
        launch += ["--config_file", script_args.accelerate_config]
    if script_args.num_processes:
        launch += ["--num_processes", str(script_args.num_processes)]
    recipe, overrides = split_recipe_argv(argv)
    cmd = launch + ["-m", "judgetrain.train"] + ([recipe] if recipe else []) + overrides
    logging.getLogger(__name__).info("Launching: %s", " ".join(shlex.quote(c) for c in cmd))
    return launch_and_wait(cmd, Path(training_args.output_dir))


def launch_and_wait(cmd: list[str], output_dir: Path) -> int:
    """Run the launcher and exit with the *run's* code: `accelerate launch` turns any worker failure into 1, and its
    one-process launcher returns as soon as a SIGTERM kills it, while the training process (parent-death signal) is
    still saving its checkpoint. So a SIGTERM is passed on to the launcher and then the training process is waited
    for; the code comes from the status line the run wrote for this launch (judgetrain.run.state)."""
    import signal
    import uuid

    from judgetrain.run.state import LAUNCH_ID_ENV, launch_exit_code, wait_for_launch

    launch_id = uuid.uuid4().hex
    proc = subprocess.Popen(cmd, env={**os.environ, LAUNCH_ID_ENV: launch_id})
    signalled = []

    def pass_on(signum, frame):
        signalled.append(signum)
        proc.send_signal(signum)

    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, pass_on),
        # a terminal's Ctrl-C reaches the whole process group, the run included: only wait for it
        signal.SIGINT: signal.signal(signal.SIGINT, lambda signum, frame: signalled.append(signum)),
    }
    try:
        code = proc.wait()
        if signalled:
            wait_for_launch(output_dir, launch_id)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return launch_exit_code(output_dir, launch_id, code)


def process_main(argv: list[str] | None = None) -> int:
    """The training process: run, and exit with the run's code (judgetrain.run.state: 0 finished, 1 crashed,
    2 refused, 3 non-finite stop, 143 preempted after its checkpoint)."""
    from judgetrain.data import DataValidationError
    from judgetrain.trainer.parallelism import ParallelismError

    try:
        outcome = run(argv)
    except (RecipeError, DataValidationError, FileNotFoundError, ParallelismError) as e:  # bad recipe, bad rows, missing data: one message
        print(f"judgetrain.train: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if isinstance(outcome, dict) and outcome.get("stop_reason") == "nonfinite":
        print(f"judgetrain.train: {outcome['stopped']}", file=sys.stderr)
    return int(outcome.get("exit_code", 0)) if isinstance(outcome, dict) else 0


if __name__ == "__main__":
    sys.exit(process_main())
