"""The round table: each figure of each round against the base, from the files `judgetrain eval` and `judgetrain
compare` wrote.

    table = round_table("loops/clinic", rounds=2)   # {"keys": {...}, "rows": [...]} ; write_round_table writes it

Keys extend the eval keys (`judgetrain eval`'s results.json ``metrics``) with the round: ``round/<k>/eval/<suite>[/
<mode>]/<metric>`` with its ``/ci_low`` and ``/ci_high``, ``round/<k>/eval/<suite>[/<mode>]/delta/<metric>`` with
``/delta_ci_low``, ``/delta_ci_high`` and ``/p_value``; round 0 is the base (its one evaluation, in ``round-0/eval/``);
each later round's differences are `judgetrain compare`'s of its evaluation against the base's (``eval/compare.json``;
a mode the base reads otherwise, implicit, has none). Rows (one per figure and round): ``round``, ``figure``
(``<suite>[/<mode>]/<metric>``), ``mode`` and ``reading`` (what its number is, as its evaluation recorded), ``value``,
``ci_low``, ``ci_high``, ``delta``, ``delta_ci_low``, ``delta_ci_high``, ``p_value``, ``n``, and the figure against the
best rule that needs no judge on the same rows (`judgetrain.eval.rules`): ``best_rule``, ``over_rule`` (the judge minus
it) with ``over_rule_ci_low`` / ``over_rule_ci_high``, and ``learned`` (that interval excludes 0 on the better side);
the markdown says it per figure ("beats the best rule (shorter) by +0.120 [0.050, 0.190]" / "not above the best rule
(shorter): ...").

Written to ``<output_dir>/rounds.json`` (keys and rows), ``rounds.csv`` and ``rounds.md``; `judgetrain report`
draws it (`judgetrain.report.build`).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from judgetrain.eval.rules import round_verdict
from judgetrain.report.rounds import row_label
from judgetrain.run.layout import ROUND_COMPARE_FILE, ROUND_TABLE, ROUND_TABLE_CSV, ROUND_TABLE_MD, round_folder
from judgetrain.utils.files import read_json, write_json
COLUMNS = ("round", "figure", "mode", "reading", "value", "ci_low", "ci_high", "delta", "delta_ci_low", "delta_ci_high",
           "p_value", "n", "best_rule", "over_rule", "over_rule_ci_low", "over_rule_ci_high", "learned")


def eval_results(eval_dir: Path) -> dict | None:
    """The results.json of the one judge a round's eval folder holds; None where absent."""
    found = sorted(eval_dir.glob("*/results.json"))
    return json.loads(found[-1].read_text(encoding="utf-8")) if found else None


def round_table(out: str | Path, rounds: int) -> dict[str, Any]:
    """The keys and rows of the base and of every round whose evaluation is written (see the module doc)."""
    out = Path(out)
    keys: dict[str, Any] = {}
    rows: list[dict] = []
    for k in range(0, rounds + 1):
        results = eval_results(out / round_folder(k) / "eval")
        if results is None:
            continue
        compared = (read_json(out / round_folder(k) / "eval" / ROUND_COMPARE_FILE) or {}) if k else {}
        keys.update({f"round/{k}/{key}": value for key, value in results["metrics"].items()})
        keys.update({f"round/{k}/{key}": value for key, value in (compared.get("metrics") or {}).items()})
        rows += figure_rows(k, results, compared.get("suites") if k else None)
    return {"keys": keys, "rows": rows}


def figure_rows(k: int, results: dict, deltas: dict | None) -> list[dict]:
    """One row per figure with an interval (results.json ``intervals``: suite -> mode -> metric), and its
    difference against the base where ``deltas`` has it (round 0, the base itself, has none)."""
    rows = []
    recorded = results.get("scoring")
    readings = results.get("readings") or {}
    for suite, modes in sorted((results.get("intervals") or {}).items()):
        for mode, metrics in modes.items():
            for metric, iv in metrics.items():
                if iv.get("value") is None:
                    continue
                figure = f"{suite}/{metric}" if mode == recorded else f"{suite}/{mode}/{metric}"
                d = ((deltas or {}).get(suite) or {}).get(mode, {}).get(metric) or {}
                rows.append({"round": k, "figure": figure, "mode": mode, "reading": readings.get(mode),
                             "value": iv["value"], "ci_low": iv.get("ci_low"),
                             "ci_high": iv.get("ci_high"), "delta": d.get("delta"),
                             "delta_ci_low": d.get("delta_ci_low"), "delta_ci_high": d.get("delta_ci_high"),
                             "p_value": d.get("p_value"), "n": iv.get("n"),
                             **rule_columns(results, suite, mode, metric)})
    return rows


def rule_columns(results: dict, suite: str, mode: str, metric: str) -> dict[str, Any]:
    """A figure against the best rule that needs no judge (results.json ``rules``: `judgetrain.eval.rules.learned`):
    ``best_rule``, ``over_rule`` (judge minus it) with its interval, and ``learned`` (the interval above 0 on the
    better side); None where the figure has no verdict."""
    v = ((((results.get("rules") or {}).get(suite) or {}).get("learned") or {}).get(mode) or {}).get(metric)
    if not v:
        return {"best_rule": None, "over_rule": None, "over_rule_ci_low": None, "over_rule_ci_high": None,
                "learned": None}
    return {"best_rule": v["rule"], "over_rule": v["delta"], "over_rule_ci_low": v["delta_ci_low"],
            "over_rule_ci_high": v["delta_ci_high"], "learned": v["learned"]}


def write_round_table(out: str | Path, rounds: int) -> Path:
    """Write rounds.json, rounds.csv and rounds.md (see the module doc), log the markdown; returns rounds.json."""
    out = Path(out)
    table = round_table(out, rounds)
    write_json(out / ROUND_TABLE, table)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table["rows"])
    (out / ROUND_TABLE_CSV).write_text(buffer.getvalue(), encoding="utf-8")
    (out / ROUND_TABLE_MD).write_text(markdown(table["rows"]), encoding="utf-8")
    return out / ROUND_TABLE


def markdown(rows: list[dict]) -> str:
    """The table as markdown: a line per figure, a column per round (round 0: the base), each cell the value with
    its 95% interval and, after round 0, the difference against the base with its interval and p."""
    rounds = sorted({r["round"] for r in rows})
    figures = list(dict.fromkeys(row_label(r) for r in rows))
    cell = {(row_label(r), r["round"]): r for r in rows}
    lines = ["| figure (mode: reading) | " + " | ".join("base" if k == 0 else f"round {k}" for k in rounds) + " |",
             "|---|" + "---|" * len(rounds)]
    for figure in figures:
        cells = [format_cell(cell.get((figure, k))) for k in rounds]
        lines.append(f"| {figure} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def format_cell(row: dict | None) -> str:
    if row is None:
        return ""
    text = f"{row['value']:.3f} [{_num(row['ci_low'])}, {_num(row['ci_high'])}]"
    if row["delta"] is not None:
        text += (f"; Δ {row['delta']:+.3f} [{_num(row['delta_ci_low'])}, {_num(row['delta_ci_high'])}], "
                 f"p {_num(row['p_value'])}")
    beside = round_verdict(row)
    return text + (f"; {beside}" if beside else "")


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"
