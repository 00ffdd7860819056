"""What makes a run one run: its identity, the lock on its output_dir, and the exit status a scheduler reads.

- Identity (``judgetrain_run.json`` in output_dir and in every checkpoint): the recipe as run (less the keys that
  only change how a run is watched: logging, saving, evaluation, output paths), a fingerprint of the training rows,
  the process count, the judgetrain / library versions and the commits of the hub repositories it reads at a branch
  (`judgetrain.run.revisions`: pinned at the first start, reused by every resume). ``--resume`` continues a
  checkpoint only when its identity equals this run's; otherwise it refuses, naming each differing field.
  ``--resume_force`` continues anyway and keeps the new values (a new learning rate is applied over the restored
  optimizer and scheduler state).
- A fresh run refuses an output_dir that already holds a run unless ``--overwrite_output_dir`` is given.
- Lock: the main process holds an exclusive ``flock`` on ``output_dir/.judgetrain.lock`` for the whole run; a second
  run in the same output_dir stops with a message naming the holder. The kernel drops the lock when the holder exits,
  however it exits, so a killed run never leaves it stuck.
- Exit status: the main process appends a line to ``judgetrain_status.jsonl`` (outcome, exit code, step) before it
  exits;
  `judgetrain train` waits for the run to release its lock and exits with that code, because ``accelerate launch``
  turns every non-zero exit of its workers into 1.
"""

# Late imports: judgetrain.config (inside the functions that use them): `judgetrain report` and `status` read a run
# folder without torch: it comes in with the functions that need a process group or a checkpoint list.

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from judgetrain.config.recipe import EvalArguments, RecipeError
from judgetrain.run.layout import COMPLETE_MARKER, IDENTITY_FILE, LOCK_FILE, METRICS_FILE, STATUS_FILE  # noqa: F401
from judgetrain.utils.files import LockBusy, LockUnsupported, append_jsonl, file_lock, read_json, write_json
from judgetrain.utils.fingerprints import library_versions

logger = logging.getLogger(__name__)

LAUNCH_ID_ENV = "JUDGETRAIN_LAUNCH_ID"
LAUNCHER_EXIT_ENV = "JUDGETRAIN_LAUNCHER_EXIT"  # a scheduler script's launcher code, for `judgetrain status`

# Exit codes (docs/reliability.md: "Exit codes and schedulers").
EXIT_FINISHED = 0      # trained to the end, final model saved
EXIT_FAILED = 1        # crashed (a traceback in the log)
EXIT_BAD_INPUT = 2     # recipe, data, output_dir or resume refused before training
EXIT_NONFINITE = 3     # stopped on a NaN/inf loss or gradient; the last good checkpoint is kept
EXIT_DISK_FULL = 4     # a write into output_dir failed for lack of space; the last complete checkpoint is kept
EXIT_REGRESSED = 5     # eval_regression_action: stop: an eval found categories worse than the baseline; checkpoint saved
EXIT_PREEMPTED = 143   # stopped by SIGTERM/SIGINT after saving a checkpoint: requeue with --resume auto (128 + 15)


# Recipe keys that change how a run is watched or where it writes, not what it computes.
OPERATIONAL_KEYS = frozenset({
    "output_dir", "resume", "resume_force", "overwrite_output_dir", "dry_run", "audit_rows", "accelerate_config",
    "logging_steps", "logging_strategy", "logging_first_step", "logging_dir", "logging_nan_inf_filter", "report_to",
    "run_name", "project", "trackio_space_id", "disable_tqdm", "log_level", "log_level_replica",
    "save_steps", "save_strategy", "save_total_limit", "save_only_model", "save_on_each_node",
    *(f.name for f in fields(EvalArguments)), "eval_strategy", "eval_steps", "eval_on_start", "log_matrix_images",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "nonfinite",
})


# --------------------------------------------------------------------------------------------- identity


def run_identity(resolved: dict, *, num_processes: int, data: str, revisions: dict | None = None) -> dict:
    """What defines a run (see the module docstring); compared field by field on resume. ``revisions``: the commits
    of the hub repositories it reads at a branch (`judgetrain.run.revisions`)."""
    from judgetrain.config.recipe import _plain

    recipe = {k: _plain(v) for k, v in sorted(resolved.items()) if k not in OPERATIONAL_KEYS}
    return {"recipe": recipe, "data": data, "num_processes": num_processes, "versions": library_versions(),
            "revisions": dict(revisions or {})}


def identity_differences(old: dict, new: dict) -> list[str]:
    """One line per differing field, ``field: old -> new`` (a recipe key absent on one side is ``(default)``)."""
    diffs = []  # a ``data`` of None on the new side: not known yet (checked once the rows are loaded)
    for section in ("recipe", "versions", "revisions"):
        if section == "revisions" and "revisions" not in old:
            continue  # a run from before revisions were pinned
        a, b = old.get(section) or {}, new.get(section) or {}
        for key in sorted(set(a) | set(b)):
            if a.get(key, "(default)") != b.get(key, "(default)"):
                diffs.append(f"{section}.{key}: {a.get(key, '(default)')!r} -> {b.get(key, '(default)')!r}")
    for key in ("num_processes", "data"):
        if key == "data" and new.get(key) is None:
            continue
        if old.get(key) != new.get(key):
            diffs.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return diffs


