"""The training process: one recipe from setup to cleanup, run in each process of an `accelerate launch`.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m judgetrain.train recipes/quickstart.yaml

Read top to bottom, as it runs: `process_main` (exit code) -> `run` (process group, recipe, logging) -> `train`
(the run's status line) -> `run_recipe`, the sequence: setup (judgetrain.checks.setup, shared with the dry run:
preflight, model alias, hub commits, tokenizer, output_dir start, training rows, eval rows), the trainer with its
callbacks -> `run_training` -> `save_final` -> `finish`. Each stage lives in its own folder: judgetrain.config (the `Recipe`), judgetrain.data (rows),
judgetrain.models (weights and tokenizer), judgetrain.run (the output_dir), judgetrain.trainer (the DPOTrainer subclass
and its callbacks), judgetrain.eval (the per-epoch evaluation), judgetrain.checks (the preflight and the dry run).
`judgetrain train` (judgetrain.cli.train) launches this module.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

from transformers.trainer_utils import TrainOutput
from trl import get_peft_config

from judgetrain.checks.dry_run import dry_run
from judgetrain.checks.setup import LaunchSetup, setup
from judgetrain.compat.transformers import active_wandb
from judgetrain.config.recipe import Recipe, parse_recipe
from judgetrain.eval.callback import JudgeEvalCallback
from judgetrain.eval.suites import SuiteSpec
from judgetrain.models.loading import (init_adapter_config, load_init_adapter, model_init_kwargs,
                                      pinned_snapshot)
from judgetrain.report.build import read_metrics
from judgetrain.report.card import write_card
from judgetrain.report.headline import against_base, against_base_text
from judgetrain.run.checkpoints import finish_markers, write_final_marker
from judgetrain.run.diskfull import DiskFull, every_rank_stops, stop_if_disk_full
from judgetrain.run.state import EXIT_BAD_INPUT, EXIT_DISK_FULL, EXIT_FAILED, outcome_code, write_status
from judgetrain.trainer.callbacks import (CheckpointMarkerCallback, ForcedResume, GracefulStop, MetricsJsonlCallback,
                                          NonFiniteGuard, NoStepsLeft, RecipeSteps, RunStopped)
from judgetrain.trainer.dpo import JudgeDPOTrainer
from judgetrain.trainer.pair_loss import PairLoss
from judgetrain.trainer.parallelism import (ParallelismReport, allow_deepspeed_on_cpu, allow_fsdp_on_cpu,
                                            requested_parallelism)
from judgetrain.trainer.process import close_process_group, destroy_process_groups, end_process, init_process_state
from judgetrain.utils.allocator import apply_cpu_allocator, heap_trims
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.hub import is_hub_id
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger("judgetrain.train")


# ----------------------------------------------------------------------------------------------- entry points


def process_main(argv: list[str] | None = None) -> int:
    """The training process: run, and exit with the run's code (judgetrain.run.state: 0 finished, 1 crashed,
    2 refused, 3 non-finite stop, 4 disk full, 5 stopped on a regression against the baseline (its checkpoint saved),
    143 preempted after its checkpoint)."""
    try:
        outcome = run(argv)
    except BadInputError as e:  # bad recipe, bad rows, missing data, a refused parallelism: one message
        print(f"judgetrain.train: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DiskFull as e:  # one message (the main process's), no traceback: where, how much, what to do
        if close_process_group(e.agreed):
            print(f"judgetrain.train: {e}", file=sys.stderr)
        return EXIT_DISK_FULL
    if outcome.get("stop_reason") == "nonfinite":
        print(f"judgetrain.train: {outcome['stopped']}", file=sys.stderr)
    return int(outcome.get("exit_code", 0))


def run(argv: list[str] | None = None) -> dict:
    """The `accelerate launch -m judgetrain.train` entry point (runs in each process): join the process group,
    parse the recipe, set up logging, then the dry run's report or the run's summary."""
    argv = list(sys.argv[1:] if argv is None else argv)
    state = init_process_state(argv)
    recipe = parse_recipe(argv)
    setup_logging(state.is_main_process, force=True)
    if recipe.script_args.dry_run:
        report = dry_run(recipe)
        print(json.dumps(report, indent=1, default=str))
        return report
    command = "accelerate launch -m judgetrain.train " + " ".join(shlex.quote(a) for a in argv)
    return train(recipe, command=command)


def train(recipe: Recipe, command: str | None = None) -> dict:
    """Run one recipe to the end (`run_recipe`) and record how it ended in ``judgetrain_status.jsonl`` (for
    `judgetrain train` and schedulers). Returns the summary with its ``exit_code``."""
    out = Path(recipe.training_args.output_dir)
    try:
        summary = run_recipe(recipe, command)
    except BadInputError as e:
        write_status(out, "refused", EXIT_BAD_INPUT, message=f"{type(e).__name__}: {e}")
        raise
    except DiskFull as e:
        try:  # the torn checkpoint is gone, which leaves room for this line; if not, the message still says it
            write_status(out, "disk_full", EXIT_DISK_FULL, message=str(e))
        except OSError:
            pass
        raise
    except BaseException as e:
        write_status(out, "failed", EXIT_FAILED, message=f"{type(e).__name__}: {e}")
        raise
    status, summary["exit_code"] = outcome_code(summary)
    regressed = {"regressions": sum(len(r["categories"]) for r in summary["regressions"])} \
        if "regressions" in summary else {}
    allocator = {k: summary[k] for k in ("cpu_allocator", "heap_trims") if k in summary}  # keep's guard, counted
    write_status(out, status, summary["exit_code"], step=summary.get("global_step"), message=summary.get("stopped"),
                 **regressed, **allocator)
    return summary


# ----------------------------------------------------------------------------------------------- the sequence


def run_recipe(recipe: Recipe, command: str | None) -> dict:
    """Setup -> train -> save -> cleanup. Returns the summary: output_dir, resumed_from, the data audit, how the
    run started, and `run_training`'s outcome (steps, stop reason, final metrics)."""
    training_args = recipe.training_args
    out = Path(training_args.output_dir)
    done = setup(recipe, LaunchSetup(), command)  # the setup sequence the dry run shares (judgetrain.checks.setup)
    allocator = apply_cpu_allocator(recipe.script_args.cpu_allocator, training_args.device.type == "cpu")
    (resume_from, identity, plan), tokenizer = done.start, done.tokenizer
    keep = training_args.save_total_limit  # build_trainer hands it to the checkpoint markers' rotation
    parts = build_trainer(recipe, done.model_path, tokenizer, done.train_dataset, done.eval_suites, identity,
                          forced=plan["forced"] if plan["kind"] == "resume" else None)
    try:
        outcome, result = run_training(parts, resume_from)
    except Exception as e:
        stop_if_disk_full(e, parts.trainer, out)
        raise
    finally:  # the recipe's value back in the arguments (Trainer's own rotation was off during training)
        training_args.save_total_limit = keep
    if result is not None:
        try:
            with every_rank_stops(out, "the final save"):
                save_final(parts.trainer, tokenizer, recipe)
        except Exception as e:
            stop_if_disk_full(e, parts.trainer, out, final=True)
            raise
    finish(parts)
    return {"output_dir": str(out), "resumed_from": resume_from, "audit": done.audit, "start": plan["kind"],
            "cpu_allocator": allocator, "heap_trims": heap_trims(), **outcome}


