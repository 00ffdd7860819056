"""Draw one or more runs: training and eval curves, each suite's own figures and style matrices, an offline HTML page.

    judgetrain report outputs/quickstart                       # -> outputs/quickstart/report/
    judgetrain report outputs/run_a outputs/run_b --output_dir cmp/   # overlaid figures + a comparison table

Reads what a run writes (docs/evaluation.md, "Where metrics go"): ``metrics.jsonl`` (a torn last line of a killed run
is ignored, a step logged twice after a resume keeps its later values, a run still going is drawn as far as it
got), ``eval/<step>/<suite>.jsonl`` (per-row scores: a suite's style matrices are recomputed from them by the suite,
`Suite.style_matrices`) and ``recipe.yaml``. Writes PNGs, ``report.html`` (images embedded, opens offline),
``report.md`` (images linked) and ``summary.json``; the CLI also prints the summary table. A run evaluated in
generate mode also gets, per suite, its last eval's figures in each mode side by side (`generated_tables`) and the
parse rate and agreement over its evals (``generate.png``). What is drawn of a suite is the suite's to say
(`Suite.curves`, `Suite.curve_plots`, `Suite.matrices`); the report draws it.

The heatmaps are drawn by `judgetrain.eval.plots` (also used by training).
"""

# Late imports: yaml, matplotlib, jinja2 (inside the functions that use them): `judgetrain report` draws without
# torch; the plotting and template libraries come in with the figures and pages.

from __future__ import annotations

import base64
import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from judgetrain.config.directions import direction, rank_score
from judgetrain.config.recipe import PROXY_MODES, SCORING_MODES  # a mode's own keys: eval/<suite>/<mode>/... (the bare mode: none)
from judgetrain.config.suites import registered, known_suites
from judgetrain.eval.benchmarks import Suite, SuiteFacts, get_suite
from judgetrain.eval.plots import DPI, figure_grid, matrices_figure
from judgetrain.eval.rules import is_rule_key
from judgetrain.report import rounds
from judgetrain.report.loop import build_loop_report, is_loop_dir
from judgetrain.report.headline import (AGAINST_BASE_HEADER, against_base, against_base_cells, against_base_lines,
                                        against_base_text, against_base_verdict, bare_mode, headline, headline_note,
                                        headline_table, shown)
from judgetrain.run.checkpoints import list_checkpoints
from judgetrain.utils.errors import BadInputError, MissingFileError

logger = logging.getLogger(__name__)

LINESTYLES = ("-", "--", ":", "-.")
TRAIN_KEYS = (
    ("train/loss", "train loss"),
    ("train/rewards/margins", "reward margin (chosen - rejected)"),
    ("train/rewards/accuracies", "reward accuracy"),
)
METRIC_RANK = {"hard_acc": 0, "normal_acc": 1, "easy_acc": 2, "avg_acc": 3, "total_avg_acc": 3, "style_gap": 4,
               "accuracy": 0, "margin": 1, "detect_rate": 2, "anchor_mae": 3, "position_consistency": 1}
# engine counters and timings logged under eval/: not quality metrics, kept out of tables and curves
# the figures of a suite's table of proxies beside what the judge writes, in reading order
GENERATED_FIGURES = SuiteFacts("generate_table")  # per suite: its figures beside what the judge writes


def suite_rank() -> dict[str, int]:
    """{suite: its place} of the suites whose curves the report draws in panels of their own (`Suite.curves`), in the
    registry's order; any other suite's logged figures go to the panel of other eval metrics."""
    return {name: i for i, name in enumerate(n for n in known_suites() if getattr(registered(n), "curves", False))}


GENERATED_COMMON = ("parse_rate", "agreement", "stopped_rate", "mean_tokens", "n_generated")


# ------------------------------------------------------------------------------------------------ reading runs
@dataclass
class Run:
    """What a run directory holds, as far as it got."""

    path: Path
    name: str
    records: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> merged logging events
    eval_rows: dict[int, dict[str, list[dict]]] = field(default_factory=dict)  # step -> suite -> rows
    recipe: dict | None = None
    recipe_text: str | None = None
    notes: list[str] = field(default_factory=list)  # what was missing or repaired, for the reader

    @property
    def last_step(self) -> int | None:
        return max(self.records) if self.records else None

    def epoch_at(self, step: int) -> float | None:
        value = self.records.get(step, {}).get("epoch")
        return float(value) if _is_num(value) else None

    @property
    def status(self) -> str:
        if any((self.path / f).is_file() for f in ("adapter_model.safetensors", "model.safetensors",
                                                    "model.safetensors.index.json")):
            return "finished"
        return "in progress or stopped (no final model in the run dir)"


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# what json.loads raises on a damaged line: bad JSON, a number of over 4,300 digits, nesting past the recursion limit
_JSON_ERRORS = (ValueError, RecursionError)


