"""The round table of a `judgetrain loop` output_dir drawn for `judgetrain report`: each figure per round (round 0:
the base) with its 95% interval, read from ``rounds.json`` (the rows `judgetrain.loop.table` writes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from judgetrain.config.recipe import named_figure
from judgetrain.eval.plots import figure_grid
from judgetrain.run.layout import ROUND_TABLE

CAPTION = ("Rounds of the loop: each figure per round against the base (round 0), with its 95% interval; the "
           "table's differences, their intervals and p are in rounds.md")
MAX_PANELS = 12


def round_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``<run_dir>/rounds.json``; [] when the folder holds no loop's table."""
    path = Path(run_dir) / ROUND_TABLE
    if not path.is_file():
        return []
    return list(json.loads(path.read_text(encoding="utf-8")).get("rows") or [])


def row_label(row: Mapping[str, Any]) -> str:
    """A round table row's figure with its mode and reading (`judgetrain.config.recipe.named_figure`): the line or
    panel it is shown in, so that a round's figure and the base's share one only when they share a reading (the
    base's implicit figures are its log-likelihood: a line of their own)."""
    return named_figure(row["figure"], row.get("mode"), row.get("reading"))


def round_table_figure(run_dirs: Sequence[Path]):
    """A panel per figure (the first `MAX_PANELS`), a line per loop: value against round with its interval; None
    when no run holds a round table."""
    tables = [(Path(d).name, round_rows(d)) for d in run_dirs]
    tables = [(name, rows) for name, rows in tables if rows]
    if not tables:
        return None
    figures = list(dict.fromkeys(row_label(r) for _, rows in tables for r in rows))[:MAX_PANELS]
    fig, axes = figure_grid(len(figures))
    for ax, figure in zip(axes, figures):
        for name, rows in tables:
            mine = sorted((r for r in rows if row_label(r) == figure), key=lambda r: r["round"])
            x = [r["round"] for r in mine]
            y = [r["value"] for r in mine]
            low = [r["value"] - r["ci_low"] if r["ci_low"] is not None else 0.0 for r in mine]
            high = [r["ci_high"] - r["value"] if r["ci_high"] is not None else 0.0 for r in mine]
            ax.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, label=name)
        ax.set_title(figure, fontsize=9)
        ax.set_xlabel("round (0 = base)")
        ax.set_xticks(sorted({r["round"] for _, rows in tables for r in rows}))
        if len(tables) > 1:
            ax.legend(fontsize=7)
    return fig
