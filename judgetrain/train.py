"""The training process: one recipe from setup to cleanup, run in each process of an `accelerate launch`.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m judgetrain.train recipes/quickstart.yaml

setup (process group, recipe, logging, model alias, tokenizer, output_dir start, training rows, trainer with its
callbacks) -> ``trainer.train()`` -> final model and marker -> cleanup (trackers, barrier, signal handlers). Every
stage lives in its own folder: judgetrain.config (the recipe), judgetrain.data (rows), judgetrain.models (weights
and tokenizer), judgetrain.run (the output_dir), judgetrain.trainer (the DPOTrainer subclass and its callbacks),
judgetrain.eval (the per-epoch evaluation), judgetrain.checks (the preflight and the dry run). `judgetrain train`
(judgetrain.cli.train) launches this module.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path

from judgetrain.config.recipe import RecipeError, parse_recipe
from judgetrain.data.prepare import load_audited_dataset
from judgetrain.models.loading import load_recipe_tokenizer, model_init_kwargs
from judgetrain.run.start import prepare_output_dir, record_run

logger = logging.getLogger("judgetrain.train")


# ----------------------------------------------------------------------------------------------- train


def build_trainer(script_args, training_args, model_args, model_path: str, tokenizer, train_dataset,
                  identity: dict | None = None, forced: list[str] | None = None):
    """The `JudgeDPOTrainer` (prefix sharing as the recipe's `prefix_sharing` says) with judgetrain's callbacks:
    metrics.jsonl, checkpoint markers (with the run identity, and the checkpoint rotation), the non-finite guard (it
    reads the trainer's per-step records), the graceful stop (its signal handlers installed), the recipe's values over
    a restored optimizer on a forced resume and, when the recipe evaluates (eval_strategy, eval_on_start), the eval
    suites as the trainer's evaluation."""
    from trl import get_peft_config

    from judgetrain.trainer.callbacks import (
        CheckpointMarkerCallback,
        ForcedResume,
        GracefulStop,
        MetricsJsonlCallback,
        NonFiniteGuard,
        NoStepsLeft,
        RecipeSteps,
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
    callbacks = [NoStepsLeft(), RecipeSteps(), report, MetricsJsonlCallback(training_args.output_dir),
                 CheckpointMarkerCallback(keep, identity, stopper), guard, stopper]
    if forced:
        callbacks.append(ForcedResume(forced))
    from judgetrain.eval.callback import JudgeEvalCallback
    from judgetrain.trainer.dpo import JudgeDPOTrainer

    from judgetrain.models.loading import pinned_snapshot

    snapshot = pinned_snapshot(model_path, model_args.model_revision)  # offline: the pinned commit's own folder
    with JudgeEvalCallback.building(training_args):  # the suites, not an eval_dataset, are what eval_strategy runs
        trainer = JudgeDPOTrainer(
            model=snapshot,
            args=training_args,
            train_dataset=train_dataset,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
            callbacks=callbacks,
            prefix_sharing=script_args.prefix_sharing,
        )
    from judgetrain.utils.hub import is_hub_id

    if snapshot != model_path or is_hub_id(model_path):  # adapters name the hub model and its commit, not a folder
        for config in getattr(trainer.model, "peft_config", {}).values():
            config.base_model_name_or_path, config.revision = model_path, model_args.model_revision
    from judgetrain.report.card import write_card

    trainer.model_card_writer = write_card  # the judge's card wherever TRL would write its own
    report.attach(trainer)
    guard.attach(trainer)
    if training_args.eval_strategy != "no" or training_args.eval_on_start:
        trainer.add_callback(JudgeEvalCallback.from_recipe(script_args, training_args, tokenizer, trainer=trainer,
                                                           model_revision=model_args.model_revision))
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
    if trainer.state.best_model_checkpoint:  # metric_for_best_model: the best eval's checkpoint and figure
        summary["best_model_checkpoint"] = trainer.state.best_model_checkpoint
        summary["best_metric"] = trainer.state.best_metric
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
    """The final model or adapter (safetensors) and its tokenizer, beside recipe.yaml, and the judge's model card
    (README.md, in place of the one PEFT's save just updated), then its completion marker (the model files with their
    SHA-256, as for a checkpoint)."""
    from judgetrain.run.checkpoints import write_final_marker
    from judgetrain.report.card import write_card

    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(training_args.output_dir)
        write_card(training_args.output_dir)
        write_final_marker(training_args.output_dir)
        logger.info("Final %s saved to %s (safetensors) with recipe.yaml", "adapter" if model_args.use_peft else "model",
                    training_args.output_dir)


def finish(trainer, stopper) -> None:
    """Close the trackers and wait for every process; the signal handlers go last, so a SIGTERM during the final
    save only set the stop flag. Nothing C++-side is left running for the interpreter's exit: the background marker
    threads are joined, then every process group (the markers' own gloo group and the default one) is destroyed
    after the last barrier; left to the interpreter's teardown, a gloo group's threads could still be joinable when
    it is freed (std::terminate: "terminate called without an active exception", SIGABRT)."""
    from judgetrain.run.checkpoints import finish_markers

    _finish_wandb(trainer)
    if hasattr(trainer, "end"):
        trainer.end()
    finish_markers()
    _destroy_process_groups(barrier=True)
    stopper.uninstall()


def _destroy_process_groups(*, barrier: bool) -> None:
    """Every process group (the markers' own gloo group and the default one) destroyed here, not by the interpreter's
    teardown (see `finish`); after a ``barrier`` when every rank is known to reach it."""
    import torch

    from judgetrain.run.checkpoints import forget_marker_group

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if barrier:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    forget_marker_group()


def _finish_wandb(trainer) -> None:
    """Close the W&B run now: its history is otherwise flushed by an exit hook, which a busy machine can cut short
    (an offline run then holds no history at all)."""
    from judgetrain.compat.transformers import active_wandb

    for cb in trainer.callback_handler.callbacks:
        wandb = active_wandb(cb)
        if wandb is not None:
            wandb.finish()


def train(script_args, training_args, model_args, resolved: dict, command: str | None = None) -> dict:
    """Run one recipe to the end. Returns a summary (output_dir, final metrics, audit, resumed_from, stop reason,
    exit_code); ``judgetrain_status.jsonl`` records how it ended, for `judgetrain train` and schedulers."""
    from judgetrain.data import DataValidationError
    from judgetrain.trainer.parallelism import ParallelismError
    from judgetrain.run.diskfull import DiskFull
    from judgetrain.run.state import EXIT_BAD_INPUT, EXIT_DISK_FULL, EXIT_FAILED, outcome_code, write_status

    out = Path(training_args.output_dir)
    try:
        summary = _train(script_args, training_args, model_args, resolved, command)
    except (RecipeError, DataValidationError, FileNotFoundError, ParallelismError) as e:
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
    write_status(out, status, summary["exit_code"], step=summary.get("global_step"), message=summary.get("stopped"))
    return summary


def _train(script_args, training_args, model_args, resolved: dict, command: str | None) -> dict:
    from judgetrain.models.aliases import resolve_model
    from judgetrain.utils.fingerprints import data_fingerprint

    from accelerate import PartialState

    from judgetrain.config.recipe import remote_code_routes, remote_code_warning

    warning = remote_code_warning(remote_code_routes(training_args, model_args), model_args.model_name_or_path)
    if warning and PartialState().is_main_process:
        logger.warning(warning)
    from judgetrain.checks.preflight import check_before_start

    check_before_start(script_args, training_args, model_args, resolved)  # every predicted failure, before any load
    model_path = resolve_model(model_args.model_name_or_path)
    from judgetrain.run.revisions import pin_hub_revisions

    revisions = pin_hub_revisions(script_args, model_args, model_path, training_args.output_dir)  # before any load
    tokenizer = load_recipe_tokenizer(model_path, training_args, model_args)
    resume_from, identity, plan = prepare_output_dir(script_args, training_args, resolved, revisions)
    train_dataset, audit = load_audited_dataset(script_args, training_args, tokenizer)
    identity["data"] = audit.get("rows_fingerprint") or data_fingerprint(train_dataset)
    out = Path(training_args.output_dir)
    plan = record_run(out, identity, plan, resolved, command, resume_from, script_args)
    forced = plan["forced"] if plan["kind"] == "resume" else None
    keep = training_args.save_total_limit
    from judgetrain.eval.rows import recipe_eval_suites

    eval_suites = recipe_eval_suites(script_args, training_args, tokenizer)  # read, checked and audited before step 1
    trainer, guard, stopper = build_trainer(script_args, training_args, model_args, model_path, tokenizer,
                                            train_dataset, identity, forced)
    if eval_suites and getattr(trainer, "judge_eval", None) is not None:
        trainer.judge_eval.suites = eval_suites
    try:
        outcome, result = run_training(trainer, resume_from, guard)
    except Exception as e:
        stop_if_disk_full(e, trainer, out)
        raise
    finally:  # the recipe's value back in the arguments (Trainer's own rotation was off during training)
        training_args.save_total_limit = keep
    if result is not None:
        from judgetrain.run.diskfull import every_rank_stops

        try:
            with every_rank_stops(out, "the final save"):
                save_final(trainer, tokenizer, training_args, model_args)
        except Exception as e:
            stop_if_disk_full(e, trainer, out, final=True)
            raise
    finish(trainer, stopper)
    return {"output_dir": str(out), "resumed_from": resume_from, "audit": audit, "start": plan["kind"], **outcome}


def stop_if_disk_full(error: Exception, trainer, out: Path, *, final: bool = False) -> None:
    """Raise `DiskFull` (one message: where, how much, what to do) when ``error`` is a full output_dir, after the
    background markers of earlier checkpoints are done (judgetrain.run.diskfull)."""
    from judgetrain.run.checkpoints import finish_markers
    from judgetrain.run.diskfull import DiskFull, disk_full_error, disk_full_message

    cause = disk_full_error(error, out)
    if cause is None:
        return
    try:
        finish_markers()
    except Exception:  # noqa: BLE001 - a marker the full disk also stopped: that checkpoint stays unmarked
        logger.warning("the marker of an earlier checkpoint could not be written either", exc_info=False)
    remove = trainer.accelerator.is_local_main_process
    raise DiskFull(disk_full_message(out, trainer.state.global_step, cause, final=final, remove=remove),
                   agreed=getattr(error, "agreed", False)) from None


# ----------------------------------------------------------------------------------------------- entry points


def run(argv: list[str] | None = None) -> dict:
    """The `accelerate launch -m judgetrain.train` entry point (runs in each process)."""
    from judgetrain.trainer.process import init_process_state
    from judgetrain.utils.logging import setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    state = init_process_state(argv)
    script_args, training_args, model_args, resolved = parse_recipe(argv)
    setup_logging(state.is_main_process, force=True)
    command = "accelerate launch -m judgetrain.train " + " ".join(shlex.quote(a) for a in argv)
    if script_args.dry_run:
        from judgetrain.checks.dry_run import dry_run

        report = dry_run(script_args, training_args, model_args, resolved)
        print(json.dumps(report, indent=1, default=str))
        return report
    return train(script_args, training_args, model_args, resolved, command=command)


def process_main(argv: list[str] | None = None) -> int:
    """The training process: run, and exit with the run's code (judgetrain.run.state: 0 finished, 1 crashed,
    2 refused, 3 non-finite stop, 143 preempted after its checkpoint)."""
    from judgetrain.data import DataValidationError
    from judgetrain.run.diskfull import DiskFull
    from judgetrain.run.state import EXIT_DISK_FULL
    from judgetrain.trainer.parallelism import ParallelismError

    try:
        outcome = run(argv)
    except (RecipeError, DataValidationError, FileNotFoundError, ParallelismError) as e:  # bad recipe, bad rows, missing data: one message
        print(f"judgetrain.train: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except DiskFull as e:  # one message (the main process's), no traceback: where, how much, what to do
        if _close_process_group(e.agreed):
            print(f"judgetrain.train: {e}", file=sys.stderr)
        return EXIT_DISK_FULL
    if isinstance(outcome, dict) and outcome.get("stop_reason") == "nonfinite":
        print(f"judgetrain.train: {outcome['stopped']}", file=sys.stderr)
    return int(outcome.get("exit_code", 0)) if isinstance(outcome, dict) else 0


def _close_process_group(agreed: bool) -> bool:
    """After a stop (a full disk): the process group destroyed here, not by the interpreter's teardown (see
    `finish`). When every rank ``agreed`` on the stop they meet at a barrier first, so that none exits while the main
    process still writes its status (torchrun ends the others at the first exit); otherwise no barrier (the other
    ranks are in another collective, or gone). Returns whether this is the main process."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return True
    main = torch.distributed.get_rank() == 0
    try:
        _destroy_process_groups(barrier=agreed)
    except Exception:  # noqa: BLE001 - the exit code says what happened; the teardown is best effort
        pass
    return main


if __name__ == "__main__":
    sys.exit(process_main())
