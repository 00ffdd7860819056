"""Checkpoints and resume: the completion marker that makes a ``checkpoint-N`` (and the final model) trustworthy
(every file with its SHA-256), finding the newest complete one, rotation that never leaves none, and cutting
metrics.jsonl back to the step a run resumes from."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from judgetrain.config.recipe import RecipeError
from judgetrain.run.layout import COMPLETE_MARKER, IDENTITY_FILE, LOCK_FILE, METRICS_FILE, STATUS_FILE
from judgetrain.utils.files import manifest_problem, write_json, write_lines, write_manifest

logger = logging.getLogger(__name__)

# the name Trainer gives a checkpoint (transformers' own pattern, ``trainer_utils._re_checkpoint``, is private)
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def checkpoint_dir(output_dir: str | os.PathLike, step: int) -> Path:
    """Where Trainer saves the checkpoint of ``step``."""
    return Path(output_dir) / f"checkpoint-{step}"


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """N of a ``checkpoint-N`` folder; None for any other name."""
    match = _CHECKPOINT_NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-N`` folders of a run directory, by step (``checkpoint-10`` after ``checkpoint-9``): Trainer's
    own listing (`transformers.trainer_utils.sort_checkpoints`), less the names it accepts by their prefix only
    (``checkpoint-2.tmp``, ``checkpoint-2-old``), which are not Trainer's checkpoints."""
    if not Path(output_dir).is_dir():
        return []
    from transformers.trainer_utils import sort_checkpoints  # imports torch: only when a run directory is listed

    return [Path(p) for p in sort_checkpoints(str(output_dir)) if checkpoint_step(p) is not None]


def write_marker(ckpt: Path, step: int, identity: dict | None = None) -> None:
    """The completion marker of ``ckpt``, written last: every file of the checkpoint, shard folders included
    (DeepSpeed ``global_stepN/``, FSDP ``pytorch_model_fsdp_0/``), with its size and SHA-256, each fsynced first
    (`judgetrain.utils.files.write_manifest`), plus the identity of the run that wrote it (``judgetrain_run.json``)."""

    if identity is not None:
        write_json(Path(ckpt) / IDENTITY_FILE, identity)
    write_manifest(ckpt, {"step": step}, name=COMPLETE_MARKER)


# files at the top of output_dir that belong to the run, not to the final model
_RUN_FILES = (METRICS_FILE, "data_audit.json", IDENTITY_FILE, STATUS_FILE, LOCK_FILE)


def write_final_marker(output_dir: str) -> None:
    """The same marker for the final model, listing the model files at the top of output_dir (not the run's log,
    recipes and checkpoints beside them)."""

    out = Path(output_dir)
    files = [p for p in out.iterdir() if p.is_file() and p.name not in _RUN_FILES + (COMPLETE_MARKER,)
             and not p.name.endswith(".tmp") and not (p.name.startswith("recipe") and p.suffix == ".yaml")]
    write_manifest(out, {"final": True}, name=COMPLETE_MARKER, only=files)


def checkpoint_problem(ckpt: Path, *, hashes: bool = True) -> str | None:
    """None when ``ckpt`` is complete (its marker matches every file: size and, with ``hashes``, SHA-256), else
    why not. A marker of an older judgetrain (sizes only) is checked by size."""

    if not (Path(ckpt) / COMPLETE_MARKER).is_file():
        return "no completion marker (the save was interrupted)"
    return manifest_problem(ckpt, name=COMPLETE_MARKER, hashes=hashes)


def find_resume_checkpoint(output_dir: str) -> str | None:
    """The newest complete ``checkpoint-N`` in ``output_dir`` (every file verified against its SHA-256); newer ones
    that fail are skipped, each with a warning saying why."""
    skipped = []
    for ckpt in reversed(list_checkpoints(output_dir)):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            if skipped:
                logger.warning("Falling back to %s, the newest checkpoint that verifies (skipped: %s)",
                               ckpt, ", ".join(p.name for p in skipped))
            return str(ckpt)
        logger.warning("Skipping incomplete checkpoint %s: %s", ckpt, problem)
        skipped.append(ckpt)
    return None


def rotate_checkpoints(output_dir, keep: int | None, *, upto: int, protect: str | None = None) -> list[Path]:
    """``save_total_limit``, applied after the marker (Trainer deletes old checkpoints while the new one has none
    yet, so a kill then left zero complete checkpoints): delete checkpoints up to step ``upto`` beyond the newest
    ``keep`` complete ones, and torn ones older than the newest complete one. Checkpoints after ``upto`` (a later
    point of a timeline this run resumed before) are left alone: they are rewritten, marker first removed, when the
    run gets there. Returns what was deleted."""
    import shutil

    if not keep or keep <= 0:
        return []
    ckpts = [(step, p) for p in list_checkpoints(output_dir) if (step := checkpoint_step(p)) <= upto]
    complete = [p for _, p in ckpts if checkpoint_problem(p, hashes=False) is None]
    if not complete:
        return []
    kept = set(complete[-keep:]) | ({Path(protect)} if protect else set())
    newest = checkpoint_step(complete[-1])
    deleted = [p for step, p in ckpts if p not in kept and step < newest]
    for p in deleted:
        shutil.rmtree(p, ignore_errors=True)
    return deleted


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
    write_lines(path, kept)
    return dropped


def resolve_resume(resume: str | None, output_dir: str) -> str | None:
    """The checkpoint ``--resume`` asks for: None (fresh run), ``auto`` (newest complete one, if any) or a path,
    checked complete before anything is written."""
    if resume in (None, "", "none", "no"):
        return None
    if resume == "auto":
        ckpt = find_resume_checkpoint(output_dir)  # verified file by file (SHA-256); falls back past bad ones
        if ckpt is None:
            logger.info("--resume auto: no complete checkpoint in %s, starting from scratch", output_dir)
        return ckpt
    problem = checkpoint_problem(Path(resume)) if Path(resume).is_dir() else "not a directory"
    if problem is None and checkpoint_step(resume) is None:
        problem = "its name is not checkpoint-<step>"
    if problem:
        raise RecipeError(f"--resume {resume}: cannot resume from it: {problem}")
    return resume
