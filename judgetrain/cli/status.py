"""`judgetrain status RUN_DIR` (or `judgetrain status RECIPE [overrides]`, which names its output_dir): how the run in
that folder stands, one line: running, finished, stopped (by a signal: resume with ``--resume auto``), failed, or
refused, with its exit code and step, e.g. ``runs/quickstart: finished (exit code 0) at step 62``.

With ``$JUDGETRAIN_LAUNCH_ID`` set (scheduler scripts around a bare `accelerate launch`, which turns every worker's
code into 1): print the exit code that launch wrote to its output_dir; exit 1 when it wrote none. With
``$JUDGETRAIN_LAUNCHER_EXIT`` also set (the launcher's own code) a written 0 that the launcher contradicts (a process
failed after the run wrote its line) prints the launcher's code, and the run folder records the launch as failed.

`judgetrain status RUN_DIR --verify` (or ``RECIPE --verify``): read every byte of every checkpoint of the run (and of
its final model) against the SHA-256 in its marker, one line each (a resume trusts a checkpoint by sizes, mtimes and
sampled blocks); exit 1 when one fails. Where output_dir is machine-local, run it on each machine.

Exit codes: 0 the state was read (or every checkpoint verified), 1 a checkpoint failed --verify (or the launch
named by ``$JUDGETRAIN_LAUNCH_ID`` wrote no code), 2 not a run folder or a bad recipe."""

# Late imports: judgetrain.config, judgetrain.run (inside the functions that use them): each command
# loads only what it runs, so `judgetrain --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import os
import sys
from pathlib import Path

from judgetrain.run.layout import IDENTITY_FILE, METRICS_FILE, STATUS_FILE
from judgetrain.run.state import (EXIT_BAD_INPUT, LAUNCH_ID_ENV, LAUNCHER_EXIT_ENV, launch_exit_code,
                                  output_dir_in_use, read_statuses)
from judgetrain.utils.errors import BadInputError

# how each status line a launch writes reads (judgetrain.train, judgetrain.run.state.outcome_code)
STATES = {"finished": "finished",
          "preempted": "stopped by a signal: resume it with judgetrain train RECIPE --resume auto",
          "nonfinite": "stopped on a non-finite loss or gradient", "regressed": "stopped: an eval got worse than the "
          "baseline", "disk_full": "stopped: the disk is full", "failed": "failed", "refused": "refused at start"}


def main(argv: list[str] | None = None) -> int:
    """Print the run's state (or the launch's exit code); the module's doc gives the exit codes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: judgetrain status RUN_DIR|RECIPE [overrides] [--verify]\n\n{__doc__}")
        return 0 if argv else EXIT_BAD_INPUT
    verify = "--verify" in argv
    argv = [a for a in argv if a != "--verify"]
    if not argv:
        raise BadInputError("name the run: judgetrain status RUN_DIR --verify (or RECIPE --verify)")
    try:
        output_dir = run_folder(argv)
    except ValueError as err:
        raise BadInputError(str(err)) from err
    if verify:
        return verify_run(output_dir)
    launch_id = os.environ.get(LAUNCH_ID_ENV)
    if launch_id:
        code = launch_code(output_dir, launch_id)
        if code is None:
            return 1
        print(code)
        return 0
    print(f"{output_dir}: {run_state(output_dir)}")
    return 0


def launch_code(output_dir: Path, launch_id: str) -> int | None:
    """The code launch ``launch_id`` wrote, None when it wrote none; with ``$JUDGETRAIN_LAUNCHER_EXIT`` (the
    launcher's own code, as a scheduler script read it) a 0 the launcher contradicts is not the launch's code
    (`judgetrain.run.state.launch_exit_code`, which records it)."""
    if not any(s.get("launch_id") == launch_id and isinstance(s.get("exit_code"), int)
               for s in read_statuses(output_dir)):
        return None
    launcher = os.environ.get(LAUNCHER_EXIT_ENV, "").strip()
    if not launcher.lstrip("-").isdigit():
        launcher = "0"  # unknown: the run's own code
    return launch_exit_code(output_dir, launch_id, int(launcher))


def run_folder(argv: list[str]) -> Path:
    """The run folder ``argv`` names: a folder (a run's output_dir), else a recipe with overrides (its output_dir).
    ValueError (one line) for a recipe that does not parse or a path that is neither."""
    from judgetrain.config.recipe import RecipeError, did_you_mean, parse_recipe

    first = Path(argv[0])
    if first.is_dir() and len(argv) == 1:
        if not any((first / name).exists() for name in (STATUS_FILE, METRICS_FILE, IDENTITY_FILE)):
            raise ValueError(f"{first}: not a run folder (no {STATUS_FILE}, {METRICS_FILE} or {IDENTITY_FILE}); give "
                             "a run's output_dir or its recipe")
        return first
    if first.is_dir():
        flag = next((a for a in argv[1:] if a.startswith("-")), None)
        if flag:
            name = flag.lstrip("-").split("=", 1)[0].replace("-", "_")
            raise ValueError(f"unknown option {flag}{did_you_mean(name, ['verify'], flag=True)} (a run folder takes "
                             "--verify alone; overrides go with a recipe)")
        raise ValueError(f"{first}: a folder takes no overrides; give a run's output_dir alone, or its recipe")
    try:
        return Path(parse_recipe(argv).training_args.output_dir)
    except RecipeError as err:
        raise ValueError(str(err).splitlines()[0]) from None


def run_state(output_dir: Path) -> str:
    """One line: running (its lock is held), else how its last launch ended."""
    busy = output_dir_in_use(output_dir)
    if busy:
        return f"running ({busy.split('(', 1)[-1].split(')', 1)[0]})"
    ended = [s for s in read_statuses(output_dir) if s.get("status") in STATES]
    if not ended:
        if not output_dir.is_dir():
            return "not started (no such folder)"
        return ("failed: its last launch ended without writing how (killed, or a crash before its first line); "
                "resume it with judgetrain train RECIPE --resume auto")
    last = ended[-1]
    step = f" at step {last['step']}" if last.get("step") is not None else ""
    why = f": {last['message']}" if last.get("message") and last["status"] in ("failed", "refused", "disk_full") else ""
    return f"{STATES[last['status']]} (exit code {last.get('exit_code')}){step}{why}".splitlines()[0]


def verify_run(output_dir: Path) -> int:
    """Every checkpoint and the final model of ``output_dir`` verified byte by byte; 0 when all verify."""
    from judgetrain.run.checkpoints import COMPLETE_MARKER, checkpoint_problem, list_checkpoints, marker_verification

    folders = list_checkpoints(output_dir) + ([output_dir] if (output_dir / COMPLETE_MARKER).is_file() else [])
    if not folders:
        print(f"{output_dir}: no checkpoint and no final model")
        return 1
    bad = 0
    for folder in folders:
        problem = checkpoint_problem(folder, full=True)
        name = folder.name if folder != output_dir else f"{folder} (final model)"
        if problem:
            bad += 1
            print(f"{name}: FAILED: {problem}")
        elif marker_verification(folder) == "sample":
            print(f"{name}: ok by size and sampled blocks (a stop checkpoint marked under its deadline: not every "
                  "file has a SHA-256)")
        else:
            print(f"{name}: ok (every file matches its SHA-256)")
    return 1 if bad else 0


if __name__ == "__main__":
    from judgetrain.cli import run_command

    sys.exit(run_command("status", sys.argv[1:]))