def _salvage(line: str) -> Any:
    """The whole JSON object at the end of ``line`` when it starts with a torn one, else None."""
    for match in re.finditer(r"\{", line):
        if match.start() == 0:
            continue
        try:
            return json.loads(line[match.start():])
        except _JSON_ERRORS:
            continue
    return None


def _read_jsonl(path: Path, what: str, notes: list[str]) -> list[dict]:
    """JSON objects of a .jsonl file; a torn last line (killed or still-writing process) is dropped with a note."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    out, bad = [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except _JSON_ERRORS:
            obj = _salvage(line)
            if i == last and obj is None:
                notes.append(f"{what}: the last line is cut off (run killed or still writing); ignored")
                continue
            if obj is None:
                bad += 1
                continue
            # a killed process left a torn record without newline and the resumed one appended to it
            notes.append(f"{what}: a torn record (killed run) was glued to the next one; the torn part is ignored")
        if isinstance(obj, dict):
            out.append(obj)
        else:
            bad += 1
    if bad:
        notes.append(f"{what}: {bad} unreadable line(s) skipped")
    return out


# present in every logging event (Trainer.log adds the epoch), so two events of one step share them
_EVENT_KEYS = ("step", "epoch", "train/epoch")


def read_metrics(path: str | Path, notes: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """metrics.jsonl -> {step: record}. Events of one step are merged in file order, so a key logged again at the
    same step (a resumed run re-logging steps after its checkpoint) keeps the later value."""
    notes = [] if notes is None else notes
    path = Path(path)
    merged: dict[int, dict[str, Any]] = {}
    relogged: set[int] = set()
    max_step = None
    for rec in _read_jsonl(path, path.name, notes):
        step = rec.get("step")
        if not _is_num(step) or step != int(step):
            continue
        step = int(step)
        seen = merged.get(step, {})
        if (max_step is not None and step < max_step) or any(k in seen for k in rec if k not in _EVENT_KEYS):
            relogged.add(step)
        max_step = step if max_step is None else max(max_step, step)
        merged.setdefault(step, {}).update(rec)
        merged[step]["step"] = step
    if relogged:
        notes.append(f"{path.name}: {len(relogged)} step(s) logged again after a resume "
                     f"(steps {min(relogged)}-{max(relogged)}); the later values are used")
    return dict(sorted(merged.items()))


def _row_key(suite: str, row: Mapping[str, Any]) -> Any:
    """Identity of a per-row record, to drop rows written twice (an eval re-run after a resume appending to the
    same file): the suite's row index, else what the suite names a row by (`Suite.row_key`: RM-Bench's id); None
    (keep every row) when neither is there."""
    cls = registered(suite) or Suite
    return cls().row_key(row)


def load_run(run_dir: str | Path, name: str | None = None) -> Run:
    """Read a run directory. Raises MissingFileError (a FileNotFoundError) when it does not exist; anything missing inside is noted."""
    path = Path(run_dir)
    if not path.is_dir():
        raise MissingFileError(f"run directory {path} does not exist")
    run = Run(path=path, name=name or path.resolve().name)
    recipe_path = path / "recipe.yaml"
    if recipe_path.is_file():
        import yaml

        run.recipe_text = recipe_path.read_text(encoding="utf-8", errors="replace")
        try:
            loaded = yaml.safe_load(run.recipe_text)
            run.recipe = loaded if isinstance(loaded, dict) else None
        except yaml.YAMLError as err:
            run.notes.append(f"recipe.yaml does not parse: {err}")
    else:
        run.notes.append("no recipe.yaml")
    metrics_path = path / "metrics.jsonl"
    if metrics_path.is_file():
        run.records = read_metrics(metrics_path, run.notes)
    else:
        run.notes.append("no metrics.jsonl yet")
    eval_root = path / "eval"
    if eval_root.is_dir():
        for step_dir in sorted(eval_root.iterdir()):
            if not (step_dir.is_dir() and step_dir.name.isdigit()):
                continue
            suites: dict[str, list[dict]] = {}
            for f in sorted(step_dir.glob("*.jsonl")):
                rows = _read_jsonl(f, f"eval/{step_dir.name}/{f.name}", run.notes)
                unique = {}
                for i, row in enumerate(rows):
                    key = _row_key(f.stem, row)
                    unique[key if key is not None else ("#", i)] = row
                if len(unique) < len(rows):
                    run.notes.append(f"eval/{step_dir.name}/{f.name}: {len(rows) - len(unique)} row(s) written "
                                     "twice; the later ones are used")
                suites[f.stem] = list(unique.values())
            if suites:
                run.eval_rows[int(step_dir.name)] = suites
    eval_steps = set(eval_steps_of(run))
    for step in run.eval_rows:
        if step not in eval_steps:
            run.notes.append(f"eval/{step}/ has per-row scores but metrics.jsonl has no eval event at step {step} "
                             "(killed during eval, or still evaluating): drawn as heatmaps only")
    for step in sorted(eval_steps)[-1:]:
        counts = [f"{k.split('/')[1]} {k.rsplit('/n_', 1)[1]} {int(v)}" for k, v in run.records[step].items()
                  if re.fullmatch(r"eval/[^/]+/n_(skipped|truncated)", k) and _is_num(v) and v > 0]
        if counts:
            run.notes.append(f"last eval (step {step}) scored fewer rows than asked: " + ", ".join(counts))
    if not eval_steps and not run.eval_rows:
        run.notes.append("no evaluation yet: only training curves are drawn")
    return run


# ------------------------------------------------------------------------------------------------- metric access
def metric_keys(run: Run) -> list[str]:
    """Logged eval figures of a run, in reading order (the suites with curves, in the registry's order, then the
    others): the keys with a direction (`judgetrain.config.directions`); interval bounds, p-values and counts are no
    figure to rank, and the rules that need no judge stand beside the judge's figures (the headline), not apart."""
    keys = {k for rec in run.records.values() for k, v in rec.items()
            if k.startswith("eval/") and _is_num(v) and direction(k) is not None and not is_rule_key(k)}
    return sorted(keys, key=_metric_order)


