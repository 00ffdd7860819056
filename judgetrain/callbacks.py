"""Trainer callbacks that make a run readable and resumable: metrics.jsonl, complete-checkpoint markers,
non-finite loss guards and a graceful stop on SIGTERM / Ctrl-C."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
from pathlib import Path

from transformers import TrainerCallback
from transformers.integrations.integration_utils import rewrite_logs

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "judgetrain_complete.json"
METRICS_FILE = "metrics.jsonl"


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


def truncate_metrics(output_dir: str, last_step: int) -> int:
    """Drop metrics.jsonl records after ``last_step`` (logged after the checkpoint a run resumes from) and a torn
    last line, so a resumed run continues without duplicated or missing steps. Returns how many lines were dropped."""
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1  # torn write of a killed process
            continue
        if record.get("step", 0) <= last_step:
            kept.append(line)
        else:
            dropped += 1
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
    return dropped


class CheckpointMarkerCallback(TrainerCallback):
    """Write ``judgetrain_complete.json`` (file names and sizes) into a checkpoint once every process has finished
    saving it. A checkpoint without a valid marker is half-written and never resumed from."""

    def on_epoch_end(self, args, state, control, **kwargs):
        # Checkpoints every save_steps *and* at each epoch end (Trainer's save_strategy offers one or the other).
        if args.save_strategy == "steps":
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        from accelerate import PartialState

        PartialState().wait_for_everyone()
        if state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                write_marker(ckpt, state.global_step)
        PartialState().wait_for_everyone()


def write_marker(ckpt: Path, step: int) -> None:
    files = {p.name: p.stat().st_size for p in sorted(ckpt.iterdir()) if p.is_file() and p.name != COMPLETE_MARKER}
    tmp = ckpt / (COMPLETE_MARKER + ".tmp")
    tmp.write_text(json.dumps({"step": step, "files": files}, indent=1))
    os.replace(tmp, ckpt / COMPLETE_MARKER)


def checkpoint_problem(ckpt: Path) -> str | None:
    """None when ``ckpt`` is complete, else why not."""
    marker = ckpt / COMPLETE_MARKER
    if not marker.is_file():
        return "no completion marker (the save was interrupted)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return "unreadable completion marker"
    for name, size in files.items():
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written"
    return None


def find_resume_checkpoint(output_dir: str) -> str | None:
    """The newest complete ``checkpoint-N`` in ``output_dir``; incomplete newer ones are skipped with a warning."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    ckpts = []
    for p in root.glob("checkpoint-*"):
        suffix = p.name.split("-", 1)[1]
        if p.is_dir() and suffix.isdigit():
            ckpts.append((int(suffix), p))
    for _, ckpt in sorted(ckpts, reverse=True):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            return str(ckpt)
        logger.warning("Skipping incomplete checkpoint %s: %s", ckpt, problem)
    return None


class NonFiniteGuard(TrainerCallback):
    """Stop the run (or count and go on, with ``policy='skip'``) when the logged loss or grad norm is NaN or inf.

    Trainer logs averages over the logging interval, so with logging_steps=1 the step named is exact. On stop, no
    checkpoint is written from the bad state: the last good checkpoint stays the newest complete one.
    """

    def __init__(self, policy: str = "stop"):
        self.policy = policy
        self.bad_steps: list[int] = []
        self.stopped_at: int | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        bad = [k for k in ("loss", "grad_norm") if isinstance(logs.get(k), float) and not math.isfinite(logs[k])]
        if not bad:
            return
        self.bad_steps.append(state.global_step)
        if self.policy == "stop":
            self.stopped_at = state.global_step
            control.should_training_stop = True
            control.should_save = False
            logger.error(
                "Non-finite %s at step %d: stopping. The last good checkpoint is kept; resume with --resume auto "
                "after lowering the learning rate or checking the data.",
                " and ".join(bad), state.global_step,
            )
        else:
            logger.warning("Non-finite %s at step %d (%d so far): continuing.", " and ".join(bad), state.global_step, len(self.bad_steps))


class GracefulStop(TrainerCallback):
    """On SIGTERM (spot instances) or Ctrl-C, finish the current step, save a checkpoint and stop.

    The flag is reduced over processes each step so that every rank saves and stops at the same step."""

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

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:  # second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        logger.warning("%s received: saving a checkpoint after this step, then stopping.", self.signal_name)

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
            self.requested = True
            control.should_save = True
            control.should_training_stop = True
            self.saved_step = state.global_step
