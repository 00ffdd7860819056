"""The `judgetrain` console script: one subcommand per job, each a module of this package with a `main(argv)` that
turns argv into library calls and an exit code (the command table: judgetrain.run.launch.COMMANDS). Bad input
(judgetrain.utils.errors.BadInputError and its subclasses) raised by a command is caught here, once: one line naming
the command, exit code 2. Nothing outside judgetrain.cli imports it."""

from __future__ import annotations

import difflib
import importlib
import sys

from judgetrain import __version__
from judgetrain.run.launch import COMMANDS, find_command
from judgetrain.run.state import EXIT_BAD_INPUT
from judgetrain.utils.errors import BadInputError


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
    found = find_command(argv)
    if found is not None:
        return run_command(*found)
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


def run_command(name: str, argv: list[str]) -> int:
    """Command ``name``'s exit code for ``argv``; its bad input (`BadInputError`) is one line on stderr naming the
    command, exit code 2."""
    module = importlib.import_module(COMMANDS[name].module)
    try:
        return int(module.main(argv) or 0)
    except BadInputError as err:
        print(f"judgetrain {name}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