# ----------------------------------------------------------------------------------------------- setup


class TrainerParts(NamedTuple):
    """What `build_trainer` returns: the trainer, and the two callbacks the sequence asks afterwards (the
    non-finite guard's skipped steps, the graceful stop's signal handlers)."""

    trainer: JudgeDPOTrainer
    guard: NonFiniteGuard
    stopper: GracefulStop


def build_trainer(recipe: Recipe, model_path: str, tokenizer, train_dataset, eval_suites: list[SuiteSpec],
                  identity: dict | None = None, forced: list[str] | None = None) -> TrainerParts:
    """The `JudgeDPOTrainer` (prefix sharing as the recipe's `prefix_sharing` says) with judgetrain's callbacks:
    metrics.jsonl, checkpoint markers (with the run identity, and the checkpoint rotation of the recipe's
    ``save_total_limit``), the non-finite guard, the graceful stop (its signal handlers installed), the recipe's values
    over a restored optimizer on a forced resume (``forced``) and, when the recipe evaluates, ``eval_suites`` as the
    trainer's evaluation."""
    script_args, training_args, model_args = recipe.script_args, recipe.training_args, recipe.model_args
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
    callbacks = [NoStepsLeft(), RecipeSteps(), report, MetricsJsonlCallback(training_args.output_dir),
                 CheckpointMarkerCallback(keep, identity, stopper), guard, stopper]
    if forced:
        callbacks.append(ForcedResume(forced))
    snapshot = pinned_snapshot(model_path, model_args.model_revision)  # offline: the pinned commit's own folder
    start = script_args.init_adapter  # a warm start: the adapter's LoRA settings, then its weights
    peft_config = init_adapter_config(start) if start else get_peft_config(model_args)
    with JudgeEvalCallback.building(training_args):  # the suites, not an eval_dataset, are what eval_strategy runs
        trainer = JudgeDPOTrainer(model=snapshot, args=training_args, train_dataset=train_dataset,
                                  processing_class=tokenizer, peft_config=peft_config,
                                  callbacks=callbacks, prefix_sharing=script_args.prefix_sharing,
                                  pair_loss=PairLoss.of_recipe(script_args))
    if start:
        logger.info("starting from the adapter %s (%d tensors); the reference is the base model", start,
                    load_init_adapter(trainer.model, start))
    if snapshot != model_path or is_hub_id(model_path):  # adapters name the hub model and its commit, not a folder
        for config in getattr(trainer.model, "peft_config", {}).values():
            config.base_model_name_or_path, config.revision = model_path, model_args.model_revision
    trainer.model_card_writer = write_card  # the judge's card wherever TRL would write its own
    report.attach(trainer)
    guard.attach(trainer)
    if eval_suites:
        trainer.add_callback(JudgeEvalCallback.from_recipe(recipe, eval_suites, tokenizer, trainer=trainer))
    return TrainerParts(trainer, guard, stopper)


