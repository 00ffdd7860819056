"""`judgetrain report LOOP_DIR`: the report of a `judgetrain loop` output_dir, read as a loop, not as a training run.

    if is_loop_dir(path):
        result = build_loop_report(path, out_dir, run_report=make_report)   # {"paths": {...}, "loop": LoopView}

It opens with the round table of the headline figures (a row per figure of each suite's headline,
`judgetrain.eval.compare.HEADLINE`; a column per round from the base, round 0; each cell the figure with its 95%
interval and, after the base, the difference against the base with its interval and p), then the loop's status from
``loop_state.json`` (finished, or stopped in round k at stage s), the held-out set and the goal the config states,
a link to each round's training report (drawn into ``round-<k>/`` beside the page by ``run_report``, the run
report of `judgetrain.report.build`) and the round table's curves (``rounds.png``). The run folder's notes (no
recipe.yaml, no metrics.jsonl, no final model) are a training run's: a loop folder has none of those files and gets
none of those notes. Written: ``report.html`` (its image and links are files beside it), ``report.md``,
``summary.json``, ``rounds.png``, ``round-<k>/``.
"""

# Late imports: jinja2 (inside `_html`): the page's template library comes in with the page, as in
# judgetrain.report.build.

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from judgetrain.config.recipe import READINGS, TRAINED_MODE, read_modes
from judgetrain.eval.compare import HEADLINE as SUITE_HEADLINE
from judgetrain.eval.plots import DPI
from judgetrain.eval.rules import round_verdict
from judgetrain.report import rounds
from judgetrain.report.headline import fmt, with_interval
from judgetrain.run.layout import (HELDOUT_PAIRS, LOOP_LOG_FILE, LOOP_STATE_FILE, ROUND_TABLE, ROUND_TABLE_CSV,
                                   ROUND_TABLE_MD, round_folder)
from judgetrain.utils.errors import BadInputError

logger = logging.getLogger(__name__)

ROUND_TABLE_FILES = (ROUND_TABLE_MD, ROUND_TABLE_CSV, ROUND_TABLE)
RUN_REPORT_LOGGER = "judgetrain.report.build"  # the run report's logger: quiet while a round's report is drawn
STAGES = ("items", "split", "judge", "pairs", "train", "eval")  # a loop's stages in order (judge: where pairs need it)
CELL_NOTE = ("each cell: the figure with its 95% interval; from round 1 on, the difference against the base (round 0) "
             "with its 95% interval and p")


@dataclass
class LoopView:
    """What a loop folder says about itself, read once: its state, settings, status, round table and rounds."""

    path: Path
    name: str
    state: dict[str, Any]
    settings: dict[str, Any]
    status: str
    finished: bool
    rows: list[dict[str, Any]] = field(default_factory=list)  # rounds.json's rows
    split: dict[str, Any] = field(default_factory=dict)  # round-1/split/split.json
    heldout_pairs: int | None = None
    rounds: list[int] = field(default_factory=list)  # every round with a folder or a stage done


def is_loop_dir(path: str | Path) -> bool:
    """Whether ``path`` is a `judgetrain loop` output_dir (it holds the loop's state file)."""
    return (Path(path) / LOOP_STATE_FILE).is_file()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def loop_status(state: Mapping[str, Any], last_event: Mapping[str, Any] | None = None) -> tuple[str, bool]:
    """(the loop's status in one sentence, whether it finished) from its state file: finished when every stage of
    every round configured is done, else the first stage not done, "stopped in round k at stage s" (or still
    running it, when the stage log's last line is that stage's start)."""
    settings, done = state.get("settings") or {}, state.get("done") or {}
    seen = [int(key.split("/")[0]) for key in done if key.split("/")[0].isdigit()]
    total = settings.get("rounds") or max(seen, default=0)
    stages = list(state.get("stages") or [s for s in STAGES if any(key.endswith(f"/{s}") for key in done)])
    for k in range(1, int(total) + 1):
        for stage in stages:
            if f"{k}/{stage}" in done:
                continue
            running = bool(last_event) and last_event.get("event") == "start" and \
                (last_event.get("round"), last_event.get("stage")) == (k, stage)
            n_done = sum(f"{j}/{s}" in done for j in range(1, k + 1) for s in stages)
            return (f"stopped in round {k} of {total} at stage {stage}" + (" (or still running it)" if running else "")
                    + f": {n_done} of {int(total) * len(stages)} stages done; the same judgetrain loop command "
                    "continues from there", False)
    if not total:
        return "not started: no stage is done", False
    rounds_text = f"{int(total)} round{'s' if total != 1 else ''}"
    configured = "" if settings else " (the state file does not record the rounds configured: these are the rounds done)"
    return f"finished: every stage of the {rounds_text} done{configured}", True