def _metric_order(key: str) -> tuple:
    parts = key.split("/")
    suite = parts[1] if len(parts) > 1 else ""
    middle = parts[2:-1]
    domain_rank = {"chat": 0, "math": 1, "code": 2, "safety": 3}
    group = (0, "") if not middle else (1 + (middle[0] == "type"), domain_rank.get(middle[-1], 9), "/".join(middle))
    return (suite_rank().get(suite, 9), suite, group, METRIC_RANK.get(parts[-1], 9), key)


def eval_steps_of(run: Run) -> list[int]:
    return [s for s, rec in run.records.items()
            if any(k.startswith("eval/") and _is_num(v) and direction(k) is not None for k, v in rec.items())]


def series(run: Run, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one logged key, finite numbers only."""
    pts = [(s, float(rec[key])) for s, rec in run.records.items() if _is_num(rec.get(key))]
    return np.array([p[0] for p in pts], dtype=float), np.array([p[1] for p in pts], dtype=float)


def gap_series(run: Run, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """easy_acc - hard_acc at each eval point: how much the judge prefers the more styled response."""
    xs, ys = [], []
    for s, rec in run.records.items():
        easy, hard = rec.get(f"{prefix}/easy_acc"), rec.get(f"{prefix}/hard_acc")
        if _is_num(easy) and _is_num(hard):
            xs.append(s)
            ys.append(float(easy) - float(hard))
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


def _mode_of(key: str) -> str | None:
    """The scoring mode whose own keys ``key`` is among (``eval/<suite>/<mode>/...``); None for the bare keys."""
    parts = key.split("/")
    return parts[2] if len(parts) > 3 and parts[2] in SCORING_MODES else None


def summary_rows(run: Run) -> list[dict[str, Any]]:
    """One row per eval metric: last value (with its step/epoch), best value and the step/epoch it was reached.

    Derived rows ``eval/<suite>[/<domain>]/style_gap`` (easy - hard) of the suites with style matrices
    (`Suite.matrices`) are added and flagged ``derived``."""
    keys = metric_keys(run)
    out = []
    styled = matrix_suites()  # the suites of styled responses: their easy - hard gap
    gap_prefixes = [k[: -len("/easy_acc")] for k in keys
                    if k.split("/")[1] in styled and k.endswith("/easy_acc") and k.replace("easy", "hard") in keys]
    for key in sorted(keys + [p + "/style_gap" for p in gap_prefixes], key=_metric_order):
        derived = key.endswith("/style_gap")
        xs, ys = gap_series(run, key[: -len("/style_gap")]) if derived else series(run, key)
        if not len(xs):
            continue
        better = direction(key)
        best = int(np.argmax([rank_score(key, y) for y in ys]))  # first occurrence: the earliest step reaching the best value
        last_step, best_step = int(xs[-1]), int(xs[best])
        out.append({"metric": key, "last": float(ys[-1]), "last_step": last_step,
                    "last_epoch": run.epoch_at(last_step), "best": float(ys[best]), "best_step": best_step,
                    "best_epoch": run.epoch_at(best_step), "better": better, "n_evals": int(len(xs)),
                    "derived": derived})
    return out


SeriesFn = Callable[[Run], tuple[np.ndarray, np.ndarray]]


def _curves_figure(runs: Sequence[Run], panels: Sequence[tuple[str, Sequence[tuple[str, SeriesFn]]]], *,
                   markers: bool, unit: str | None = None, zero_line: bool = False, title: str = ""):
    """Panels of curves over steps. One run: colour per series. Several: colour per run, line style per series.
    Panels without data in any run are dropped; None when nothing is left."""
    from matplotlib.lines import Line2D

    kept = []
    for ptitle, specs in panels:
        data = [[fn(run) for _, fn in specs] for run in runs]
        if any(len(xs) for per_run in data for xs, _ in per_run):
            kept.append((ptitle, specs, data))
    if not kept:
        return None
    fig, axes = figure_grid(len(kept))
    many = len(runs) > 1
    # series told apart inside a panel (hard/normal/easy) get a legend; one series per panel: the title says it
    labels = list(dict.fromkeys(label for _, specs, _ in kept for label, _ in specs))
    if all(len(specs) == 1 for _, specs, _ in kept):
        labels = []
    for ax, (ptitle, specs, data) in zip(axes, kept):
        for r, per_run in enumerate(data):
            for (label, _), (xs, ys) in zip(specs, per_run):
                if not len(xs):
                    continue
                s = labels.index(label) if labels else 0
                color = f"C{r % 10}" if many else f"C{s % 10}"
                ax.plot(xs, ys, color=color, ls=LINESTYLES[s % 4] if many else "-",
                        marker="o" if markers else None, ms=3.5, lw=1.5)
        if unit == "accuracy":
            ax.set_ylim(-0.02, 1.02)
        if zero_line:
            ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_title(ptitle, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles, names = [], []
    if many:
        handles += [Line2D([], [], color=f"C{r % 10}", lw=2) for r in range(len(runs))]
        names += [run.name for run in runs]
        if len(labels) > 1:
            handles += [Line2D([], [], color="black", ls=LINESTYLES[s % 4]) for s in range(len(labels))]
            names += labels
    elif len(labels) > 1:
        handles += [Line2D([], [], color=f"C{s % 10}", lw=2) for s in range(len(labels))]
        names += labels
    if handles:
        fig.legend(handles, names, loc="outside lower center", ncols=min(len(names), 6), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def _key_fn(key: str) -> SeriesFn:
    """The series of a logged key; of a ``<prefix>/style_gap`` key, the easy - hard gap under its prefix."""
    if key.endswith("/style_gap"):
        return lambda run: gap_series(run, key[: -len("/style_gap")])
    return lambda run: series(run, key)


def _figures(runs: Sequence[Run]) -> list[tuple[str, str, Any]]:
    """(file name, caption, Figure) of every overlaid figure that has data."""
    figs = []
    label = "" if len(runs) == 1 else " (colour = run)"

    def add(name, caption, fig):
        if fig is not None:
            figs.append((name, caption, fig))

    add("train_curves.png", "Training: DPO loss, reward margin and reward accuracy per logged step" + label,
        _curves_figure(runs, [(title, [(key, _key_fn(key))]) for key, title in TRAIN_KEYS], markers=False,
                       title="training"))
    keys = sorted({k for run in runs for k in metric_keys(run)}, key=_metric_order)
    keys = [k for k in keys if _mode_of(k) is None]  # the bare mode's; the others: generate.png and the tables
    for name in suite_rank():  # each suite's own figures (`Suite.curve_plots`)
        rows = [r for run in runs for suites in run.eval_rows.values() for r in suites.get(name, [])]
        for plot in get_suite(name).curve_plots(keys, rows):
            add(plot.file, plot.caption + label,
                _curves_figure(runs, [(title, [(series_label, _key_fn(key)) for series_label, key in panel])
                                      for title, panel in plot.panels], markers=True, unit=plot.unit,
                               zero_line=plot.zero_line, title=plot.title))
    other = [k for k in keys if k.split("/")[1] not in suite_rank()]
    add("eval_other.png", "Other logged eval metrics" + label,
        _curves_figure(runs, [(k, [(k, _key_fn(k))]) for k in other], markers=True, title="other eval metrics"))
    add("generate.png", "Generate mode per eval point: share of the judge's written evaluations whose score (or "
        "verdict) could be read, and the Spearman agreement of the written score with judge mode's expected score"
        + label,
        _curves_figure(runs, [(title, [(suite, _key_fn(f"eval/{suite}/generate/{fig}")) for suite in suite_rank()])
                              for fig, title in (("parse_rate", "parse rate"), ("agreement", "agreement (Spearman)"))],
                       markers=True, title="what the judge writes"))
    add("rounds.png", rounds.CAPTION, rounds.round_table_figure([run.path for run in runs]))  # a loop's round table
    return figs


def generated_tables(run: Run) -> list[dict[str, Any]]:
    """Per suite evaluated in generate mode, at the last eval that has generate keys: each figure (`GENERATED_FIGURES`,
    then the parse rate, agreement, stops, length and the parse failures by reason) in each mode logged, the bare
    mode first: ``{"suite", "step", "epoch", "modes", "rows": [{"metric", "values"}]}``."""
    steps = [s for s, rec in run.records.items() if any(_mode_of(k) == "generate" for k in rec)]
    if not steps:
        return []
    step = max(steps)
    rec = run.records[step]
    bare = bare_mode(run.recipe)
    out = []
    for suite in suite_rank():
        if not any(k.startswith(f"eval/{suite}/generate/") for k in rec):
            continue
        modes = [m for m in PROXY_MODES if m == bare or any(k.startswith(f"eval/{suite}/{m}/") for k in rec)]
        modes.sort(key=lambda m: m != bare)
        modes.append("generate")
        fails = sorted(k[len(f"eval/{suite}/generate/"):] for k in rec if k.startswith(f"eval/{suite}/generate/parse_fail/"))
        rows = []
        for fig in (*GENERATED_FIGURES[suite], *GENERATED_COMMON, *fails):
            values = [rec.get(f"eval/{suite}/{fig}" if m == bare else f"eval/{suite}/{m}/{fig}") for m in modes]
            if any(_is_num(v) for v in values):
                rows.append({"metric": fig, "values": [float(v) if _is_num(v) else None for v in values]})
        out.append({"suite": suite, "step": step, "epoch": run.epoch_at(step),
                    "modes": [m + (" (bare keys)" if m == bare else "") for m in modes], "rows": rows})
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


def matrix_suites() -> list[str]:
    """The suites whose style matrices the report draws (`Suite.matrices`), in the registry's order."""
    return [n for n in known_suites() if getattr(registered(n), "matrices", False)]


def matrices_heading() -> str:
    """The heading of the report's section of style matrices: ``<suite title> matrices``."""
    return " / ".join(get_suite(n).title for n in matrix_suites()) + " matrices"


def _matrix_figures(runs: Sequence[Run]) -> list[tuple[str, str, Any, str]]:
    """(file name, caption, Figure, run name) of each run's heatmaps per eval point, plus a last-eval comparison."""
    out = []
    for name in matrix_suites():
        suite = get_suite(name)
        last = {}
        for run in runs:
            prefix = f"{name}_matrix_" + ("" if len(runs) == 1 else _slug(run.name) + "_")
            for step, suites in sorted(run.eval_rows.items()):
                mats = suite.style_matrices(suites.get(name) or [])
                if not mats:
                    continue
                epoch = run.epoch_at(step)
                when = f"step {step}" + (f", epoch {epoch:g}" if epoch is not None else "")
                fig = matrices_figure(mats, f"{run.name}: {suite.title} accuracy matrix, {when}")
                out.append((f"{prefix}step{step}.png", f"{suite.title} matrix of {run.name} at {when}: share of "
                            "prompts whose chosen response (row style) outscores the rejected one (column style); "
                            "hard = above the diagonal, normal = diagonal, easy = below", fig, run.name))
                last[run.name] = (mats.get("overall", next(iter(mats.values()))), when)
        if len(runs) > 1 and last:
            fig = matrices_figure({f"{run_name}\n{when}": m for run_name, (m, when) in last.items()},
                                  f"{suite.title} overall matrix at each run's last eval")
            out.append((f"{name}_matrix_last.png", f"Overall {suite.title} matrix of each run at its last eval point",
                        fig, ""))
    return out


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=DPI, format="png")  # no bbox_inches="tight": the pixel size stays figsize * DPI


