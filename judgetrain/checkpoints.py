"""Checkpoints and resume: the completion marker that makes a ``checkpoint-N`` trustworthy, finding the newest
complete one, and cutting metrics.jsonl back to the step a run resumes from."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from judgetrain.recipe import RecipeError

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "judgetrain_complete.json"
METRICS_FILE = "metrics.jsonl"
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def checkpoint_dir(output_dir: str | os.PathLike, step: int) -> Path:
    """Where Trainer saves the checkpoint of ``step``."""
    return Path(output_dir) / f"checkpoint-{step}"


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """N of a ``checkpoint-N`` folder; None for any other name."""
    match = _CHECKPOINT_NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-N`` folders of a run directory, by step (``checkpoint-10`` after ``checkpoint-9``)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.glob("checkpoint-*") if p.is_dir() and (step := checkpoint_step(p)) is not None]
    return [p for _, p in sorted(found)]


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
    for ckpt in reversed(list_checkpoints(output_dir)):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            return str(ckpt)
        logger.warning("Skipping incomplete checkpoint %s: %s", ckpt, problem)
    return None


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


def resolve_resume(resume: str | None, output_dir: str) -> str | None:
    """The checkpoint ``--resume`` asks for: None (fresh run), ``auto`` (newest complete one, if any) or a path,
    checked complete before anything is written."""
    if resume in (None, "", "none", "no"):
        return None
    if resume == "auto":
        ckpt = find_resume_checkpoint(output_dir)
        if ckpt is None:
            logger.info("--resume auto: no complete checkpoint in %s, starting from scratch", output_dir)
        return ckpt
    problem = checkpoint_problem(Path(resume)) if Path(resume).is_dir() else "not a directory"
    if problem is None and checkpoint_step(resume) is None:
        problem = "its name is not checkpoint-<step>"
    if problem:
        raise RecipeError(f"--resume {resume}: cannot resume from it: {problem}")
    return resume
