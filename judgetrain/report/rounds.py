"""The round table of a `judgetrain loop` output_dir drawn for `judgetrain report`: each figure per round (round 0:
the base) with its 95% interval, read from ``rounds.json`` (the rows `judgetrain.loop.table` writes)."""

# Late imports: matplotlib (inside `heldout_figure`): the plotting library comes in with the figure, as in
# judgetrain.eval.plots.

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from judgetrain.config.recipe import SCORING_MODES, mode_label, named_figure
from judgetrain.eval.plots import DPI, figure_grid
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


def interval_errors(rows: Sequence[Mapping[str, Any]]) -> list[list[float]]:
    """[below, above]: each row's 95% interval as matplotlib's error bars take it (0 where a bound is missing)."""
    return [[r["value"] - r["ci_low"] if r.get("ci_low") is not None else 0.0 for r in rows],
            [r["ci_high"] - r["value"] if r.get("ci_high") is not None else 0.0 for r in rows]]


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
            ax.errorbar(x, y, yerr=interval_errors(mine), marker="o", capsize=3, label=name)
        ax.set_title(figure, fontsize=9)
        ax.set_xlabel("round (0 = base)")
        ax.set_xticks(sorted({r["round"] for _, rows in tables for r in rows}))
        if len(tables) > 1:
            ax.legend(fontsize=7)
    return fig


HELDOUT_CAPTION = ("Held-out pairs, the base against the last round under one reading: each error type's share of "
                   "pairs with the source above its error copy, with its 95% interval; x: the best rule that needs no "
                   "judge on the same pairs")
READING_ORDER = ("loglik_sum", "loglik_mean", "verdict", "judge", "generate")  # after the trained reading: a log-ratio
# judge's own summed likelihood is the base's plus its implicit reward


def figure_parts(figure: str) -> tuple[str, str | None, str]:
    """(suite, mode or None for the suite's recorded mode, metric) of a round table figure, ``<suite>[/<mode>]/
    <metric>``."""
    suite, _, rest = figure.partition("/")
    mode, _, metric = rest.partition("/")
    return (suite, mode, metric) if mode in SCORING_MODES and metric else (suite, None, rest)


def bare_figure(row: Mapping[str, Any]) -> str:
    """A round table row's figure without its mode (``pairwise/loglik_mean/accuracy`` -> ``pairwise/accuracy``): a
    mode other than the evaluation's first is named inside the figure (`figure_parts`)."""
    suite, _, metric = figure_parts(row["figure"])
    return f"{suite}/{metric}"


def shared_mode(rows: Sequence[Mapping[str, Any]], last: int, trained_mode: str | None = None) -> str | None:
    """The mode the base (round 0) and round ``last`` are read alike in on the held-out pairs (their
    ``pairwise/accuracy`` rows name one reading): ``trained_mode`` where they are, else the first of `READING_ORDER`;
    None where they share none."""
    readings = {(r["round"], r.get("mode")): r.get("reading") for r in rows if bare_figure(r) == "pairwise/accuracy"}
    shared = [mode for (k, mode), reading in readings.items()
              if k == last and mode is not None and readings.get((0, mode)) == reading]
    for mode in (trained_mode, *READING_ORDER):
        if mode in shared:
            return mode
    return shared[0] if shared else None


def heldout_figure(rows: Sequence[Mapping[str, Any]], trained_mode: str | None = None,
                   heldout_types: Sequence[str] = ()):
    """The held-out pairs drawn, base against the last round, under the one reading `shared_mode` picks: a line per
    error type (``pairwise/<type>/accuracy``, the types held out whole first and marked) and one for all of them, each
    judge's figure with its 95% interval, the best rule that needs no judge marked on the same line (the figure less
    ``over_rule``). Returns (figure, mode) or None where no round after the base shares a reading with it."""
    rounds = sorted({r["round"] for r in rows})
    if len(rounds) < 2:
        return None
    last = rounds[-1]
    mode = shared_mode(rows, last, trained_mode)
    if mode is None:
        return None
    named = ((bare_figure(r), r) for r in rows if r.get("mode") == mode)
    mine = {(r["round"], f): r for f, r in named if f.startswith("pairwise/") and f.endswith("/accuracy")}
    types = sorted({f.split("/")[1] for _, f in mine if f.count("/") == 2},
                   key=lambda t: (t not in heldout_types, t))
    lines = [(f"{t} (held out whole)" if t in heldout_types else t, f"pairwise/{t}/accuracy") for t in types]
    lines = [(label, f) for label, f in lines + [("all held-out pairs", "pairwise/accuracy")]
             if (0, f) in mine and (last, f) in mine]
    if not lines:
        return None
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(7.5, 0.45 * len(lines) + 1.4), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for offset, k, name, color in ((0.18, 0, "base (round 0)", "#888888"), (-0.18, last, f"round {last}", "#1f77b4")):
        ys = [len(lines) - 1 - i + offset for i in range(len(lines))]
        rs = [mine[(k, f)] for _, f in lines]
        ax.errorbar([r["value"] for r in rs], ys, xerr=interval_errors(rs), fmt="o", color=color, capsize=3,
                    label=name)
    rule = [(len(lines) - 1 - i, r["value"] - r["over_rule"])
            for i, (_, f) in enumerate(lines) if (r := mine[(last, f)]).get("over_rule") is not None]
    if rule:
        ax.scatter([x for _, x in rule], [y for y, _ in rule], marker="x", color="#d62728", zorder=3,
                   label="best rule with no judge")
    ax.axvline(0.5, color="#cccccc", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(lines)), [label for label, _ in reversed(lines)], fontsize=8)
    ax.set_xlim(0, 1.02)
    reading = next((r.get("reading") for r in rows if r.get("mode") == mode and r["round"] == last), None)
    ax.set_xlabel(f"source above its error copy (share of pairs), read as {mode_label(mode, reading)}")
    ax.legend(fontsize=7, loc="lower left")
    return fig, mode
