"""Two saved evaluations side by side, from their per-row files, without scoring again (`judgetrain compare`).

    from judgetrain.eval.compare import compare_evaluations
    doc = compare_evaluations("runs/base-eval/tiny-judge", "runs/x/eval/40")   # A: the baseline, B: compared to it
    doc["metrics"]["eval/rmbench/delta/total_avg_acc"], doc["suites"]["rmbench"]["implicit"]["hard_acc"]["p_value"]

An evaluation is a folder that `judgetrain.eval.runner.evaluate_and_write` wrote (``results.json`` and
``<suite>.jsonl``, ``<suite>.<mode>.jsonl`` for each other scoring mode): ``<output_dir>/eval/<step>/`` of a run, or
``<output-dir>/<name>/`` of `judgetrain eval`; a run folder means its latest evaluation. Each suite and mode present in
both is read into per-item figures (`judgetrain.eval.stats.Items`), paired by item, and every figure gets A, B and
B - A with their intervals from the same bootstrap resamples, and a p-value: the exact sign test where its items are
right or wrong, else the paired sign-flip test (`judgetrain.eval.stats.paired_difference`). Both resample and count
each suite's unit of independence (`UNITS`), not its rows.

What each suite's records give is read by its class (`judgetrain.eval.benchmarks`, `Suite.items`): RM-Bench's
figures resampled by prompt within domains, JudgeBias's by sample within a perturbation set, Ideation's by pair, the
pairwise suites' by pair (records without their verdicts are not compared, said in ``skipped``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from judgetrain.config.directions import best_at, direction
from judgetrain.config.recipe import PROXY_MODES, did_you_mean, different_readings, suite_mode
from judgetrain.config.suites import registered
from judgetrain.eval.benchmarks import SuiteFacts, get_suite
from judgetrain.eval.stats import N_RESAMPLES, Items, holm, paired_difference, resolution, smallest_p
from judgetrain.utils.errors import BadInputError

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
# The figures printed first, per suite (the JSON holds every figure); a category's figures follow its suite's.
HEADLINE = SuiteFacts("headline")
# Each suite's unit of independence: what one bootstrap draw and one count of the paired test are. Rows of one unit
# share what makes them alike (the same prompt, the same pair in another order), so counting them apart would claim
# more evidence than the data holds.
UNITS = SuiteFacts("unit")
REGRESSION_ALPHA = 0.05  # the default of the recipe key eval_regression_alpha


class EvaluationError(BadInputError, ValueError):
    """A path that is not a saved evaluation, or two evaluations with nothing to compare."""


def compare_evaluations(a: str | Path, b: str | Path, *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                        suites: list[str] | None = None, margin: float = 0.0,
                        alpha: float = REGRESSION_ALPHA) -> dict[str, Any]:
    """A (the baseline) against B, per suite and scoring mode both hold and read alike (``readings``: {"a", "b":
    {mode: reading}} as each recorded, `recorded_readings`; a mode read two ways is left out, said in ``skipped``):
    ``{"a", "b" (the folders read), "suites":
    {suite: {mode: {metric: paired figures, "change" among them}}}, "metrics": {logged key: value}, "regressions":
    [<suite>[/<mode>]/<metric> worse], "skipped": [why a suite or mode was left out], "rules": {"a", "b": each
    figure against the best rule that needs no judge (`rule_verdicts`)}, "n_resamples", "seed"}``.
    Logged keys: ``eval/<suite>[/<mode>]/delta/<metric>`` and its ``delta_ci_low``, ``delta_ci_high``, ``p_value``,
    ``n_units`` (the mode named unless it is both evaluations' first mode). ``change``: what `changes` says of the
    figure with ``margin`` and ``alpha``, every figure judged together, as the run's guard judges them."""
    folder_a, folder_b = evaluation_folder(a), evaluation_folder(b)
    files_a, files_b = row_files(folder_a), row_files(folder_b)
    check_suites(suites, files_a, files_b)
    bare = _bare_mode(folder_a) == _bare_mode(folder_b) and _bare_mode(folder_a)
    readings = {"a": recorded_readings(folder_a), "b": recorded_readings(folder_b)}
    doc: dict[str, Any] = {"a": str(folder_a), "b": str(folder_b), "n_resamples": n_resamples, "seed": seed,
                           "readings": readings, "suites": {}, "metrics": {}, "skipped": []}
    for key in sorted(set(files_a) | set(files_b)):
        suite, mode = key
        if suites and suite not in suites:
            continue
        if key not in files_a or key not in files_b:
            doc["skipped"].append(f"{suite} ({mode}): only in {'A' if key in files_a else 'B'}")
            continue
        two = different_readings(mode, readings["a"].get(mode), readings["b"].get(mode))
        if two is not None:
            doc["skipped"].append(f"{suite} ({mode}): {two}")
            continue
        items_a, why_a = suite_items(suite, mode, read_records(files_a[key]))
        items_b, why_b = suite_items(suite, mode, read_records(files_b[key]))
        if items_a is None or items_b is None:
            doc["skipped"].append(f"{suite} ({mode}): {why_a or why_b}")
            continue
        paired = paired_figures(items_b, items_a, n_resamples=n_resamples, seed=seed)
        if not paired:
            doc["skipped"].append(f"{suite} ({mode}): no item in both evaluations")
            continue
        doc["suites"].setdefault(suite, {})[mode] = {m: _as_ab(v) for m, v in paired.items()}
        doc["metrics"].update(delta_keys(suite, mode, bare, paired))
    if not doc["suites"]:
        raise EvaluationError(f"nothing to compare between {folder_a} and {folder_b}: "
                              + ("; ".join(doc["skipped"]) or "no per-row files"))
    named = {(f"{suite}/{metric}" if mode == bare else f"{suite}/{mode}/{metric}"): fig
             for suite, modes in doc["suites"].items() for mode, figures in modes.items()
             for metric, fig in figures.items()}
    said = changes(named, margin, alpha)
    for name, fig in named.items():
        fig["change"] = said.get(name, "")
    doc["regressions"] = [name for name, s in said.items() if s == "worse"]
    doc["rules"] = {"a": rule_verdicts(folder_a), "b": rule_verdicts(folder_b)}
    return doc


def rule_verdicts(folder: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """{suite: {mode: {metric: verdict}}}: each judge figure of a saved evaluation against the best rule that needs no
    judge on its rows (results.json ``rules``, `judgetrain.eval.rules.learned`); {} for an evaluation without them."""
    doc = json.loads((folder / RESULTS_FILE).read_text())
    rules = doc.get("rules") if isinstance(doc, dict) else None
    return {suite: held.get("learned") or {} for suite, held in (rules or {}).items()}


def paired_figures(trained: Items, base: Items, **options: Any) -> dict[str, dict[str, Any]]:
    """`paired_difference` of two evaluations' items, a figure best at a value (the position figures: 0.5) given the
    change of its distance from that value with its interval, which `changes` judges it by."""
    centres = {name: best_at(name) for name in trained.values if best_at(name) is not None}
    return paired_difference(trained, base, centres=centres, **options)


def check_suites(suites: list[str] | None, files_a: dict[tuple[str, str], Path],
                 files_b: dict[tuple[str, str], Path]) -> None:
    """Each suite asked for (``--suites``) is one `judgetrain compare` knows and one both evaluations hold; else an
    `EvaluationError` naming it, the nearest known suite, and the suites each side holds."""
    held_a, held_b = sorted({s for s, _ in files_a}), sorted({s for s, _ in files_b})
    holds = f"A holds {', '.join(held_a) or 'none'}; B holds {', '.join(held_b) or 'none'}"
    for suite in suites or []:
        if suite not in UNITS:
            raise EvaluationError(f"--suites: unknown suite {suite!r}{did_you_mean(suite, UNITS)} (known: "
                                  f"{', '.join(UNITS)}; {holds})")
        if suite not in held_a or suite not in held_b:
            raise EvaluationError(f"--suites: {suite} is not in {'A' if suite not in held_a else 'B'}: {holds}")


def delta_keys(suite: str, mode: str, bare: str | None, paired: dict[str, dict[str, Any]],
               prefix: str = "eval/") -> dict[str, float]:
    """The logged keys of one suite's paired figures (`paired_difference`): ``<prefix><suite>[/<mode>]/delta/<metric>``
    and its ``.../delta_ci_low``, ``.../delta_ci_high``, ``.../p_value``, ``.../n_units`` (the units its test counted)
    (the mode named unless it is ``bare``)."""
    base = f"{prefix}{suite}/" if mode == bare else f"{prefix}{suite}/{mode}/"
    out: dict[str, float] = {}
    for metric, v in paired.items():
        out[f"{base}delta/{metric}"] = v["delta"]
        for part in ("delta_ci_low", "delta_ci_high", "p_value", "n_units"):
            out[f"{base}delta/{metric}/{part}"] = v[part]
        for part in ("ci_low", "ci_high"):  # a figure best at a value: its distance from it
            if f"distance_delta_{part}" in v:
                out[f"{base}delta/{metric}/distance_{part}"] = v[f"distance_delta_{part}"]
        if "distance_p_value" in v:
            out[f"{base}delta/{metric}/distance_p_value"] = v["distance_p_value"]
    return out


def _as_ab(v: dict[str, Any]) -> dict[str, Any]:
    """paired_difference's figures of (trained=B, base=A) under the names A and B."""
    return {"a": v["base"], "a_ci_low": v["base_ci_low"], "a_ci_high": v["base_ci_high"], "b": v["trained"],
            "b_ci_low": v["trained_ci_low"], "b_ci_high": v["trained_ci_high"], "delta": v["delta"],
            "delta_ci_low": v["delta_ci_low"], "delta_ci_high": v["delta_ci_high"], "p_value": v["p_value"],
            "p_method": v["p_method"], "n": v["n"], "n_units": v["n_units"], "n_only_a": v["n_only_base"],
            "n_only_b": v["n_only_trained"],
            **{k: v[k] for k in DISTANCE_FIELDS if k in v}}


_SIDES = ("trained", "base", "a", "b")  # the two figures compared, under paired_difference's or compare's names
DISTANCE_FIELDS = ("distance_delta", "distance_delta_ci_low", "distance_delta_ci_high", "distance_p_value")


def changes(figures: Mapping[str, Mapping[str, Any]], margin: float = 0.0,
            alpha: float = REGRESSION_ALPHA) -> dict[str, str]:
    """What can be said of each paired figure, all judged together: ``{name: "better" | "worse" | "" | "n = 2: too
    few to tell"}``. ``figures``: {name (its last part names the figure, `judgetrain.config.directions`): {delta_ci_low,
    delta_ci_high, p_value, n_units}}; a figure not ranked (a count) is left out.

    "worse" (and "better") asks three things at once:
    - the paired test's p-value is under ``alpha`` after Holm's step-down correction across the figures tested
      together (`judgetrain.eval.stats.holm`);
    - the interval of the difference lies wholly beyond ``margin`` the wrong way ("worse": a loss that cannot be
      smaller than ``margin``, in the figure's units) or beyond 0 the right way ("better");
    - the figure has enough units for its test to reach ``alpha`` at all (`smallest_p` of its units under ``alpha``);
      one that has not is "n = <units>: too few to tell" and is left out of Holm's count.
    A figure best at a value (`judgetrain.config.directions.CLOSER_TO`: a position lean at 0.5) is judged by the change
    of its distance from that value, read from its own paired test (``distance_p_value``) and interval
    (``distance_delta_ci_low``, ``distance_delta_ci_high``, `paired_figures`), never from the raw difference's: a
    lean growing from 0.5 to 0.95 is worse, one shrinking towards 0.5 better, one crossing 0.5 to the same distance
    no change; without that test it gets no verdict and is left out of Holm's count. A figure no unit measured
    (``n_units`` 0) is left out altogether. A verdict never rests on a float's last bits: the interval must clear its
    bound by more than the figure's own resolution (`judgetrain.eval.stats.resolution`), so a difference of float
    rounding (3e-16 between two equal distances) is no change on any CPU.
    The one rule of the run's guard, `judgetrain eval --baseline`, `judgetrain compare`, the report and the card."""
    out: dict[str, str] = {}
    tested: dict[str, float] = {}
    intervals: dict[str, tuple[str, float, float]] = {}  # name: (its way, the interval its verdict reads)
    for name, v in figures.items():
        way = direction(name)
        units = v.get("n_units")
        if way is None or units == 0:
            continue  # not ranked, or nothing measured it
        if units is not None and smallest_p(int(units)) >= alpha:
            out[name] = f"n = {int(units)}: too few to tell"
            continue
        out[name] = ""
        p, low, high = (v.get(k) for k in ("p_value", "delta_ci_low", "delta_ci_high"))
        if way.startswith("closer to "):  # judged by its distance from its best value: a growing distance is worse
            way, p, low, high = ("lower", *(v.get(k) for k in ("distance_p_value", "distance_delta_ci_low",
                                                                "distance_delta_ci_high")))
        if all(isinstance(x, (int, float)) and math.isfinite(x) for x in (p, low, high)):
            tested[name] = float(p)
            intervals[name] = (way, low, high, resolution(*(v.get(k) for k in _SIDES), low, high))
    for name in holm(tested, alpha):
        way, low, high, tol = intervals[name]
        if way == "lower":
            out[name] = "worse" if low > margin + tol else "better" if high < -tol else ""
        elif way == "higher":
            out[name] = "worse" if high < -margin - tol else "better" if low > tol else ""
    return out


def worse_rule(margin: float = 0.0, alpha: float = REGRESSION_ALPHA) -> str:
    """What `changes` asks of a figure to call it worse, in words (warnings, report, card)."""
    beyond = f"a loss under the margin {margin:g}" if margin else "0"
    return f"paired test p < {alpha:g} after Holm across the figures, the interval of the difference excluding {beyond}"


# ---------------------------------------------------------------------------------------------- the files
def evaluation_folder(path: str | Path) -> Path:
    """The folder of one evaluation: ``path`` itself when it holds results.json, else (a run folder) its latest
    ``eval/<step>/`` that does."""
    path = Path(path)
    if (path / RESULTS_FILE).is_file():
        return path
    steps = sorted((p for p in (path / "eval").glob("*") if p.name.isdigit() and (p / RESULTS_FILE).is_file()),
                   key=lambda p: int(p.name)) if (path / "eval").is_dir() else []
    if steps:
        return steps[-1]
    named = sorted(p for p in path.glob("*") if (p / RESULTS_FILE).is_file()) if path.is_dir() else []
    if len(named) == 1:  # a `judgetrain eval` output folder of one model
        return named[0]
    raise EvaluationError(f"{path} is not a saved evaluation: no {RESULTS_FILE} there nor in {path}/eval/<step>/ "
                          "(give an evaluation folder, a run folder, or a `judgetrain eval` output folder's <name>/)")


def _results(folder: Path) -> dict[str, Any]:
    """The evaluation's results.json ({} when it is not an object); unreadable: an `EvaluationError` naming it."""
    try:
        doc = json.loads((folder / RESULTS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise EvaluationError(f"{folder / RESULTS_FILE}: unreadable: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def _bare_mode(folder: Path) -> str | None:
    """The scoring mode of ``<suite>.jsonl`` (the first of the `PROXY_MODES` the evaluation ran)."""
    mode = _results(folder).get("scoring")
    return mode if mode in PROXY_MODES else None


def recorded_readings(folder: Path) -> dict[str, str]:
    """{mode: reading} an evaluation recorded (results.json ``readings``); {} for one written before readings were
    recorded (`judgetrain.config.recipe.different_readings` then leaves its implicit figures out)."""
    readings = _results(folder).get("readings")
    return {str(k): str(v) for k, v in readings.items()} if isinstance(readings, dict) else {}


def row_files(folder: Path) -> dict[tuple[str, str], Path]:
    """{(suite, mode): per-row file} of one evaluation folder."""
    bare = _bare_mode(folder)
    out = {}
    for path in sorted(folder.glob("*.jsonl")):
        suite, _, mode = path.stem.partition(".")
        mode = mode or bare
        if mode:
            out[(suite, mode)] = path
    return out


def read_records(path: Path) -> list[dict]:
    """The records of a per-row file; a line that is not a JSON object is an error naming the file and line."""
    records = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise EvaluationError(f"{path} line {lineno}: not JSON: {exc}") from None
            if not isinstance(rec, dict):
                raise EvaluationError(f"{path} line {lineno}: expected a JSON object, got {type(rec).__name__}")
            records.append(rec)
    return records


# ------------------------------------------------------------------------------------------ records to items
def suite_items(suite: str, mode: str, records: list[dict]) -> tuple[Items | None, str | None]:
    """(the per-item figures of one suite's records in one mode, None) or (None, why they cannot be compared)."""
    if not records:
        return None, "no records"
    if registered(suite) is None:
        return None, "a suite compare does not know"
    return get_suite(suite).items(records, suite_mode(mode))