def _last_event(path: Path) -> dict[str, Any] | None:
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def read_loop(path: str | Path, name: str | None = None) -> LoopView:
    """The loop folder at ``path`` read (see `LoopView`); `BadInputError` when its state file does not parse."""
    path = Path(path)
    state = _read_json(path / LOOP_STATE_FILE)
    if not state:
        raise BadInputError(f"{path / LOOP_STATE_FILE}: not a loop's state (JSON object expected)")
    status, finished = loop_status(state, _last_event(path / LOOP_LOG_FILE))
    done_rounds = {int(key.split("/")[0]) for key in state.get("done") or {} if key.split("/")[0].isdigit()}
    folders = {int(p.name.split("-", 1)[1]) for p in path.glob("round-*") if p.name.split("-", 1)[1].isdigit()}
    heldout = path / HELDOUT_PAIRS
    pairs = sum(1 for line in heldout.read_text(encoding="utf-8").splitlines() if line.strip()) \
        if heldout.is_file() else None
    return LoopView(path=path, name=name or path.resolve().name, state=state, settings=state.get("settings") or {},
                    status=status, finished=finished, rows=rounds.round_rows(path),
                    split=_read_json(path / round_folder(1) / "split" / "split.json"), heldout_pairs=pairs,
                    rounds=sorted(done_rounds | folders))


