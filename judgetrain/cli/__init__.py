"""The `judgetrain` console script: one subcommand per job, each a module of this package with a `main(argv)` that
turns argv into library calls and an exit code. Nothing outside judgetrain.cli imports it."""

from __future__ import annotations

import importlib
import sys

from judgetrain.run.state import EXIT_BAD_INPUT

# subcommand -> (module, help). A nested command (``data check``) is listed with a space.
COMMANDS = {
    "train": ("judgetrain.cli.train", "launch a training recipe through accelerate (or --dry-run it here)"),
    "eval": ("judgetrain.cli.eval", "score a model or checkpoint(s) on the eval suites"),
    "report": ("judgetrain.cli.report", "draw a run's metrics (heatmaps, curves, html)"),
    "compare": ("judgetrain.cli.compare", "two saved evaluations side by side: deltas, intervals, p over units"),
    "data check": ("judgetrain.cli.data", "validate a dataset source and print its statistics"),
    "judge": ("judgetrain.cli.judge", "run judges over items: evaluations in the panel schema, resumable, sharded"),
    "perturb": ("judgetrain.cli.perturb", "perturb source samples by a spec into judge items: rule and model rewrites, checked"),
    "pairs build": ("judgetrain.cli.pairs", "build direction-aware DPO pairs from a judge panel's evaluations"),
    "pairs known": ("judgetrain.cli.pairs_known", "build DPO pairs of known direction from perturb's items: source beats error copy"),
    "loop": ("judgetrain.cli.loop", "rounds of perturb, judge, pairs, DPO from the last adapter and eval against the base, resumable"),
    "bench": ("judgetrain.cli.bench", "benchmark training and evaluation against baselines"),
    "memory check": ("judgetrain.cli.memory", "measure a DPO step's peak memory on this CPU beside the estimate"),
    "status": ("judgetrain.cli.status", "print the exit code a launch wrote to its output_dir (scheduler scripts)"),
    "tiny build": ("judgetrain.cli.tiny", "build the embedded tiny judge into a model directory"),
    "cache": ("judgetrain.cli.cache", "list or clear the models judgetrain built into its cache"),
}


def _usage() -> str:
    lines = ["usage: judgetrain COMMAND [args...]", "", "commands:"]
    width = max(len(name) for name in COMMANDS)
    for name, (_, text) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {text}")
    lines.append("")
    lines.append("Run `judgetrain COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if argv else EXIT_BAD_INPUT
    for n_words in (2, 1):
        name = " ".join(argv[:n_words])
        if name in COMMANDS:
            module = importlib.import_module(COMMANDS[name][0])
            return int(module.main(argv[n_words:]) or 0)
    print(f"judgetrain: unknown command {' '.join(argv[:2])!r}\n\n{_usage()}", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