# ----------------------------------------------------------------------------------------------------- tables
def _fmt(value: Any) -> str:
    return f"{value:.4f}" if _is_num(value) else ("nan" if isinstance(value, float) else "-")


def fmt_epoch(epoch: float | None) -> str:
    return "-" if epoch is None else f"{epoch:.2f}".rstrip("0").rstrip(".")


def _recipe_headline(recipe: Mapping[str, Any] | None) -> dict[str, Any]:
    wanted = ("model_name_or_path", "model", "learning_rate", "beta", "loss_type", "num_train_epochs", "max_steps",
              "per_device_train_batch_size", "gradient_accumulation_steps", "lora_r", "r", "max_length", "scoring",
              "seed")
    found: dict[str, Any] = {}

    def walk(obj: Any, prefix: str) -> None:
        if isinstance(obj, Mapping):
            for k, v in obj.items():
                key = f"{prefix}{k}"
                if isinstance(v, Mapping):
                    walk(v, key + ".")
                elif str(k) in wanted and isinstance(v, (str, int, float)) and not isinstance(v, bool):
                    found.setdefault(key, v)

    walk(recipe or {}, "")
    return found


def _run_info(run: Run) -> dict[str, Any]:
    loss = series(run, "train/loss")
    return {"name": run.name, "path": str(run.path), "status": run.status, "last_step": run.last_step,
            "last_epoch": run.epoch_at(run.last_step) if run.last_step is not None else None,
            "eval_points": eval_steps_of(run), "final_train_loss": float(loss[1][-1]) if len(loss[0]) else None,
            "checkpoints": [p.name for p in list_checkpoints(run.path)],
            "recipe": _recipe_headline(run.recipe), "notes": list(run.notes)}


