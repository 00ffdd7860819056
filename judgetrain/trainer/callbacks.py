"""Trainer callbacks that make a run readable and resumable: metrics.jsonl, complete-checkpoint markers,
non-finite loss guards and a graceful stop on SIGTERM / Ctrl-C. The checkpoint files they write and read back
are described in `judgetrain.run.checkpoints`."""

from __future__ import annotations

import logging
import math
import signal
import time
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import TrainerCallback

from judgetrain.compat.torch import set_last_lr
from judgetrain.compat.transformers import report_to_keys
from judgetrain.run.checkpoints import (
    COMPLETE_MARKER,
    METRICS_FILE,
    checkpoint_dir,
    finish_markers,
    marker_group,
    rotate_checkpoints,
    start_marker,
    stop_deadline,
    write_marker,
)
from judgetrain.utils.files import append_jsonl
from judgetrain.utils.ranks import any_rank

logger = logging.getLogger(__name__)

class RunStopped(Exception):
    """Raised from a callback to leave ``trainer.train()`` at once, skipping the epoch-end evaluation and save that
    Trainer would otherwise run after ``should_training_stop`` (an eval of a NaN model, or minutes of eval after a
    SIGTERM, and a checkpoint of the bad state). ``reason`` is "signal", "nonfinite" or "complete" (`NoStepsLeft`)."""

    def __init__(self, reason: str, step: int, message: str, checkpoint: str | None = None):
        super().__init__(message)
        self.reason, self.step, self.checkpoint = reason, step, checkpoint