# ----------------------------------------------------------------------------------------------- train


def run_training(parts: TrainerParts, resume_from: str | None) -> tuple[dict, TrainOutput | None]:
    """``trainer.train()``; a stop (SIGTERM / Ctrl-C after its checkpoint, or a non-finite step) ends it with
    nothing more written. Returns (summary, TrainOutput or None when stopped)."""
    trainer, guard = parts.trainer, parts.guard
    summary: dict = {}
    try:
        result = trainer.train(resume_from_checkpoint=resume_from)
    except RunStopped as stop:
        if stop.reason == "complete":  # resumed at max_steps: no step trained; the final model is saved as usual
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
    if trainer.state.best_model_checkpoint:  # metric_for_best_model: the best eval's checkpoint and figure
        summary["best_model_checkpoint"] = trainer.state.best_model_checkpoint
        summary["best_metric"] = trainer.state.best_metric
    if trainer.prefix_sharing is not None:
        summary["prefix_sharing"] = {"on": trainer.prefix_sharing, **trainer.prefix_sharing_stats}
    if guard.skipped_steps:
        summary["nonfinite_skipped_steps"] = list(guard.skipped_steps)
        logger.warning("nonfinite: skip: %d batches with a non-finite loss or gradient were skipped (steps %s)",
                       len(guard.skipped_steps), guard.skipped_steps)
    judge_eval = getattr(trainer, "judge_eval", None)
    if judge_eval is not None and judge_eval.baseline is not None:  # the evals against step 0: what got worse
        summary["regressions"] = list(judge_eval.regressions)
    if guard.scaler_skipped_steps:
        summary["scaler_skipped_steps"] = list(guard.scaler_skipped_steps)
        logger.info("fp16 loss scaler: %d overflow steps skipped (steps %s)", len(guard.scaler_skipped_steps),
                    guard.scaler_skipped_steps)
    if result is not None:
        summary["train_metrics"] = result.metrics
    return summary, result


# ----------------------------------------------------------------------------------------------- save and cleanup


def save_final(trainer: JudgeDPOTrainer, tokenizer, recipe: Recipe) -> None:
    """The final model or adapter (safetensors) and its tokenizer, beside recipe.yaml, and the judge's model card
    (README.md, in place of the one PEFT's save just updated), then its completion marker (the model files with their
    SHA-256, as for a checkpoint)."""
    output_dir = recipe.training_args.output_dir
    trainer.save_model(output_dir)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(output_dir)
        write_card(output_dir)
        write_final_marker(output_dir)
        logger.info("Final %s saved to %s (safetensors) with recipe.yaml",
                    "adapter" if recipe.model_args.use_peft else "model", output_dir)
        log_against_base(recipe)


def log_against_base(recipe: Recipe) -> None:
    """The run's last lines (main process): its last evaluation against the base judge (the eval before the first
    step), each figure with its interval, the difference, its interval and p-value, as `judgetrain report` and the
    model card open with it (`judgetrain.report.headline.against_base`); nothing for a run that did not evaluate."""
    metrics = Path(recipe.training_args.output_dir) / "metrics.jsonl"
    records = read_metrics(metrics) if metrics.is_file() else {}
    if not any(k.startswith("eval/") for rec in records.values() for k in rec):
        return
    logger.info("Against the base judge, the last eval (`judgetrain report %s` draws every eval):\n%s",
                recipe.training_args.output_dir,
                against_base_text(against_base(records, recipe.resolved, recipe.training_args.output_dir)))


def finish(parts: TrainerParts) -> None:
    """Close the trackers and wait for every process; the signal handlers go last, so a SIGTERM during the final
    save only set the stop flag. The background marker threads are joined first (their collectives run on the
    markers' own group), then every rank meets at a last barrier and every process group is destroyed
    (`Trainer.end` would destroy them at once, before the markers and with no barrier); the process then ends
    without the interpreter's teardown (`judgetrain.trainer.process.end_process`)."""
    trainer = parts.trainer
    for cb in trainer.callback_handler.callbacks:  # W&B's history is otherwise flushed by an exit hook, which a
        wandb = active_wandb(cb)  # busy machine can cut short (an offline run then holds no history at all)
        if wandb is not None:
            wandb.finish()
    finish_markers()
    destroy_process_groups(barrier=True)
    trainer.end()  # the trackers; the process groups are gone already
    parts.stopper.uninstall()


if __name__ == "__main__":
    end_process(process_main())
