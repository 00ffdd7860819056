"""`judgetrain report RUN_DIR [RUN_DIR ...]`: a run's (or several runs') metrics as figures, HTML and Markdown
(judgetrain.report.build), and their summary tables in the terminal."""

# Late imports: rich (inside the functions that use them): each command loads only what it runs, so `judgetrain
# --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from judgetrain.cli.args import ConventionParser, console, refuse_file
from judgetrain.report.build import (SUMMARY_HEADER, NothingToReport, build_report, cmp_cell, cmp_label, fmt_epoch,
                                     summary_cells)
from judgetrain.report.build import __doc__ as _LIBRARY_DOC
from judgetrain.report.headline import headline, headline_note, headline_table
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)


def _print_tables(result: Mapping[str, Any]) -> None:
    from rich.table import Table

    out = console()
    runs = result["runs"]
    for run in runs:  # the headline first: the figures the model card shows
        head = headline(run.records, run.recipe)
        if head is not None:
            header, rows = headline_table(head)
            table = Table(title=f"{run.name}: headline", caption=headline_note(head))
            for i, h in enumerate(header):
                table.add_column(h, justify="left" if i == 0 else "right", style="cyan" if i == 0 else None)
            for row in rows:
                table.add_row(*row)
            out.print(table)
    for info in result["infos"]:
        out.print(f"[bold]{info['name']}[/bold]: {info['status']}; last step {info['last_step']}, epoch "
                      f"{fmt_epoch(info['last_epoch'])}, {len(info['eval_points'])} eval point(s)")
    if len(runs) > 1 and result["comparison"]:
        table = Table(title="last eval (best @ epoch)")
        table.add_column("metric", style="cyan", no_wrap=True)
        for run in runs:
            table.add_column(run.name, justify="right")
        table.add_column("better")
        for row in result["comparison"]:
            table.add_row(cmp_label(row), *[cmp_cell(row["runs"].get(run.name)) for run in runs], row["better"])
        out.print(table)
    else:
        for run in runs:
            rows = result["tables"][run.name]
            if not rows:
                out.print(f"{run.name}: no evaluation logged yet")
                continue
            table = Table(title=f"{run.name}: last eval and best epoch")
            for i, h in enumerate(SUMMARY_HEADER):
                table.add_column(h, justify="left" if i in (0, 7) else "right", style="cyan" if i == 0 else None,
                                 no_wrap=i == 0)
            for row in rows:
                table.add_row(*summary_cells(row))
            out.print(table)
    out.print(f"report: {result['paths']['report.html']}  ({len(result['paths'])} files)")


def build_parser() -> ConventionParser:
    parser = ConventionParser(prog="judgetrain report", description=_LIBRARY_DOC.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run output directories (one or more)")
    parser.add_argument("--output_dir", "--out", default=None, help="where to write (default: RUN_DIR/report for one run, "
                                                    "./judgetrain_report for several)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    missing = [d for d in args.run_dirs if not Path(d).is_dir()]
    if missing:
        raise BadInputError(f"not a run directory: {', '.join(missing)}")
    try:
        refuse_file(args.output_dir or ".")
        result = build_report(args.run_dirs, args.output_dir)
    except (NothingToReport, ValueError) as err:
        raise BadInputError(str(err)) from err
    _print_tables(result)
    return 0

