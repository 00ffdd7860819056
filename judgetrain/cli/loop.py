"""`judgetrain loop CONFIG`: rounds of the debiasing loop in one resumable command (judgetrain.loop.run): each round
makes or reads its items, has the current judge evaluate them, builds pairs, continues DPO from the last round's
adapter and scores the result against the base; the round table is printed and written.

    judgetrain loop loop.yaml       # killed at any stage, the same command continues where it stopped
    judgetrain loop loop.yaml --smoke   # the same stages on the embedded tiny judge, in under a minute: a smoke run

Exit codes: 0 done, 2 a bad config (or another loop's output_dir, or a training set whose error copies a rule
with no judge separates from their sources: `--allow_shortcuts` trains anyway), else the failing stage's command's
code.
"""

# Late imports: judgetrain.loop, judgetrain.cli, judgetrain.config, judgetrain.run (eval's parser; inside the functions that use them):
# `judgetrain --help` starts without the stages' libraries.

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path

from judgetrain.cli.args import ConventionParser, normalise, unknown_message
from judgetrain.run.layout import ROUND_TABLE_CSV, ROUND_TABLE_MD
from judgetrain.run.state import EXIT_BAD_INPUT
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)


def build_parser() -> ConventionParser:
    parser = ConventionParser(prog="judgetrain loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="the loop's YAML config (docs/loop.md)")
    parser.add_argument("--allow_shortcuts", action="store_true",
                        help="train even where a rule with no judge (shorter, longer, novel-token) separates a "
                             "round's training error copies from their sources above 0.9 (refused by default; "
                             "each figure let through is recorded in the split and the report)")
    parser.add_argument("--data_only", action="store_true",
                        help="round 1's data alone (items, split, pairs; judge where the pairs need it), no training "
                             "and no scoring: prints what the rules with no judge get per type on the training and "
                             "held-out error copies; the same command without it continues from there")
    parser.add_argument("--smoke", action="store_true",
                        help="a smoke run: the same stages on the embedded tiny judge (random weights, no download), "
                             "2 training steps and 8 rows per suite, into <output_dir>-smoke, in under a minute; it "
                             "shows that the config runs here, not what a judge learns")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    from judgetrain.loop.config import SMOKE_MODEL, load_config, smoke_config
    from judgetrain.loop.run import StageFailed, run_loop

    config = load_config(args.config)  # a bad config raises LoopConfigError: the entry's one line, exit code 2
    if args.smoke:
        config = smoke_config(config)
        logger.warning("smoke run: %s (random weights) in place of the config's judge, a few steps and rows, into %s: "
                       "it checks that every stage runs; its figures say nothing about a judge", SMOKE_MODEL,
                       config.output_dir)
    check_eval(config, args.config)
    try:
        result = run_loop(config, allow_shortcuts=args.allow_shortcuts, data_only=args.data_only)
    except StageFailed as err:
        if err.code == EXIT_BAD_INPUT:  # the command refused its input: the same command would refuse it again
            logger.error("%s: it refused its input (its one line above); a rerun of this config stops there again",
                         err)
        else:
            logger.error("%s; rerun the same command to continue from this stage", err)
        return err.code
    if args.data_only:
        print(shortcut_table(result["split"].get("shortcuts")), file=sys.stdout)
        return 0
    print((Path(config.output_dir) / ROUND_TABLE_MD).read_text(encoding="utf-8"), file=sys.stdout)
    logger.info("round table: %s (and %s, %s)", result["table"], ROUND_TABLE_CSV, ROUND_TABLE_MD)
    return 0


def shortcut_table(shortcuts: dict | None) -> str:
    """Per error type, training and held-out copies: copies, edits per copy, mean word change, and the shorter /
    longer / novel-token rules' accuracy against their sources (a markdown table)."""
    if not shortcuts:
        return "no error copy to read (the items have no source texts, or no error type)"
    lines = ["| split | type | copies | edits/copy | words +/- | shorter | longer | novel_token |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for part in ("types", "heldout"):
        for key, f in shortcuts.get(part, {}).items():
            rules = f["rules"]
            lines.append(f"| {'training' if part == 'types' else 'held out'} | {key} | {f['copies']} | "
                         f"{f['edits_per_copy']['mean']:.2f} | {f['token_change']:+.2f} | {rules['shorter']:.3f} | "
                         f"{rules['longer']:.3f} | {rules['novel_token']:.3f} |")
    return "\n".join(lines)


def check_eval(config, where: str) -> None:
    """The eval stage's options through `judgetrain eval`'s own parser, as round 1 runs it (the held-out pairs
    and rewrites named): an unknown option, a value of the wrong type or a suite eval refuses is `LoopConfigError` naming it."""
    from judgetrain.cli.eval import build_parser
    from judgetrain.config.recipe import RENAMED_EVAL_FLAGS
    from judgetrain.loop.config import eval_suites, option_args
    from judgetrain.run.layout import HELDOUT_FILES

    suites, options = eval_suites(config, HELDOUT_FILES)
    argv = ["--model", config.model, "--output_dir", "eval", "--eval_suites", *suites,
            "--eval_scoring", *config.eval.scoring, *(["--eval_max_rows", str(config.eval.max_rows)]
                                                      if config.eval.max_rows else []), *option_args(options)]
    parser = build_parser()
    parser.error = partial(_eval_refused, where)
    try:
        _, _, unknown = parser.parse_args_into_dataclasses(args=normalise(parser, argv), return_remaining_strings=True)
    except BadInputError as err:
        _eval_refused(where, str(err))
    if unknown:
        _eval_refused(where, unknown_message(parser, unknown, RENAMED_EVAL_FLAGS))


def _eval_refused(where: str, message: str) -> None:
    from judgetrain.loop.config import LoopConfigError

    raise LoopConfigError(f"{where}: eval (judgetrain eval's options): {message}")