SUMMARY_HEADER = ("metric", "last", "step", "epoch", "best", "best step", "best epoch", "better")


def summary_cells(row: Mapping[str, Any]) -> list[str]:
    return [row["metric"] + (" (derived)" if row["derived"] else ""), _fmt(row["last"]), str(row["last_step"]),
            fmt_epoch(row["last_epoch"]), _fmt(row["best"]), str(row["best_step"]), fmt_epoch(row["best_epoch"]),
            row["better"]]


def _comparison(runs: Sequence[Run], tables: Mapping[str, list[dict]]) -> list[dict[str, Any]]:
    """metric -> per run {last, best, best_epoch}; rows in reading order."""
    by_metric: dict[str, dict[str, Any]] = {}
    for run in runs:
        for row in tables[run.name]:
            by_metric.setdefault(row["metric"], {"metric": row["metric"], "better": row["better"],
                                                 "derived": row["derived"], "runs": {}})
            by_metric[row["metric"]]["runs"][run.name] = {k: row[k] for k in ("last", "last_step", "best",
                                                                            "best_step", "best_epoch")}
    return [by_metric[k] for k in sorted(by_metric, key=_metric_order)]


def cmp_label(row: Mapping[str, Any]) -> str:
    return row["metric"] + (" (derived)" if row["derived"] else "")


