"""`judgetrain train`: train an LLM judge with DPO (full fine-tune or LoRA) from a recipe, evaluated every epoch.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m judgetrain.train recipes/quickstart.yaml
    judgetrain train recipes/quickstart.yaml --learning_rate 1e-4      # hands over to accelerate launch
    judgetrain train recipes/judgebias_qwen3_8b_lora.yaml --dry-run    # validate without loading weights
    ... --resume auto                                                  # continue a killed run

A recipe holds `JudgeTrainArguments` (judgetrain/config/recipe.py), `trl.DPOConfig` and `trl.ModelConfig` keys; any key can
be overridden as ``--key value``.

DeepSpeed (accelerate_configs/zero2.yaml, zero3.yaml) is installed apart, into the environment that has torch:
``pip install --no-build-isolation deepspeed``. Without a GPU the ZeRO configs run on DeepSpeed's CPU accelerator:
    judgetrain train recipes/quickstart.yaml --accelerate_config accelerate_configs/zero3.yaml --num_processes 2 --mixed_precision no
"""

# Late imports: judgetrain.trainer (inside the functions that use them): each command loads only what
# it runs, so `judgetrain --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path

from judgetrain.config.packaged import packaged_names
from judgetrain.config.recipe import RecipeError, parse_recipe, split_recipe_argv
from judgetrain.run.launch import Launch, accelerate_argv, launch_and_wait
from judgetrain.run.state import EXIT_BAD_INPUT, output_dir_in_use
from judgetrain.train import run
from judgetrain.utils.logging import setup_logging


def main(argv: list[str] | None = None) -> int:
    """`judgetrain train RECIPE [overrides]`: validate, then hand over to `accelerate launch` (or dry-run here). Bad
    input raises (`BadInputError`: the `judgetrain` entry prints its one line, exit code 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = ["--dry_run" if a == "--dry-run" else a for a in argv]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    setup_logging()
    recipe = parse_recipe(argv)
    script_args, training_args = recipe.script_args, recipe.training_args
    launch = Launch(script_args.num_processes, script_args.accelerate_config)
    check_launch(launch, training_args.output_dir)
    if script_args.dry_run:
        try:
            report = run(argv)
        except (RecipeError, ValueError) as e:  # the dry run's own line: what would refuse the launch
            print(f"judgetrain train --dry-run: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return dry_run_verdict(report)
    from judgetrain.trainer.parallelism import deepspeed_missing

    busy = output_dir_in_use(Path(training_args.output_dir)) or deepspeed_missing(script_args.accelerate_config)
    if busy:
        raise RecipeError(busy)
    recipe_path, overrides = split_recipe_argv(argv)
    cmd = accelerate_argv("judgetrain.train", ([recipe_path] if recipe_path else []) + overrides, launch)
    logging.getLogger(__name__).info("Launching: %s", " ".join(shlex.quote(c) for c in cmd))
    return launch_and_wait(cmd, Path(training_args.output_dir))


def check_launch(launch: Launch, output_dir: str) -> None:
    """`RecipeError` for what would make the launch itself fail (one line, with the fix), found before anything
    starts: an accelerate config that is not a file, an output_dir that is a file."""
    problem = launch_problem(launch.accelerate_config, output_dir)
    if problem:
        raise RecipeError(problem)


def launch_problem(accelerate_config: str | None, output_dir: str) -> str | None:
    """What would make the launch itself fail (one line, with the fix), found before anything starts: an
    accelerate config that is not a file, an output_dir that is a file."""
    if accelerate_config and not Path(accelerate_config).is_file():
        return (f"--accelerate_config {accelerate_config}: no such file; give a path or a packaged config's name "
                f"({', '.join(packaged_names('accelerate_configs'))})")
    if Path(output_dir).exists() and not Path(output_dir).is_dir():
        return f"--output_dir {output_dir}: a file, not a folder; name a folder (made if missing)"
    return None


def dry_run_verdict(report: dict) -> int:
    """The dry run's exit code is the launch's verdict: 2 when a check would refuse it (each problem is one line of
    the log and of the report's ``preflight``), 0 when it would start."""
    problems = report.get("preflight") or []
    if problems:
        print(f"judgetrain train --dry-run: the launch would be refused ({len(problems)} problem"
              f"{'s' if len(problems) > 1 else ''}: see preflight above)", file=sys.stderr)
    return int(report.get("exit_code", 2 if problems else 0))
