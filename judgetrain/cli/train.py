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

# Late imports: judgetrain.run, judgetrain.trainer (inside the functions that use them): each command loads only what
# it runs, so `judgetrain --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from judgetrain.config.packaged import packaged_names
from judgetrain.config.recipe import RecipeError, parse_recipe, split_recipe_argv
from judgetrain.run.checkpoints import STOP_WINDOW_S  # the stop window, which the stop checkpoint's marker fits
from judgetrain.run.state import EXIT_BAD_INPUT
from judgetrain.train import run
from judgetrain.utils.logging import setup_logging


def main(argv: list[str] | None = None) -> int:
    """`judgetrain train RECIPE [overrides]`: validate, then hand over to `accelerate launch` (or dry-run here)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = ["--dry_run" if a == "--dry-run" else a for a in argv]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    setup_logging()
    try:
        recipe = parse_recipe(argv)
    except RecipeError as e:
        print(f"judgetrain train: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    script_args, training_args = recipe.script_args, recipe.training_args
    problem = launch_problem(script_args.accelerate_config, training_args.output_dir)
    if problem:
        print(f"judgetrain train: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if script_args.dry_run:
        try:
            report = run(argv)
        except (RecipeError, ValueError) as e:
            print(f"judgetrain train --dry-run: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return dry_run_verdict(report)
    from judgetrain.run.state import output_dir_in_use

    busy = output_dir_in_use(Path(training_args.output_dir))
    if busy:
        print(f"judgetrain train: {busy}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from judgetrain.trainer.parallelism import deepspeed_missing

    missing = deepspeed_missing(script_args.accelerate_config)
    if missing:
        print(f"judgetrain train: {missing}", file=sys.stderr)
        return EXIT_BAD_INPUT
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    if script_args.accelerate_config:
        launch += ["--config_file", script_args.accelerate_config]
    if script_args.num_processes:
        launch += ["--num_processes", str(script_args.num_processes)]
    recipe, overrides = split_recipe_argv(argv)
    cmd = launch + ["-m", "judgetrain.train"] + ([recipe] if recipe else []) + overrides
    logging.getLogger(__name__).info("Launching: %s", " ".join(shlex.quote(c) for c in cmd))
    return launch_and_wait(cmd, Path(training_args.output_dir))


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


def launch_and_wait(cmd: list[str], output_dir: Path) -> int:
    """Run the launcher and exit with the *run's* code: `accelerate launch` turns any worker failure into 1, and its
    one-process launcher returns as soon as a SIGTERM kills it, while the training process (parent-death signal) is
    still saving its checkpoint. So a SIGTERM is passed on to the launcher and then the training process is waited
    for; the code comes from the status line the run wrote for this launch (judgetrain.run.state)."""

    from judgetrain.run.state import LAUNCH_ID_ENV, launch_exit_code, wait_for_launch

    launch_id = uuid.uuid4().hex
    # torchrun's agent SIGKILLs the workers TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds (30 by default) after passing a
    # SIGTERM on: too short for a large model's stop checkpoint, which would then be torn.
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(STOP_WINDOW_S), **os.environ, LAUNCH_ID_ENV: launch_id}
    proc = subprocess.Popen(cmd, env=env)
    signalled = []

    def pass_on(signum, frame):
        signalled.append(signum)
        proc.send_signal(signum)

    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, pass_on),
        # a terminal's Ctrl-C reaches the whole process group, the run included: only wait for it
        signal.SIGINT: signal.signal(signal.SIGINT, lambda signum, frame: signalled.append(signum)),
    }
    try:
        code = proc.wait()
        if signalled:
            wait_for_launch(output_dir, launch_id)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return launch_exit_code(output_dir, launch_id, code)