# ---------------------------------------------------------------------------------------------- the round table
def headline_figures(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The round table's figures that are their suite's headline figures, in the table's order, each named with its
    mode and reading (`judgetrain.report.rounds.row_label`)."""
    figures = {rounds.row_label(r): r["figure"] for r in rows}
    return [label for label, f in figures.items()
            if rounds.figure_parts(f)[2] in SUITE_HEADLINE.get(rounds.figure_parts(f)[0], ())]


def round_cell(row: Mapping[str, Any] | None) -> tuple[str, str]:
    """(the figure with its interval, the difference against the base with its interval and p, and the figure against
    the best rule that needs no judge (`judgetrain.eval.rules.round_verdict`); "" where neither is) of one round table
    row; ("-", "") when the round has no such figure."""
    if row is None:
        return "-", ""
    value = with_interval(row.get("value"), (row.get("ci_low"), row.get("ci_high")))
    said = [] if row.get("delta") is None else [
        f"difference {with_interval(row['delta'], (row.get('delta_ci_low'), row.get('delta_ci_high')))}, "
        f"p {fmt(row.get('p_value'))}"]
    beside = round_verdict(row)
    return value, "; ".join(said + ([beside] if beside else []))


def round_table(view: LoopView) -> tuple[list[str], list[dict[str, Any]]]:
    """(header, rows) of the headline round table: a row per headline figure, ``{"figure", "cells": [(value,
    difference), ...]}``, a cell per round from the base."""
    numbers = sorted({r["round"] for r in view.rows})
    by = {(rounds.row_label(r), r["round"]): r for r in view.rows}
    header = ["figure (mode: reading)", *("base (round 0)" if k == 0 else f"round {k}" for k in numbers)]
    return header, [{"figure": f, "cells": [round_cell(by.get((f, k))) for k in numbers]}
                    for f in headline_figures(view.rows)]


def round_table_text(view: LoopView) -> str:
    """The headline round table as fixed-width text, for the log: a line per figure, a column per round."""
    header, table = round_table(view)
    if not table:
        return "no round has been evaluated yet: no round table"
    lines = [header, *([row["figure"], *(f"{v}; {d}" if d else v for v, d in row["cells"])] for row in table)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


# ---------------------------------------------------------------------------------------------- the other sections
def heldout_lines(view: LoopView) -> list[str]:
    """What was held out of training and scored every round, from the config and round 1's split."""
    held = view.settings.get("heldout") or {}
    split = view.split
    lines = []
    if held:
        types = ", ".join(held.get("types") or []) or "none"
        lines.append(f"Configured: a fraction {held.get('fraction')} of the samples (seed {held.get('seed')}) and "
                     f"every item of the perturbation types: {types}.")
    if split:
        lines.append(f"Round 1's split: {split.get('heldout_items')} items held out ({len(split.get('heldout_samples') or [])} "
                     f"samples), {split.get('train_items')} items to train on.")
    if split and split.get("shortcuts"):
        lines.append(shortcut_line(split["shortcuts"]))
    if view.heldout_pairs is not None:
        lines.append(f"Held-out pairs scored every round ({HELDOUT_PAIRS}): {view.heldout_pairs}.")
    return lines or ["No held-out set is recorded yet (round 1's split stage has not run)."]


def shortcut_line(shortcuts: dict[str, Any]) -> str:
    """Round 1's training error copies against the rules with no judge: the highest figure, and those let through
    past the limit (`judgetrain loop --allow_shortcuts`)."""
    figures = [(acc, rule, key) for key, f in shortcuts["types"].items() for rule, acc in f["rules"].items()]
    if not figures:
        return "Round 1's training set holds no error copy for the rules with no judge to read."
    acc, rule, key = max(figures)
    allowed = shortcuts.get("allowed") or []
    return (f"Round 1's training error copies against their sources, by a rule with no judge: at most {acc:.3f} "
            f"({rule} on {key}; limit {shortcuts['limit']}); "
            + (f"{len(allowed)} figure(s) above the limit trained anyway (--allow_shortcuts): "
               + ", ".join(f"{a['rule']} {a['accuracy']:.3f} on {a['type']}" for a in allowed) + "."
               if allowed else "none above the limit."))


def goal_lines(view: LoopView) -> list[str]:
    """The goal the config states, and what each round is scored on against the base."""
    settings = view.settings
    if not settings:
        return ["The state file does not record the loop's config (a loop started by an earlier judgetrain): no "
                "goal to show."]
    lines = [f"Goal: {settings['goal']}" if settings.get("goal") else
             "The config states no goal (goal: a sentence saying what the loop is for)."]
    ev = settings.get("eval") or {}
    modes = read_modes(ev.get("scoring") or [])  # implicit brings the likelihood readings along
    scored = (f"Each round is scored against the base ({settings.get('model')}) on the suites "
              f"{', '.join(ev.get('suites') or [])} in the modes {', '.join(modes)}")
    margin = (ev.get("options") or {}).get("eval_regression_margin")
    lines.append(scored + (f"; a figure is worse than the base only beyond {margin}." if margin is not None else "."))
    form = view.state.get("trained_form")
    if form and (settings.get("pairs") or {}).get("form") == "response":
        mode = TRAINED_MODE[form]
        lines.append(f"Trained form: {form}, which trains the {mode} reading ({READINGS[mode]}): the figures under "
                     "that reading are the ones training moved on purpose.")
    return lines


def round_entries(view: LoopView, out: Path, run_report: Callable | None) -> list[dict[str, Any]]:
    """Per round: its stages done, and its training report (drawn into ``out/round-<k>/`` by ``run_report``), as
    ``{"round", "stages", "report": relative link or None, "why": why there is none}``."""
    done = view.state.get("done") or {}
    stages = view.state.get("stages") or list(STAGES)
    entries = []
    for k in view.rounds:
        entry = {"round": k, "stages": ", ".join(s for s in stages if f"{k}/{s}" in done) or "none",
                 "report": None, "why": ""}
        train = view.path / round_folder(k) / "train"
        if run_report is None:
            entry["why"] = "not drawn"
        elif not (train / "metrics.jsonl").is_file():
            entry["why"] = "not trained yet"
        else:
            try:
                with _quiet(RUN_REPORT_LOGGER):  # a round's notes (no evaluation: the loop's eval stage scores it)
                    run_report([train], out / f"round-{k}")  # stay on its page, out of the loop's log
                entry["report"] = f"round-{k}/report.html"
            except (BadInputError, ValueError) as err:
                entry["why"] = str(err)
        entries.append(entry)
    return entries


@contextlib.contextmanager
def _quiet(name: str):
    """The logger ``name`` says only errors inside the block."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _link(target: Path, out: Path) -> str:
    """``target`` as a link from a page in ``out``."""
    return Path(os.path.relpath(target.resolve(), out.resolve())).as_posix()


# ---------------------------------------------------------------------------------------------- the pages
def page_sections(view: LoopView, out: Path, entries: list[dict[str, Any]], figure: str | None,
                  heldout_figure: str | None = None) -> dict[str, Any]:
    """Everything both pages show, as text: the status, the round table, the held-out pairs drawn, held-out set,
    goal, rounds, figure."""
    header, table = round_table(view)
    links = {name: _link(view.path / name, out) for name in ROUND_TABLE_FILES if (view.path / name).is_file()}
    return {"name": view.name, "status": view.status, "finished": view.finished, "header": header, "table": table,
            "cell_note": CELL_NOTE, "round_files": links, "heldout": heldout_lines(view), "goal": goal_lines(view),
            "rounds": entries, "figure": figure, "figure_caption": rounds.CAPTION,
            "heldout_figure": heldout_figure, "heldout_caption": rounds.HELDOUT_CAPTION}


def _md(page: Mapping[str, Any]) -> str:
    """report.md of the loop (see the module doc)."""
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [f"# judgetrain report: loop {page['name']}", "", f"**Status: {page['status']}.**", "",
             "## Rounds against the base", "", page["cell_note"] + ".", ""]
    if page["table"]:
        lines += [row(page["header"]), "|" + "---|" * len(page["header"])]
        lines += [row([r["figure"], *(f"{v}; {d}" if d else v for v, d in r["cells"])]) for r in page["table"]]
    else:
        lines.append("No round has been evaluated yet.")
    if page["heldout_figure"]:
        lines += ["", f"![{page['heldout_caption']}]({page['heldout_figure']})", "", page["heldout_caption"] + "."]
    if page["round_files"]:
        lines += ["", "Every figure, not only the headline ones: " + ", ".join(
            f"[{name}]({link})" for name, link in page["round_files"].items()) + "."]
    lines += ["", "## Held out", "", *(f"- {line}" for line in page["heldout"]), "", "## Goal", "",
              *(f"- {line}" for line in page["goal"]), "", "## Rounds", "",
              row(["round", "stages done", "training report"]), "|---|---|---|"]
    lines += [row([str(e["round"]), e["stages"], f"[round-{e['round']}]({e['report']})" if e["report"] else e["why"]])
              for e in page["rounds"]]
    if page["figure"]:
        lines += ["", f"![{page['figure_caption']}]({page['figure']})", "", page["figure_caption"] + "."]
    return "\n".join(lines) + "\n"


def _html(page: Mapping[str, Any]) -> str:
    """report.html of the loop, from templates/loop.html (autoescaped)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("judgetrain.report", "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template("loop.html").render(**page)


def build_loop_report(path: str | Path, out_dir: str | Path | None = None, *,
                      run_report: Callable | None = None) -> dict[str, Any]:
    """Write the loop's report (see the module doc) into ``out_dir`` (default ``<path>/report``). ``run_report``:
    draws a training run's report (``run_report([run_dir], out_dir)``), for each round's. Returns ``{"paths":
    {file name: path}, "loop": LoopView}`` and, empty, the keys a run report's result has."""
    view = read_loop(path)
    out = Path(out_dir) if out_dir is not None else view.path / "report"
    out.mkdir(parents=True, exist_ok=True)
    logger.info("%s: a `judgetrain loop` folder, %s\n%s", view.name, view.status, round_table_text(view))
    written: dict[str, Path] = {}
    held = rounds.heldout_figure(view.rows, TRAINED_MODE.get(view.state.get("trained_form") or "log_ratio"),
                                 (view.settings.get("heldout") or {}).get("types") or ())
    if held is not None:
        _save_figure(held[0], out / "heldout.png")
        written["heldout.png"] = out / "heldout.png"
    fig = rounds.round_table_figure([view.path])
    if fig is not None:
        _save_figure(fig, out / "rounds.png")
        written["rounds.png"] = out / "rounds.png"
    entries = round_entries(view, out, run_report)
    page = page_sections(view, out, entries, "rounds.png" if "rounds.png" in written else None,
                         "heldout.png" if "heldout.png" in written else None)
    summary = {"loop": view.name, "status": view.status, "finished": view.finished,
               "table": {"header": page["header"], "rows": page["table"]}, "heldout": page["heldout"],
               "goal": page["goal"], "rounds": entries}
    files = {"summary.json": json.dumps(summary, indent=1), "report.md": _md(page), "report.html": _html(page)}
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        written[name] = out / name
    logger.info("report of loop %s written to %s", view.name, out)
    return {"paths": written, "loop": view, "runs": [], "tables": {}, "comparison": [], "infos": []}


def _save_figure(fig, path: Path) -> None:
    fig.savefig(path, dpi=DPI, format="png")  # a matplotlib Figure without pyplot: nothing to close