def checkpoint_identity(checkpoint: str | os.PathLike) -> dict | None:
    """The identity of the run that wrote ``checkpoint`` (its own copy; else its output_dir's current one)."""
    ckpt = Path(checkpoint)
    own = read_json(ckpt / IDENTITY_FILE)
    if own is not None:
        return own
    record = read_json(ckpt.parent / IDENTITY_FILE)
    return record.get("current") if record else None


# --------------------------------------------------------------------------------------------- start decision

RUN_ARTIFACTS = (METRICS_FILE, "eval", "rejects", "data_audit.json", IDENTITY_FILE, STATUS_FILE)


def used_by_a_run(out: Path) -> list[str]:
    """The names in ``out`` that show an earlier run wrote there (empty: a new or unused folder)."""
    if not out.is_dir():
        return []
    names = [n for n in RUN_ARTIFACTS + (COMPLETE_MARKER, "recipe.yaml") if (out / n).exists()]
    names += sorted(p.name for p in out.glob("checkpoint-*") if p.is_dir())
    return names


def plan_start(out: Path, identity: dict, *, checkpoint: str | None, resume_asked: bool, force: bool,
               overwrite: bool) -> dict:
    """Decide how this run starts in ``out``: ``{"kind": "fresh" | "resume" | "restart", "forced": [...],
    "clear": [...]}``, or raise `RecipeError` saying why not and what to pass instead.

    - resume: ``checkpoint`` was written by the same run (equal identity), or ``force``.
    - restart: ``--resume`` found no complete checkpoint, but ``out`` holds this same run (killed before its first
      checkpoint): it starts again from step 0 in place.
    - fresh: ``out`` holds no run, or ``overwrite`` (the earlier run's checkpoints, metrics and evals are removed).
    """
    hint = ("pass --resume_force to continue anyway with the new values (they apply from the resumed step on: a new "
            "learning_rate replaces the restored one), or start a new run in another output_dir")
    if checkpoint:
        old = checkpoint_identity(checkpoint)
        diffs = (["identity: the checkpoint records none (written by an older judgetrain or another program)"]
                 if old is None else identity_differences(old, identity))
        if diffs and not force:
            raise RecipeError(f"--resume {checkpoint}: this is not the run that wrote the checkpoint; differing:\n  "
                              + "\n  ".join(diffs) + f"\n{hint}")
        return {"kind": "resume", "forced": diffs, "clear": []}
    used = used_by_a_run(out)
    if not used:
        return {"kind": "fresh", "forced": [], "clear": []}
    if overwrite:
        return {"kind": "fresh", "forced": [], "clear": used}
    record = read_json(out / IDENTITY_FILE)
    if resume_asked and record is not None:
        diffs = identity_differences(record.get("current") or {}, identity)
        if diffs and not force:
            raise RecipeError(f"--resume: {out} holds another run (no complete checkpoint to resume); differing:\n  "
                              + "\n  ".join(diffs) + f"\n{hint}")
        return {"kind": "restart", "forced": diffs, "clear": []}
    raise RecipeError(
        f"output_dir {out} already holds a run ({', '.join(used[:6])}{', ...' if len(used) > 6 else ''}): pass "
        "--resume auto to continue it, --overwrite_output_dir to start a new run there (its checkpoints, metrics and "
        "evaluations are deleted), or choose another output_dir"
    )


def clear_run(out: Path, names: list[str]) -> None:
    """Remove an earlier run's artifacts (only judgetrain's own names; other files in output_dir stay)."""

    for name in names:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for recipe in out.glob("recipe.resume-*.yaml"):
        recipe.unlink()
    logger.warning("--overwrite_output_dir: removed the earlier run's %s from %s", ", ".join(names), out)


def record_start(out: Path, identity: dict, plan: dict, *, step: int, checkpoint: str | None) -> dict:
    """Write ``judgetrain_run.json``: the first identity stays, the current one and a history entry are added."""
    record = read_json(out / IDENTITY_FILE) if plan["kind"] != "fresh" else None
    record = record or {"first": identity, "history": []}
    record["current"] = identity
    record["history"].append({
        "event": plan["kind"], "step": step, "checkpoint": checkpoint, "forced": plan["forced"],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
    })
    write_json(out / IDENTITY_FILE, record)
    return record


def recipe_path(out: Path, plan: dict, step: int) -> Path:
    """recipe.yaml for the first start; recipe.resume-<step>.yaml (never overwritten) for each resume/restart."""
    if plan["kind"] == "fresh":
        return out / "recipe.yaml"
    path, n = out / f"recipe.resume-{step}.yaml", 2
    while path.exists():
        path, n = out / f"recipe.resume-{step}-{n}.yaml", n + 1
    return path


# --------------------------------------------------------------------------------------------- lock

_HELD: dict[str, object] = {}