def cmp_cell(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "-"
    return f"{_fmt(entry['last'])} (best {_fmt(entry['best'])} @ ep {fmt_epoch(entry['best_epoch'])})"


# ------------------------------------------------------------------------------------------------ html / md
RUNS_HEADER = ("run", "status", "last step", "epoch", "eval points", "last train loss", "recipe")


def _html_template():
    """templates/report.html, autoescaped: every string that reaches the page (run names, notes, recipe text,
    metric names) is escaped by jinja2, whatever it holds."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("judgetrain.report", "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template("report.html")


def _write_html(path: Path, runs, infos, tables, comparison, figures, matrices) -> None:
    def figure(name: str, caption: str) -> dict[str, str]:
        data = base64.b64encode((path.parent / name).read_bytes()).decode("ascii")
        return {"name": name, "caption": caption, "data": data}

    def cell(run: Run, row: Mapping[str, Any]) -> dict[str, str] | None:
        entry = row["runs"].get(run.name)
        return None if entry is None else {"run": run.name, "value": repr(entry["last"]), "text": cmp_cell(entry)}

    page = _html_template().render(
        names=", ".join(run.name for run in runs), comparison_header=["metric", *(run.name for run in runs), "better"],
        runs_header=RUNS_HEADER, summary_header=SUMMARY_HEADER,
        infos=[{"name": i["name"], "status": i["status"], "last_step": "-" if i["last_step"] is None else i["last_step"],
                "epoch": fmt_epoch(i["last_epoch"]), "eval_points": len(i["eval_points"]),
                "loss": _fmt(i["final_train_loss"]),
                "recipe": ", ".join(f"{k}={v}" for k, v in i["recipe"].items()) or "-"} for i in infos],
        runs=[{"name": run.name, "slug": _slug(run.name), "notes": run.notes, "recipe_text": run.recipe_text,
               "versus": _against_base_html(run), "headline": _headline_cells(run),
               "generated": [_generated_cells(t) for t in generated_tables(run)],
               "summary": [{"metric": row["metric"], "last": repr(row["last"]), "best": repr(row["best"]),
                            "cells": summary_cells(row)} for row in tables[run.name]]} for run in runs],
        comparison=[{"metric": row["metric"], "label": cmp_label(row), "better": row["better"],
                     "cells": [cell(run, row) for run in runs]} for row in comparison] if len(runs) > 1 else [],
        figures=[figure(*f) for f in figures], matrices=[figure(*m) for m in matrices],
        matrices_heading=matrices_heading())
    path.write_text(page, encoding="utf-8")


def _against_base_html(run: Run) -> dict[str, Any]:
    """The run against its base judge as page cells: the figures that got worse (shown in red, first on the page)
    or the sentence saying none did, and the base vs trained table."""
    versus = against_base(run.records, run.recipe, run.path)
    return {"worse": [] if versus is None else shown(versus, versus["worse"]), "header": list(AGAINST_BASE_HEADER),
            "text": against_base_verdict(versus), "rows": against_base_cells(versus),
            "why": [] if versus is None else versus["why"]}


def _headline_dict(run: Run) -> dict[str, Any] | None:
    head = headline(run.records, run.recipe)
    return None if head is None else head.as_dict()


def _headline_cells(run: Run) -> dict[str, Any] | None:
    """The run's headline figures (`judgetrain.report.headline`, the model card's) as page cells."""
    head = headline(run.records, run.recipe)
    if head is None:
        return None
    header, cells = headline_table(head)
    return {"note": headline_note(head), "header": header,
            "rows": [{"metric": r["metric"], "best": repr(r["best"]), "last": repr(r["last"]), "cells": c}
                     for r, c in zip(head.rows, cells)]}


def _generated_cells(table: Mapping[str, Any]) -> dict[str, Any]:
    """A `generated_tables` table as page cells: its title, header and formatted values."""
    when = f"step {table['step']}" + (f", epoch {fmt_epoch(table['epoch'])}" if table["epoch"] is not None else "")
    return {"suite": table["suite"], "title": f"{table['suite']}, last eval with generate mode ({when})",
            "header": ["figure", *table["modes"]],
            "rows": [{"metric": r["metric"], "cells": [_fmt(v) for v in r["values"]]} for r in table["rows"]]}


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    def esc(cell: str) -> str:
        return str(cell).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _write_md(path: Path, runs, infos, tables, comparison, figures, matrices) -> None:
    out = [f"# judgetrain report: {', '.join(run.name for run in runs)}"]
    for run in runs:  # base vs trained and what got worse, before any table
        versus = against_base(run.records, run.recipe, run.path)
        out += ["", f"## Against the base judge: {run.name}", "", *against_base_lines(versus)]
    for run in runs:
        head = _headline_cells(run)
        if head is not None:
            out += ["", f"## Headline: {run.name}", "", head["note"], "",
                    _md_table(head["header"], [r["cells"] for r in head["rows"]])]
    out += ["", "## Runs", ""]
    out.append(_md_table(("run", "status", "last step", "epoch", "eval points", "last train loss"),
                         [(i["name"], i["status"], str(i["last_step"] if i["last_step"] is not None else "-"),
                           fmt_epoch(i["last_epoch"]), str(len(i["eval_points"])), _fmt(i["final_train_loss"]))
                          for i in infos]))
    for run in runs:
        if run.notes:
            out += ["", f"**{run.name}**: what is missing or was repaired", ""] + [f"- {n}" for n in run.notes]
    if len(runs) > 1 and comparison:
        out += ["", "## Comparison: last eval (best, at epoch)", "",
                _md_table(["metric", *[run.name for run in runs], "better"],
                          [[cmp_label(row), *[cmp_cell(row["runs"].get(run.name)) for run in runs], row["better"]]
                           for row in comparison])]
    for run in runs:
        out += ["", f"## Summary: {run.name}", ""]
        out.append(_md_table(SUMMARY_HEADER, [summary_cells(r) for r in tables[run.name]])
                   if tables[run.name] else "_No evaluation logged yet._")
        generated = [_generated_cells(t) for t in generated_tables(run)]
        if generated:
            out += ["", f"## Proxies beside what the judge writes: {run.name}"]
        for t in generated:
            out += ["", f"*{t['title']}*", "", _md_table(t["header"], [[r["metric"], *r["cells"]] for r in t["rows"]])]
    out += ["", "## Curves", ""]
    for name, caption in figures:
        out += [f"![{caption}]({name})", "", f"*{name}*: {caption}", ""]
    if matrices:
        out += [f"## {matrices_heading()}", ""]
        for name, caption in matrices:
            out += [f"![{caption}]({name})", "", f"*{name}*: {caption}", ""]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------------ report
def _unique_names(paths: Sequence[Path]) -> list[str]:
    names = [p.resolve().name for p in paths]
    for i, p in enumerate(paths):
        if names.count(names[i]) > 1:
            names[i] = f"{p.resolve().parent.name}/{p.resolve().name}"
    seen: dict[str, int] = {}
    for i, n in enumerate(names):
        seen[n] = seen.get(n, 0) + 1
        if seen[n] > 1:
            names[i] = f"{n}#{seen[n]}"
    return names


class NothingToReport(BadInputError):
    """No run directory given holds a logged figure: a report of 0 figures would say nothing."""


def build_report(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None) -> dict[str, Any]:
    """Everything `make_report` writes, plus the runs and tables (for the CLI's terminal summary)."""
    if not run_dirs:
        raise ValueError("no run directory given")
    paths = [Path(p) for p in run_dirs]
    if len(paths) == 1 and is_loop_dir(paths[0]):  # a loop's folder: the loop's report, each round's drawn as a run's
        return build_loop_report(paths[0], out_dir, run_report=make_report)
    runs = [load_run(p, name) for p, name in zip(paths, _unique_names(paths))]
    if not any(run.records or run.eval_rows or rounds.round_rows(run.path) for run in runs):
        raise NothingToReport(f"nothing to report in {', '.join(map(str, paths))}: no metrics.jsonl, no eval/ files "
                              "and no round table (a run folder of `judgetrain train` once it has logged, or of "
                              "`judgetrain loop`)")
    if out_dir is None:
        out_dir = paths[0] / "report" if len(paths) == 1 else Path("judgetrain_report")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for run in runs:
        for note in run.notes:
            logger.warning("%s: %s", run.name, note)
    for run in runs:  # said first, as the pages open with it: each run against its base judge
        logger.info("%s, against the base judge:\n%s", run.name,
                    against_base_text(against_base(run.records, run.recipe, run.path)))

    written: dict[str, Path] = {}
    figures = []
    for name, caption, fig in _figures(runs):
        _save(fig, out / name)
        written[name] = out / name
        figures.append((name, caption))
    matrices = []
    for name, caption, fig, _ in _matrix_figures(runs):
        _save(fig, out / name)
        written[name] = out / name
        matrices.append((name, caption))

    tables = {run.name: summary_rows(run) for run in runs}
    infos = [_run_info(run) for run in runs]
    comparison = _comparison(runs, tables)
    summary = {"runs": infos, "tables": tables, "comparison": comparison if len(runs) > 1 else [],
               "headline": {run.name: _headline_dict(run) for run in runs},
               "generated": {run.name: generated_tables(run) for run in runs},
               "figures": dict(figures), "matrices": dict(matrices)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=True), encoding="utf-8")
    written["summary.json"] = out / "summary.json"
    _write_html(out / "report.html", runs, infos, tables, comparison, figures, matrices)
    written["report.html"] = out / "report.html"
    _write_md(out / "report.md", runs, infos, tables, comparison, figures, matrices)
    written["report.md"] = out / "report.md"
    logger.info("report of %d run(s) written to %s (%d figures)", len(runs), out, len(figures) + len(matrices))
    return {"paths": written, "runs": runs, "tables": tables, "comparison": comparison, "infos": infos}


def make_report(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None) -> dict[str, Path]:
    """Draw ``run_dirs`` into ``out_dir`` (default: ``<run>/report`` for one run, ``./judgetrain_report`` for
    several). Returns {file name: path} of every file written (PNGs, summary.json, report.html, report.md)."""
    return build_report(run_dirs, out_dir)["paths"]

