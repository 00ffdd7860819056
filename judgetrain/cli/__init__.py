"""The `judgetrain` console script: one subcommand per job, each implemented by its own module's `main(argv)`."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, help). A nested command (``data check``) is listed with a space.
COMMANDS = {
    "data check": ("judgetrain.data.check", "validate a dataset source and print its statistics"),
    "train": ("judgetrain.train", "launch a training recipe through accelerate"),
    "eval": ("judgetrain.cli.eval", "score a model or checkpoint(s) on the eval suites"),
    "report": ("judgetrain.report.build", "draw a run's metrics (heatmaps, curves, html)"),
    "pairs build": ("judgetrain.data.pairs", "build direction-aware DPO pairs from a judge panel's evaluations"),
    "bench": ("judgetrain.bench", "benchmark training and evaluation against baselines"),
    "tiny build": ("judgetrain.models.tiny", "build the embedded tiny judge into a model directory"),
    "cache": ("judgetrain.models.cache", "list or clear the models judgetrain built into its cache"),
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
        return 0 if argv else 2
    for n_words in (2, 1):
        name = " ".join(argv[:n_words])
        if name in COMMANDS:
            module = importlib.import_module(COMMANDS[name][0])
            return int(module.main(argv[n_words:]) or 0)
    print(f"judgetrain: unknown command {' '.join(argv[:2])!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