class NoStepsLeft(TrainerCallback):
    """Leave ``trainer.train()`` before its first step when the resumed checkpoint is already at ``max_steps`` (a
    requeued or rerun job whose run had finished): Trainer's loop checks the step count only after a step, so it
    would train one step past the end. The checkpoint is loaded by then, so the final model can still be saved."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            raise RunStopped("complete", state.global_step,
                             f"step {state.global_step} is the run's last (max_steps {state.max_steps}): nothing left to train")


class RecipeSteps(TrainerCallback):
    """A resumed run logs, evaluates and saves at the intervals of the recipe it was resumed with. Trainer replaces
    its state with the checkpoint's on resume, and with it the checkpoint's ``logging_steps``, ``eval_steps`` and
    ``save_steps`` (it only warns that they differ), so `--eval_steps 3` on a resume would be ignored while the
    recipe record says 3. These keys are operational (a resume may change them), so they are applied again here and
    each change is logged."""

    def on_train_begin(self, args, state, control, **kwargs):
        kinds = ("logging", "eval", "save")
        before = {k: getattr(state, f"{k}_steps") for k in kinds}
        state.compute_steps(args, state.max_steps)
        changed = [f"{k}_steps {getattr(state, f'{k}_steps')} (the checkpoint had {before[k]})" for k in kinds
                   if getattr(state, f"{k}_steps") != before[k]]
        if changed and state.global_step > 0:
            logger.info("resumed at step %d with the recipe's %s", state.global_step, ", ".join(changed))


class MetricsJsonlCallback(TrainerCallback):
    """Append every logging event to ``<output_dir>/metrics.jsonl`` on the main process, with the same key names
    (``train/...``, ``eval/...``) that the W&B and TensorBoard callbacks produce, and the eval's interval bounds
    (``.../ci_low``, ``.../ci_high``, ``.../delta_ci_low``, ``.../delta_ci_high``) that the trackers are not given
    (`hold_for_next_log`)."""

    def __init__(self, output_dir: str):
        self.path = Path(output_dir) / METRICS_FILE
        self.held: dict[str, float] = {}

    def hold_for_next_log(self, logs: dict[str, float]) -> None:
        """Keys written into the next record only, not given to the trackers (the eval's interval bounds)."""
        self.held.update(logs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        held, self.held = self.held, {}
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch}
        for key, value in report_to_keys({**logs, **held}).items():
            if isinstance(value, (int, float, str, bool)) or value is None:
                record[key] = value
        append_jsonl(self.path, record, allow_nan=True)


class CheckpointMarkerCallback(TrainerCallback):
    """Write ``judgetrain_complete.json`` into a checkpoint once every process has finished saving it: every file of
    the checkpoint (shard folders included) with its size and SHA-256, each fsynced first by the process that wrote
    it, plus the run identity (``judgetrain_run.json``); one marker per folder: the shared one, or each machine's own
    (`judgetrain.run.checkpoints.write_marker`). A checkpoint without a marker that matches its files is never
    resumed from. The marker is written in the background while training goes on (`start_marker`); the next save,
    a stop and the end of training wait for it. A stop checkpoint (``stopper`` asked for it) is marked at once,
    hashed until the stop deadline.

    Rotation (``save_total_limit``) is done here, after the marker, instead of by Trainer (which deletes old
    checkpoints while the new one has no marker yet, and only where it saves: on the main process, so a
    machine-local output_dir of another machine kept every checkpoint): each folder's owner keeps its newest
    ``keep`` *complete* checkpoints, so a kill during a save can never leave zero complete checkpoints."""

    def __init__(self, keep: int | None = None, identity: dict | None = None, stopper: "GracefulStop | None" = None):
        self.saved_step: int | None = None
        self.keep = keep
        self.identity = identity
        self.stopper = stopper

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save:
            self._invalidate(args, state)

    def on_epoch_end(self, args, state, control, **kwargs):
        # Checkpoints every save_steps *and* at each epoch end (Trainer's save_strategy offers one or the other),
        # but not twice at one step (a save_steps step that ends the epoch or the run).
        if args.save_strategy == "steps" and self.saved_step != state.global_step:
            control.should_save = True
        if control.should_save:
            self._invalidate(args, state)

    def on_evaluate(self, args, state, control, **kwargs):
        # save_strategy "best": Trainer decides to save only after this evaluation, when it is the best so far
        if args.save_strategy == "best":
            self._invalidate(args, state)

    def _invalidate(self, args, state):
        """A save about to rewrite checkpoint-N (a resumed run reaching a step whose checkpoint was torn) must not
        leave the old marker vouching for half-rewritten files (each machine's, where output_dir is machine-local)."""
        if state.is_local_process_zero:
            (checkpoint_dir(args.output_dir, state.global_step) / COMPLETE_MARKER).unlink(missing_ok=True)

    def on_save(self, args, state, control, **kwargs):

        PartialState().wait_for_everyone()
        step, protect = state.global_step, state.best_model_checkpoint
        ckpt = checkpoint_dir(args.output_dir, step)

        def rotate(done):  # every folder's owner rotates its own folder, after its marker
            if done["owner"]:
                rotate_checkpoints(args.output_dir, self.keep, upto=step, protect=protect)

        # every rank takes either branch with the same collectives on the same group, in the same order
        if self.stopper is not None and self.stopper.requested:
            deadline = self.stopper.deadline()
            finish_markers(deadline)
            rotate(write_marker(ckpt, step, self.identity, deadline=deadline, group=marker_group()))
        else:
            start_marker(ckpt, step, self.identity, after=rotate)
        self.saved_step = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        finish_markers()


class NonFiniteGuard(TrainerCallback):
    """Stop the run (or skip the batch and count it, with ``policy='skip'``) on a NaN or inf loss or gradient.

    Checked before every optimizer step, whatever ``logging_steps`` is, so the step named is exact:
    - what is checked: each micro-batch's loss and the *global* gradient norm that Trainer computes for clipping, as
      `JudgeDPOTrainer` records them (accelerate's norm: reduced over FSDP shards; DeepSpeed's global norm under ZeRO;
      the plain gradients when the norm is not available). Both flags are OR-ed over all processes, so every rank stops at the same step.
    - fp16 loss scaling: a non-finite gradient with a finite loss is the loss scaler's ordinary overflow; the scaler
      skips that update and lowers its scale. The guard lets it, counts the step (``scaler_skipped_steps``, confirmed
      by the scale going down) and stops only after ``SCALER_PATIENCE`` such steps in a row (a scale that cannot
      find a finite range is a diverged run).
    - ``stop``: raise `RunStopped` before the optimizer step. No checkpoint, eval or final model is written from
      that point on, so the last good checkpoint stays the newest complete one (``--resume auto`` picks it). Under
      DeepSpeed the engine has already applied the step inside backward; nothing of it is saved.
    - ``skip``: drop the gradients of that batch (the optimizer does not update; the scheduler still advances),
      count the step in ``skipped_steps`` and log it. Under DeepSpeed a step cannot be undone: ``skip`` stops.
    A non-finite loss or grad norm in a logging event stops the run the same way under ``stop`` (a grad norm of a
    step the loss scaler skipped excepted).
    """

    SCALER_PATIENCE = 32

    def __init__(self, policy: str = "stop"):
        self.policy = policy
        self.bad_steps: list[int] = []
        self.skipped_steps: list[int] = []
        self.scaler_skipped_steps: list[int] = []
        self.stopped_at: int | None = None
        self._accelerator = None
        self._record = None
        self._loss_bad = False
        self._grad_norm = None
        self._scale_before: float | None = None
        self._scaler_streak = 0

    def attach(self, trainer) -> "NonFiniteGuard":
        """See each micro-batch's loss and the step's global grad norm: Trainer computes both but gives neither to
        callbacks; `judgetrain.trainer.dpo.JudgeDPOTrainer` records them (``trainer.step_record``) and the guard reads
        them before every optimizer step. Another trainer records neither: the guard then checks the gradients
        themselves before each step, and the loss as it is logged."""
        self._accelerator = trainer.accelerator
        self._record = getattr(trainer, "step_record", None)
        if self._record is None:
            logger.warning("nonfinite: %s records no per-step loss or gradient norm (judgetrain's JudgeDPOTrainer "
                           "does): the guard checks the gradients before each step and the logged loss",
                           type(trainer).__name__)
        return self

    def _stop(self, step: int, what: str):
        self.stopped_at = step
        finish_markers()  # the last good checkpoint's marker, if it is still being written
        message = (
            f"Non-finite {what} at step {step}: stopping. No checkpoint of this state is written; the last good "
            "checkpoint is kept; resume with --resume auto --resume_force --learning_rate <lower> (the new rate "
            "applies), or check the data."
        )
        logger.error(message)
        raise RunStopped("nonfinite", step, message)

    def _grad_is_bad(self, model) -> bool:

        norm, self._grad_norm = self._grad_norm, None
        if norm is not None:
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a DTensor norm (FSDP2)
            return not math.isfinite(float(norm))
        grads = [p.grad for p in model.parameters() if p.grad is not None] if model is not None else []
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # DTensor shards (FSDP2)
        return not all(bool(torch.isfinite(g).all()) for g in grads)

    def _scaler(self):
        return getattr(self._accelerator, "scaler", None)

    def _is_deepspeed(self) -> bool:
        return str(getattr(self._accelerator, "distributed_type", "")).endswith("DEEPSPEED")

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self._record is not None:
            loss_bad, grad_norm = self._record.take()
            self._loss_bad = self._loss_bad or loss_bad
            if grad_norm is not None:
                self._grad_norm = grad_norm
        loss_bad, self._loss_bad = self._loss_bad, False
        loss_bad, grad_bad = any_rank([loss_bad, self._grad_is_bad(model)])
        scaler = self._scaler()
        self._scale_before = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None
        if not (loss_bad or grad_bad):
            self._scaler_streak = 0
            return
        step = state.global_step + 1  # the step this update would complete
        if self._scale_before is not None and not loss_bad:
            self._scaler_streak += 1  # the scaler's overflow: it skips this update itself (on_optimizer_step counts)
            if self._scaler_streak < self.SCALER_PATIENCE:
                return
            self.bad_steps.append(step)
            self._stop(step, f"gradient in {self._scaler_streak} steps in a row (fp16 loss scale down to "
                             f"{self._scale_before:g})")
        what = " and ".join(w for w, bad in (("loss", loss_bad), ("gradient", grad_bad)) if bad)
        self.bad_steps.append(step)
        if self.policy == "stop" or self._is_deepspeed():
            self._stop(step, what)
        optimizer.zero_grad(set_to_none=True)  # no gradient, no update: Adam(W) leaves the weights as they were
        self.skipped_steps.append(step)
        logger.warning("Non-finite %s at step %d: batch skipped, weights not updated (%d skipped so far).",
                       what, step, len(self.skipped_steps))

    def on_optimizer_step(self, args, state, control, **kwargs):
        scaler = self._scaler()
        if self._scale_before is None or scaler is None:
            return
        # The scale going down, not accelerate's optimizer_step_was_skipped: that flag says whether the scaler called
        # optimizer.step(), which it always does for a fused optimizer (Trainer's default adamw_torch_fused skips the
        # update inside its kernel), so it reads False on an overflow there.
        if float(scaler.get_scale()) < self._scale_before:  # the scaler found inf/NaN and skipped the update
            step = state.global_step + 1
            self.scaler_skipped_steps.append(step)
            logger.info("fp16 loss scaler skipped step %d (overflow; scale %g -> %g)", step, self._scale_before,
                        float(scaler.get_scale()))

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        bad = [k for k in ("loss", "grad_norm") if isinstance(logs.get(k), float) and not math.isfinite(logs[k])]
        if "grad_norm" in bad and state.global_step in self.scaler_skipped_steps:
            bad.remove("grad_norm")
        if not bad or self.policy == "skip":
            return
        self.bad_steps.append(state.global_step)
        self._stop(state.global_step, " and ".join(bad))


class ForcedResume(TrainerCallback):
    """``--resume_force``: Trainer restores the optimizer and scheduler state of the checkpoint, and with it the old
    run's learning rate (the scheduler's base rates) and Adam hyperparameters; this puts the recipe's values back in
    their place at the restored step, so that a new ``learning_rate`` (what the NaN message advises) really applies."""

    def __init__(self, forced: list[str]):
        self.forced = forced

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if optimizer is None:
            return
        groups = optimizer.param_groups
        for group in groups:
            group["initial_lr"] = args.learning_rate
            if "betas" in group:
                group["betas"] = (args.adam_beta1, args.adam_beta2)
            if "eps" in group:
                group["eps"] = args.adam_epsilon
            if group.get("weight_decay"):  # the decayed group (Trainer keeps biases and norms at 0)
                group["weight_decay"] = args.weight_decay
        lambdas = getattr(lr_scheduler, "lr_lambdas", None)
        if lambdas is not None and len(lambdas) == len(groups):
            lr_scheduler.base_lrs = [args.learning_rate] * len(groups)
            for group, fn in zip(groups, lambdas):
                group["lr"] = args.learning_rate * fn(lr_scheduler.last_epoch)
            set_last_lr(lr_scheduler, [group["lr"] for group in groups])
        elif lr_scheduler is not None:
            logger.warning("--resume_force: %s keeps its restored learning rates", type(lr_scheduler).__name__)
        logger.warning("--resume_force: learning_rate %g (now %g at step %d), adam betas/epsilon and weight decay "
                       "from this recipe replace the checkpoint's", args.learning_rate, groups[0]["lr"], state.global_step)


class GracefulStop(TrainerCallback):
    """On SIGTERM (spot instances) or Ctrl-C, finish the current step, save a checkpoint, say where, and stop.

    The flag is reduced over processes each step so that every rank saves and stops at the same step. Once the
    checkpoint is complete (its marker written) `RunStopped` leaves ``trainer.train()`` at once: no epoch-end
    evaluation or second save runs after the signal. A second Ctrl-C gives up at once."""

    def __init__(self):
        self.requested = False
        self.requested_at: float | None = None  # time.monotonic() of the signal (or of hearing of another's)
        self.signal_name: str | None = None
        self.saved_step: int | None = None
        self._previous = {}

    def deadline(self) -> float:
        """When the stop checkpoint's hashes must end (`judgetrain.run.checkpoints.stop_deadline`)."""
        return stop_deadline(self.requested_at if self.requested_at is not None else time.monotonic())

    def install(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def uninstall(self):
        for sig, previous in self._previous.items():
            try:
                signal.signal(sig, previous)
            except (ValueError, TypeError):
                pass
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:  # second Ctrl-C: give up at once
            raise KeyboardInterrupt
        if not self.requested:
            self.signal_name = signal.Signals(signum).name
            self.requested_at = time.monotonic()
            logger.warning("%s received: saving a checkpoint after this step, then stopping.", self.signal_name)
        self.requested = True

    def any_requested(self) -> bool:
        """Whether any process was asked to stop (a collective: every process calls it together)."""
        return any_rank([self.requested])[0]

    def on_step_end(self, args, state, control, **kwargs):
        if self.any_requested():
            if not self.requested or self.signal_name is None:
                self.signal_name = self.signal_name or "stop request of another process"
            self.requested = True
            self.requested_at = self.requested_at if self.requested_at is not None else time.monotonic()
            control.should_save = True
            control.should_evaluate = False  # no eval before the save (save_strategy "best" would skip the save)
            control.should_training_stop = True
            if state.is_local_process_zero:  # about to be rewritten: the old marker must not vouch for it
                (checkpoint_dir(args.output_dir, state.global_step) / COMPLETE_MARKER).unlink(missing_ok=True)

    def on_save(self, args, state, control, **kwargs):
        if not self.requested:
            return
        self.saved_step = state.global_step
        ckpt = checkpoint_dir(args.output_dir, state.global_step)
        message = f"Stopped by {self.signal_name} at step {state.global_step}: checkpoint saved to {ckpt}; continue with --resume auto"
        logger.warning(message)
        raise RunStopped("signal", state.global_step, message, checkpoint=str(ckpt))
