"""Trainer callbacks that make a run readable and resumable: metrics.jsonl, complete-checkpoint markers,
non-finite loss guards and a graceful stop on SIGTERM / Ctrl-C. The checkpoint files they write and read back
are described in `judgetrain.checkpoints`."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
from pathlib import Path

from transformers import TrainerCallback
from transformers.integrations.integration_utils import rewrite_logs

from judgetrain.checkpoints import COMPLETE_MARKER, METRICS_FILE, checkpoint_dir, write_marker

logger = logging.getLogger(__name__)

class RunStopped(Exception):
    """Raised from a callback to leave ``trainer.train()`` at once, skipping the epoch-end evaluation and save that
    Trainer would otherwise run after ``should_training_stop`` (an eval of a NaN model, or minutes of eval after a
    SIGTERM, and a checkpoint of the bad state). ``reason`` is "signal" or "nonfinite"."""

    def __init__(self, reason: str, step: int, message: str, checkpoint: str | None = None):
        super().__init__(message)
        self.reason, self.step, self.checkpoint = reason, step, checkpoint


class MetricsJsonlCallback(TrainerCallback):
    """Append every logging event to ``<output_dir>/metrics.jsonl`` on the main process, with the same key names
    (``train/...``, ``eval/...``) that the W&B and TensorBoard callbacks produce."""

    def __init__(self, output_dir: str):
        self.path = Path(output_dir) / METRICS_FILE

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch}
        for key, value in rewrite_logs(logs).items():
            if isinstance(value, (int, float, str, bool)) or value is None:
                record[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, allow_nan=True) + "\n")
            f.flush()
            os.fsync(f.fileno())


class CheckpointMarkerCallback(TrainerCallback):
    """Write ``judgetrain_complete.json`` (file names and sizes) into a checkpoint once every process has finished
    saving it. A checkpoint without a valid marker is half-written and never resumed from."""

    def __init__(self):
        self.saved_step: int | None = None

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

    def _invalidate(self, args, state):
        """A save about to rewrite checkpoint-N (a resumed run reaching a step whose checkpoint was torn) must not
        leave the old marker vouching for half-rewritten files."""
        if state.is_world_process_zero:
            marker = checkpoint_dir(args.output_dir, state.global_step) / COMPLETE_MARKER
            if marker.is_file():
                marker.unlink()

    def on_save(self, args, state, control, **kwargs):
        from accelerate import PartialState

        PartialState().wait_for_everyone()
        if state.is_world_process_zero:
            ckpt = checkpoint_dir(args.output_dir, state.global_step)
            if ckpt.is_dir():
                write_marker(ckpt, state.global_step)
        self.saved_step = state.global_step
        PartialState().wait_for_everyone()


class NonFiniteGuard(TrainerCallback):
    """Stop the run (or skip the batch and count it, with ``policy='skip'``) on a NaN or inf gradient or loss.

    The gradients are checked before every optimizer step (after clipping, whatever ``logging_steps`` is), so the
    step named is exact and a non-finite update never reaches the weights:
    - ``stop``: raise `RunStopped` before the optimizer step. No checkpoint, eval or final model is written from
      that point on, so the last good checkpoint stays the newest complete one (``--resume auto`` picks it).
    - ``skip``: drop the gradients of that batch (the optimizer does not update; the scheduler still advances),
      count the step in ``skipped_steps`` and log it.
    A non-finite loss or grad norm in a logging event (Trainer's average over the logging interval) stops the run
    the same way under ``stop``.
    """

    def __init__(self, policy: str = "stop"):
        self.policy = policy
        self.bad_steps: list[int] = []
        self.skipped_steps: list[int] = []
        self.stopped_at: int | None = None

    def _stop(self, step: int, what: str):
        self.stopped_at = step
        message = (
            f"Non-finite {what} at step {step}: stopping. No checkpoint of this state is written; the last good "
            "checkpoint is kept; resume with --resume auto after lowering the learning rate or checking the data."
        )
        logger.error(message)
        raise RunStopped("nonfinite", step, message)

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None:
            return
        import torch

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads or all(bool(torch.isfinite(g).all()) for g in grads):
            return
        step = state.global_step + 1  # the step this update would complete
        self.bad_steps.append(step)
        if self.policy == "stop":
            self._stop(step, "gradient")
        optimizer.zero_grad(set_to_none=True)  # no gradient, no update: Adam(W) leaves the weights as they were
        self.skipped_steps.append(step)
        logger.warning("Non-finite gradient at step %d: batch skipped, weights not updated (%d skipped so far).",
                       step, len(self.skipped_steps))

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        bad = [k for k in ("loss", "grad_norm") if isinstance(logs.get(k), float) and not math.isfinite(logs[k])]
        if not bad or self.policy == "skip":
            return
        self.bad_steps.append(state.global_step)
        self._stop(state.global_step, " and ".join(bad))


class GracefulStop(TrainerCallback):
    """On SIGTERM (spot instances) or Ctrl-C, finish the current step, save a checkpoint, say where, and stop.

    The flag is reduced over processes each step so that every rank saves and stops at the same step. Once the
    checkpoint is complete (its marker written) `RunStopped` leaves ``trainer.train()`` at once: no epoch-end
    evaluation or second save runs after the signal. A second Ctrl-C gives up at once."""

    def __init__(self):
        self.requested = False
        self.signal_name: str | None = None
        self.saved_step: int | None = None
        self._previous = {}

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
            logger.warning("%s received: saving a checkpoint after this step, then stopping.", self.signal_name)
        self.requested = True

    def _any_requested(self) -> bool:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            import torch

            flag = torch.tensor([1.0 if self.requested else 0.0])
            if dist.get_backend() == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            return bool(flag.item() > 0)
        return self.requested

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_requested():
            if not self.requested or self.signal_name is None:
                self.signal_name = self.signal_name or "stop request of another process"
            self.requested = True
            control.should_save = True
            control.should_training_stop = True
            if state.is_world_process_zero:
                marker = checkpoint_dir(args.output_dir, state.global_step) / COMPLETE_MARKER
                if marker.is_file():
                    marker.unlink()  # about to be rewritten: the old marker must not vouch for it

    def on_save(self, args, state, control, **kwargs):
        if not self.requested:
            return
        self.saved_step = state.global_step
        ckpt = checkpoint_dir(args.output_dir, state.global_step)
        message = f"Stopped by {self.signal_name} at step {state.global_step}: checkpoint saved to {ckpt}; continue with --resume auto"
        logger.warning(message)
        raise RunStopped("signal", state.global_step, message, checkpoint=str(ckpt))
