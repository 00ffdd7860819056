"""The `judgetrain` console script: one subcommand per job, each a module of this package with a `main(argv)` that
turns argv into library calls and an exit code. Nothing outside judgetrain.cli imports it."""

from __future__ import annotations

import difflib
import importlib
import sys

from judgetrain import __version__
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
    "status": ("judgetrain.cli.status", "how a run stands (running, finished, stopped, failed) by its folder; --verify"),
    "tiny build": ("judgetrain.cli.tiny", "build the embedded tiny judge into a model directory"),
    "serve": ("judgetrain.cli.serve", "a trained judge as a reward over HTTP (OpenRLHF's remote reward format)"),
    "cache": ("judgetrain.cli.cache", "list or clear the models judgetrain built into its cache"),
}


def _usage(group: str | None = None) -> str:
    """The commands (those of ``group``, the first word of a two-word command, when given) with their one line."""
    names = {name: text for name, (_, text) in COMMANDS.items() if group is None or name.split()[0] == group}
    lines = [f"usage: judgetrain {group + ' ' if group else ''}COMMAND [args...]", "", "commands:"]
    width = max(len(name) for name in names)
    for name, text in names.items():
        lines.append(f"  {name.ljust(width)}  {text}")
    lines.append("")
    lines.append("Run `judgetrain COMMAND --help` for a command's options; `judgetrain --version` for the version.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if argv else EXIT_BAD_INPUT
    if argv[0] in {"-V", "--version"}:
        print(f"judgetrain {__version__}")
        return 0
    for n_words in (2, 1):
        name = " ".join(argv[:n_words])
        if name in COMMANDS:
            module = importlib.import_module(COMMANDS[name][0])
            return int(module.main(argv[n_words:]) or 0)
    groups = {name.split()[0] for name in COMMANDS if " " in name}
    if argv[0] in groups:  # `judgetrain data`, `judgetrain data --help`: the group's commands
        asked = argv[1:2] in ([], ["-h"], ["--help"])
        if not asked:
            print(f"judgetrain {argv[0]}: unknown command {argv[1]!r}; the {argv[0]} commands: "
                  f"{', '.join(n for n in COMMANDS if n.split()[0] == argv[0])}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(_usage(argv[0]))
        return 0 if argv[1:] else EXIT_BAD_INPUT
    near = difflib.get_close_matches(argv[0], [n.split()[0] for n in COMMANDS], n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    print(f"judgetrain: unknown command {argv[0]!r}{hint} (see judgetrain --help)", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
