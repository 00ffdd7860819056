"""The command-line conventions every `judgetrain` command shares, those of `HfArgumentParser` / `TrlParser`:

- an option is written with underscores in the help and the docs (``--output_dir``) and taken with hyphens too
  (``--output-dir``); an older name of an option (``--out``, ``--rejects``) still works, and the help shows only the
  current one;
- a mistake on the command line is one line on stderr and exit code 2: ``unknown option --ouput_dir; did you mean
  --output_dir?``, a missing required option, a refused value (`ConventionParser.error`);
- a command's tables keep their words (`console`): the terminal's width at a terminal, and in a file or a pipe a
  width that fits the widest table, so no key or model name is cut.
"""

# Late imports: rich (inside `console`): a command's --help and its refusals answer without it.

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from judgetrain.config.recipe import did_you_mean
from judgetrain.run.state import EXIT_BAD_INPUT


def canonical(option: str) -> str:
    """``--output-dir`` -> ``--output_dir``: the spelling the help and the docs show (a short flag stays)."""
    return "--" + option[2:].replace("-", "_") if option.startswith("--") else option


def settle(parser: argparse.ArgumentParser) -> None:
    """Each option of ``parser`` shown by its canonical spelling alone (the help, the usage, argparse's own messages)
    and registered under it (an option declared as ``--score-key`` then also answers to ``--score_key``); its other
    spellings stay registered, as aliases."""
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs:
            continue
        name = canonical(longs[0])
        parser._option_string_actions.setdefault(name, action)
        action.option_strings = [*[s for s in action.option_strings if not s.startswith("--")], name]


def normalise(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--output-dir x`` -> ``--output_dir x`` (``=value`` kept) wherever the hyphenated form is not itself an option
    of ``parser``; everything after a bare ``--`` is left as it is."""
    known = parser._option_string_actions
    out, rest = [], False
    for token in argv:
        if not rest and token == "--":
            rest = True
        elif not rest and token.startswith("--") and token.split("=", 1)[0] not in known:
            name, eq, value = token.partition("=")
            if canonical(name) in known:
                token = canonical(name) + eq + value
        out.append(token)
    return out


def unknown_message(parser: argparse.ArgumentParser, extras: list[str], renamed: dict[str, str] | None = None) -> str:
    """``unknown option --ouput_dir; did you mean --output_dir?`` for the first unknown option of ``extras`` (an old
    name in ``renamed``, without dashes, gives its new one), or the stray value when there is none."""
    token = next((t for t in extras if t.startswith("-")), None)
    if token is None:
        return f"unexpected argument {extras[0]!r} (options are written --name value)"
    valid = [canonical(o)[2:] for action in parser._actions for o in action.option_strings if o.startswith("--")]
    name = token.lstrip("-").split("=", 1)[0].replace("-", "_")
    return f"unknown option {token.split('=', 1)[0]}{did_you_mean(name, valid, flag=True, renamed=renamed or {})}"


def one_line_error(parser: argparse.ArgumentParser, message: str):
    """One line on stderr, exit code 2 (argparse would print the whole usage first)."""
    parser.exit(EXIT_BAD_INPUT, f"{parser.prog}: {message} (see {parser.prog} --help)\n")


def follow_conventions(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A parser of another class (`HfArgumentParser`: `judgetrain eval`) given the conventions' help and errors; its
    caller passes argv through `normalise` and reports extras with `unknown_message`."""
    settle(parser)
    parser.error = lambda message: one_line_error(parser, message)
    return parser


class ConventionParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` with judgetrain's conventions (the module's doc). ``renamed`` maps an option's
    old name (without dashes) to its new one, for the hint after an unknown option."""

    def __init__(self, *args, renamed: dict[str, str] | None = None, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --out must not silently mean --output_dir_something
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.renamed = dict(renamed or {})

    def parse_known_args(self, args=None, namespace=None):
        settle(self)
        args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(normalise(self, args), namespace)

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unknown_message(self, extras, self.renamed))
        return namespace

    def format_usage(self) -> str:
        settle(self)
        return super().format_usage()

    def format_help(self) -> str:
        settle(self)
        return super().format_help()

    def error(self, message: str):
        one_line_error(self, message)


def refuse_file(path, option: str = "--output_dir") -> None:
    """ValueError (one line) when the folder a command writes into is an existing file."""
    if Path(path).exists() and not Path(path).is_dir():
        raise ValueError(f"{option} {path}: a file, not a folder; name a folder (made if missing)")


def is_count(key: str) -> bool:
    """A figure's key that names a count (``eval/rmbench/n_rows``, ``.../n``, ``tokens_generated``)."""
    last = str(key).rsplit("/", 1)[-1]
    return last == "n" or last.startswith("n_") or last.endswith(("_rows", "_count")) or last == "tokens_generated"


def figure_cell(key: str, value) -> str:
    """A figure as a table shows it: a count as an integer (``96``, not ``96.0000``), another number to 4 places."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or (is_count(key) and float(value).is_integer()):
        return f"{int(value):,}"
    return f"{value:.4f}"


def console():
    """A rich Console for a command's tables: the terminal's width at a terminal; in a file or a pipe a width no
    table reaches, so every cell keeps its words (rich does not pad a table to the console's width)."""
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=100_000)