def hold_output_dir(out: Path) -> None:
    """Take the output_dir lock for the rest of this process (the kernel releases it at exit, however the process
    ends). Raises `RecipeError` naming the holder if another run has it."""
    key = str(out.resolve())
    if key in _HELD:
        return
    out.mkdir(parents=True, exist_ok=True)
    lock = file_lock(out / LOCK_FILE, wait=False, on_acquired=_write_holder)
    try:
        lock.__enter__()
    except LockBusy:
        raise RecipeError(_in_use(out)) from None
    except LockUnsupported as e:
        raise RecipeError(_cannot_lock(out, e)) from None
    _HELD[key] = lock


def _write_holder(fd: int) -> None:
    """Who holds the lock, in the lock file (read back by `_in_use` in the run that is refused)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}".encode(), 0)


def _in_use(out: Path) -> str:
    holder = (out / LOCK_FILE).read_text(errors="replace").strip() or "unknown process"
    return f"output_dir {out} is in use by another judgetrain run ({holder}); wait for it to end or use another output_dir"


def _cannot_lock(out: Path, error: OSError) -> str:
    return (f"output_dir {out}: cannot lock {LOCK_FILE} there: its filesystem does not support file locks (flock: "
            f"{error.strerror}; some NFS and FUSE mounts lack them); without the lock two runs could write into one "
            "output_dir: choose an output_dir on a local disk or a filesystem with locking")


def output_dir_in_use(out: Path) -> str | None:
    """Why a run cannot start in ``out`` now (another process holds its lock), or None. For `judgetrain train`,
    before it launches anything: a refusal inside the launch would reach the caller as accelerate's 1."""
    if not (out / LOCK_FILE).exists():
        return None
    try:
        with file_lock(out / LOCK_FILE, wait=False):
            return None
    except LockBusy:
        return _in_use(out)
    except LockUnsupported as e:
        return _cannot_lock(out, e)


def release_output_dir(out: Path) -> None:
    lock = _HELD.pop(str(out.resolve()), None)
    if lock is not None:
        lock.__exit__(None, None, None)


def wait_for_launch(out: Path, launch_id: str, timeout: float = 900.0, poll: float = 0.5) -> bool:
    """After a signal made the launcher return early: block until the training process of launch ``launch_id`` has
    written its status line (its stop checkpoint is then complete) or no process holds ``out``'s lock any more.
    False if neither happened within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    told = False
    while time.monotonic() < deadline:
        if any(s.get("launch_id") == launch_id for s in read_statuses(out)):
            return True
        try:
            with file_lock(out / LOCK_FILE, wait=False):
                return True
        except LockBusy:
            pass
        if not told:
            logger.info("Waiting for the training process to finish writing %s", out)
            told = True
        time.sleep(poll)
    return False


# --------------------------------------------------------------------------------------------- exit status


def outcome_code(outcome: dict | None) -> tuple[str, int]:
    """(status, exit code) of a finished `train()` summary."""
    reason = (outcome or {}).get("stop_reason")
    if reason == "signal":
        return "preempted", EXIT_PREEMPTED
    if reason == "nonfinite":
        return "nonfinite", EXIT_NONFINITE
    if reason == "regression":
        return "regressed", EXIT_REGRESSED
    return "finished", EXIT_FINISHED


def write_status(out: Path, status: str, code: int, *, step: int | None = None, message: str | None = None,
                 **extra: Any) -> None:
    """Append how this launch ended to ``judgetrain_status.jsonl`` (one line per launch, tagged with the launch id
    `judgetrain train` set). Only the holder of the output_dir lock writes (a run refused by the lock must not touch
    the other run's files)."""
    if not holds_output_dir(out):
        return
    append_jsonl(out / STATUS_FILE, {"status": status, "exit_code": code, "step": step, "message": message,
                                     "launch_id": os.environ.get(LAUNCH_ID_ENV), "pid": os.getpid(),
                                     "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}, default=str)


def read_statuses(out: Path) -> list[dict]:
    try:
        lines = (out / STATUS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    statuses = []
    for line in lines:
        try:
            statuses.append(json.loads(line))
        except ValueError:
            continue  # a torn last line of a killed process
    return statuses


def launch_exit_code(out: Path, launch_id: str, launcher_code: int) -> int:
    """The exit code of the run `judgetrain train` launched: from its status line (accelerate turns every worker's
    code into 1), else the launcher's own. A run that wrote 0 whose launcher exited otherwise did not end cleanly (a
    process failed after the main process wrote its line): the launcher's code, recorded as a `failed` line for
    `judgetrain status`."""
    line = next((s for s in reversed(read_statuses(out)) if s.get("launch_id") == launch_id
                 and isinstance(s.get("exit_code"), int)), None)
    if line is None:
        return launcher_code
    if line["exit_code"] == EXIT_FINISHED and launcher_code != EXIT_FINISHED:
        append_jsonl(out / STATUS_FILE, {
            "status": "failed", "exit_code": launcher_code, "step": line.get("step"), "launch_id": launch_id,
            "message": f"the run wrote finished (exit code 0), then its launch exited {launcher_code}: a process "
                       "of it failed at its exit (the launch's log has its error)",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        return launcher_code
    return line["exit_code"]


def holds_output_dir(out: Path) -> bool:
    return str(Path(out).resolve()) in _HELD
