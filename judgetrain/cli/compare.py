"""`judgetrain compare A B`: two saved evaluations side by side, from their per-row files, without scoring again.

    judgetrain compare runs/base-eval/tiny-judge runs/quickstart/eval/40 --output compare.json

A is the baseline, B the evaluation compared to it: each a folder `judgetrain eval` or a run's eval wrote
(``results.json`` with ``<suite>.jsonl``), or a run folder (its latest evaluation). For each headline figure of every
suite and scoring mode both hold, prints A, B, B - A with its 95% bootstrap interval (the same resamples for both) and
a p-value (the exact sign test over each suite's units where the items are right or wrong, else the paired sign-flip
test over units), and "worse" or "better" where `judgetrain.eval.compare.changes` can say so; writes every figure to
``--output`` (JSON). Each row names its mode and reading (``implicit: log_ratio``, ``loglik_mean``); a mode the two
read otherwise (a base's implicit figures are its log-likelihood, a trained judge's its log-ratio) is not differenced
and is named under "not compared". Beside each figure, each judge against the best rule that needs no judge on the
same rows (the shorter / longer / first-shown / novel-token rules, `judgetrain.eval.rules`), from each evaluation's
results.json. The library call is `judgetrain.eval.compare.compare_evaluations`.
"""

# Late imports: rich (inside the functions that use them): each command loads only what it runs, so `judgetrain
# --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from judgetrain.cli.args import ConventionParser, console
from judgetrain.config.recipe import mode_label
from judgetrain.eval.compare import HEADLINE, REGRESSION_ALPHA, EvaluationError, compare_evaluations
from judgetrain.eval.metrics import N_RESAMPLES
from judgetrain.eval.rules import verdict_words
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.files import write_json
from judgetrain.utils.logging import setup_logging
from judgetrain.utils.numbers import nan_to_none

logger = logging.getLogger(__name__)


def build_parser() -> ConventionParser:
    p = ConventionParser(prog="judgetrain compare", description=__doc__.split("\n\n")[0])
    p.add_argument("a", metavar="A", help="the baseline: an evaluation folder or a run folder (its latest eval)")
    p.add_argument("b", metavar="B", help="the evaluation compared to A (same kinds of path)")
    p.add_argument("--output", "--out", default="compare.json", help="the JSON file written (default: ./compare.json)")
    p.add_argument("--suites", nargs="+", help="only these suites (default: every suite both hold)")
    p.add_argument("--all", action="store_true", help="print every figure (per domain, category, bias), not only the "
                                                      "headline ones")
    p.add_argument("--resamples", type=int, default=N_RESAMPLES, help="bootstrap resamples (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the resamples")
    p.add_argument("--regression_margin", type=float, default=0.0,
                   help="mark a figure worse only when its whole interval lies beyond this loss (the figure's units; "
                        "as the recipe key eval_regression_margin; default 0)")
    p.add_argument("--regression_alpha", type=float, default=REGRESSION_ALPHA,
                   help="mark a figure worse or better only when its paired p-value, after Holm across every figure, "
                        "is under this (as the recipe key eval_regression_alpha; default %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    if Path(args.output).is_dir():
        raise BadInputError(f"--output {args.output}: a folder; name the JSON file to write (e.g. "
                            f"{Path(args.output) / 'compare.json'})")
    if args.resamples < 1000:
        logger.warning("--resamples %d: intervals from fewer than 1,000 resamples move with the seed", args.resamples)
    try:
        doc = compare_evaluations(args.a, args.b, n_resamples=args.resamples, seed=args.seed, suites=args.suites,
                                  margin=args.regression_margin, alpha=args.regression_alpha)
    except EvaluationError as exc:
        raise BadInputError(str(exc)) from exc
    _print(doc, args.all)
    write_json(Path(args.output), nan_to_none(doc))
    print(f"written: {args.output}")
    return 0


def _cell(value: Any, low: Any = None, high: Any = None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    text = f"{value:.3f}"
    return text if low is None or not math.isfinite(low) else f"{text} [{low:.3f}, {high:.3f}]"


def _rows(doc: dict[str, Any], every: bool) -> list[list[str]]:
    rows = []
    for suite, modes in doc["suites"].items():
        for mode, figures in modes.items():
            names = list(figures) if every else [m for m in HEADLINE.get(suite, ()) if m in figures]
            for metric in names:
                v = figures[metric]
                p = "-" if v["p_value"] is None else f"{v['p_value']:.3g}{'~' if v['p_method'] == 'sign_flip' else ''}"
                delta = "-" if not math.isfinite(v["delta"]) else (
                    f"{v['delta']:+.3f} [{v['delta_ci_low']:+.3f}, {v['delta_ci_high']:+.3f}]")
                named = f"{suite} ({mode_label(mode, doc['readings']['b'].get(mode))})"  # both sides read it alike
                rows.append([named, metric, _cell(v["a"], v["a_ci_low"], v["a_ci_high"]),
                             _cell(v["b"], v["b_ci_low"], v["b_ci_high"]), delta, p, str(v["n"]),
                             *(_beside_rule(doc, side, suite, mode, metric) for side in ("a", "b")), v["change"]])
    return rows


def _beside_rule(doc: dict[str, Any], side: str, suite: str, mode: str, metric: str) -> str:
    """One side's figure against the best rule that needs no judge, in words; "-" where it has no verdict."""
    v = (((doc.get("rules") or {}).get(side) or {}).get(suite) or {}).get(mode, {}).get(metric)
    return verdict_words(v) if v else "-"


def _print(doc: dict[str, Any], every: bool) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=f"A: {doc['a']}\nB: {doc['b']}", caption=f"95% bootstrap intervals, {doc['n_resamples']} "
                  f"resamples (seed {doc['seed']}), paired by unit; p: exact sign test (right / wrong items), else the "
                  "paired sign-flip test (~); worse / better: p under the threshold after Holm, the interval beyond "
                  "the margin; beside the rules: each judge against the best rule that needs no judge on the same "
                  "rows (learned only where it beats it, the interval of the paired difference excluding 0)")
    for i, h in enumerate(("suite (mode: reading)", "metric", "A", "B", "B - A", "p", "n", "A beside the rules",
                           "B beside the rules", "")):
        table.add_column(h, justify="left" if i in (0, 1, 7, 8, 9) else "right", no_wrap=i < 7 or i == 9)
    for row in _rows(doc, every):
        style = {"worse": "red", "better": "green"}.get(row[-1])
        table.add_row(*row, style=style)
    out.print(table)
    for why in doc["skipped"]:
        out.print(f"not compared: {why}")
