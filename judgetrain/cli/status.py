"""`judgetrain status RECIPE [overrides]` (or ``python -m judgetrain.cli.status``): print the exit code the run of
launch ``$JUDGETRAIN_LAUNCH_ID`` wrote to its output_dir, for scheduler scripts around a bare `accelerate launch`
(which turns every worker's code into 1)."""

from __future__ import annotations

from pathlib import Path
import os
import sys

from judgetrain.run.state import LAUNCH_ID_ENV, read_statuses


def main(argv: list[str] | None = None) -> int:
    """Print the launch's exit code; exit 1 when that launch wrote none."""
    from judgetrain.config.recipe import parse_recipe

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    _, training_args, _, _ = parse_recipe(argv)
    launch_id = os.environ.get(LAUNCH_ID_ENV)
    for status in reversed(read_statuses(Path(training_args.output_dir))):
        if launch_id and status.get("launch_id") == launch_id and isinstance(status.get("exit_code"), int):
            print(status["exit_code"])
            return 0
    return 1



if __name__ == "__main__":
    sys.exit(main())
