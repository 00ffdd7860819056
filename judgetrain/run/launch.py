"""The one door every command is started through: the command table and the launcher.

    COMMANDS["pairs known"].module                     # "judgetrain.cli.pairs_known"
    find_command(["pairs", "known", "--items", "x"])   # ("pairs known", ["--items", "x"])
    command_argv(["judge", "--items", "x"], Launch(num_processes=2, accelerate_config="cpu.yaml"))
    # [python, -m, accelerate.commands.launch, --config_file, cpu.yaml, --num_processes, 2, -m, judgetrain.cli.judge, ...]

`judgetrain` looks its commands up here, `judgetrain train` builds its `accelerate launch` here and waits for the run
with `launch_and_wait`, and the loop starts each stage's command here, the same way a user would type it. The table
names each command's module as a string: nothing below the CLI imports it.
"""

# Late imports: judgetrain.run (its checkpoints module, inside launch_and_wait): `judgetrain --help` reads the table without it.

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from judgetrain.utils.device import has_accelerator
from judgetrain.run.state import LAUNCH_ID_ENV, launch_exit_code, wait_for_launch

logger = logging.getLogger(__name__)


class Command(NamedTuple):
    """A `judgetrain` command: its module (with a ``main(argv)``) and its one line of help."""

    module: str
    help: str


# name -> command. A nested command (``data check``) is listed with a space.
COMMANDS = {
    "train": Command("judgetrain.cli.train", "launch a training recipe through accelerate (or --dry-run it here)"),
    "eval": Command("judgetrain.cli.eval", "score a model or checkpoint(s) on the eval suites"),
    "report": Command("judgetrain.cli.report", "draw a run's metrics (heatmaps, curves, html)"),
    "compare": Command("judgetrain.cli.compare",
                       "two saved evaluations side by side: deltas, intervals, p over units"),
    "data check": Command("judgetrain.cli.data", "validate a dataset source and print its statistics"),
    "judge": Command("judgetrain.cli.judge",
                     "run judges over items: evaluations in the panel schema, resumable, sharded"),
    "perturb": Command("judgetrain.cli.perturb",
                       "perturb source samples by a spec into judge items: rule and model rewrites, checked"),
    "pairs build": Command("judgetrain.cli.pairs", "build direction-aware DPO pairs from a judge panel's evaluations"),
    "pairs known": Command("judgetrain.cli.pairs_known",
                           "build DPO pairs of known direction from perturb's items: source beats error copy"),
    "probe": Command("judgetrain.cli.probe", "what a base judge sees before training: source vs error copy vs rewrite, "
                     "every mode and a linear probe"),
    "loop": Command("judgetrain.cli.loop",
                    "rounds of perturb, judge, pairs, DPO from the last adapter and eval against the base, resumable"),
    "bench": Command("judgetrain.cli.bench", "benchmark training and evaluation against baselines"),
    "memory check": Command("judgetrain.cli.memory", "measure a DPO step's peak memory on this CPU beside the estimate"),
    "status": Command("judgetrain.cli.status",
                      "how a run stands (running, finished, stopped, failed) by its folder; --verify"),
    "tiny build": Command("judgetrain.cli.tiny", "build the embedded tiny judge into a model directory"),
    "serve": Command("judgetrain.cli.serve", "a trained judge as a reward over HTTP (OpenRLHF's remote reward format)"),
    "cache": Command("judgetrain.cli.cache", "list or clear the models judgetrain built into its cache"),
}
# The commands whose module runs on several processes under `accelerate launch` (`judgetrain train` launches its own).
SEVERAL_PROCESSES = ("perturb", "judge", "eval")


def find_command(argv: list[str]) -> tuple[str, list[str]] | None:
    """(the command's name, the rest of argv) for a `judgetrain` argv, two-word names first; None when argv names
    no command."""
    for n_words in (2, 1):
        name = " ".join(argv[:n_words])
        if len(argv) >= n_words and name in COMMANDS:
            return name, list(argv[n_words:])
    return None


@dataclass(frozen=True)
class Launch:
    """How a command's processes are started: ``num_processes`` and an accelerate config file (None: accelerate's
    defaults)."""

    num_processes: int | None = None
    accelerate_config: str | None = None

    @property
    def accelerated(self) -> bool:
        return bool(self.accelerate_config) or (self.num_processes or 1) > 1


def accelerate_argv(module: str, args: list[str], launch: Launch) -> list[str]:
    """``accelerate launch [--config_file C] [--num_processes N] [--num_cpu_threads_per_process T] -m MODULE ARGS``
    with this interpreter (T: `cpu_threads`)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if launch.accelerate_config:
        cmd += ["--config_file", launch.accelerate_config]
    if launch.num_processes:
        cmd += ["--num_processes", str(launch.num_processes)]
    threads = cpu_threads(launch)
    if threads is not None:
        cmd += ["--num_cpu_threads_per_process", str(threads)]
    return cmd + ["-m", module, *args]


def cpu_threads(launch: Launch) -> int | None:
    """Threads per process for a launch on a machine without an accelerator, or None to leave it to accelerate.

    `accelerate launch` without ``--cpu`` or a config sets ``OMP_NUM_THREADS=1`` in each process: on a machine of CPUs
    alone one training process would use one core of all it has (measured: a SmolLM2-135M LoRA DPO step of 8 pairs
    2.1x slower on 2 cores). judgetrain gives each process its share of the cores it may run on instead, and says
    so. None where ``OMP_NUM_THREADS`` is set (the user chose), a config file names the launch (its own settings
    hold), or an accelerator is visible (one thread per process is right beside a GPU)."""
    if launch.accelerate_config or os.environ.get("OMP_NUM_THREADS") or has_accelerator():
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // max(1, launch.num_processes or 1))
    logger.info("accelerate launch on CPUs alone: %d thread(s) per process for %d core(s) (accelerate's default "
                "is one thread a process here; set OMP_NUM_THREADS to choose)", threads, cores)
    return threads


def command_argv(argv: list[str], launch: Launch = Launch()) -> list[str]:
    """The child process's argv of ``judgetrain ARGV``: `accelerate launch` of the command's module when ``launch``
    asks for it and the command runs on several processes, else ``python -m judgetrain.cli ARGV``."""
    found = find_command(argv)
    if found is None:
        raise ValueError(f"not a judgetrain command: {' '.join(argv[:2])!r} (known: {', '.join(COMMANDS)})")
    name, rest = found
    if launch.accelerated and name in SEVERAL_PROCESSES:
        return accelerate_argv(COMMANDS[name].module, rest, launch)
    return [sys.executable, "-m", "judgetrain.cli", *argv]


def launch_and_wait(cmd: list[str], output_dir: Path) -> int:
    """Run the launcher and exit with the *run's* code: `accelerate launch` turns any worker failure into 1, and its
    one-process launcher returns as soon as a SIGTERM kills it, while the training process (parent-death signal) is
    still saving its checkpoint. So a SIGTERM is passed on to the launcher and then the training process is waited
    for; the code comes from the status line the run wrote for this launch (judgetrain.run.state)."""
    from judgetrain.run.checkpoints import STOP_WINDOW_S  # the stop window, which the stop checkpoint's marker fits

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
        code = 128 - code if code < 0 else code  # killed by a signal: the shell's 128 + N
        if signalled:
            wait_for_launch(output_dir, launch_id)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return launch_exit_code(output_dir, launch_id, code)
