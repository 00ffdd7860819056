"""`judgetrain status RECIPE [overrides]` (or ``python -m judgetrain.cli.status``): print the exit code the run of
launch ``$JUDGETRAIN_LAUNCH_ID`` wrote to its output_dir, for scheduler scripts around a bare `accelerate launch`
(which turns every worker's code into 1).

`judgetrain status RECIPE --verify [overrides]`: read every byte of every checkpoint of the run's output_dir (and of
its final model) against the SHA-256 in its marker, one line each (a resume trusts a checkpoint by sizes, mtimes
and sampled blocks); exit 1 when one fails. Where output_dir is machine-local, run it on each machine."""

# Late imports: judgetrain.config, judgetrain.run (inside the functions that use them): each command loads only what
# it runs, so `judgetrain --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import os
import sys
from pathlib import Path

from judgetrain.run.state import LAUNCH_ID_ENV, read_statuses


def main(argv: list[str] | None = None) -> int:
    """Print the launch's exit code; exit 1 when that launch wrote none."""
    from judgetrain.config.recipe import parse_recipe

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    verify = "--verify" in argv
    training_args = parse_recipe([a for a in argv if a != "--verify"]).training_args
    if verify:
        return verify_run(Path(training_args.output_dir))
    launch_id = os.environ.get(LAUNCH_ID_ENV)
    for status in reversed(read_statuses(Path(training_args.output_dir))):
        if launch_id and status.get("launch_id") == launch_id and isinstance(status.get("exit_code"), int):
            print(status["exit_code"])
            return 0
    return 1


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
    sys.exit(main())
