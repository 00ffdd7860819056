"""`judgetrain loop CONFIG`: rounds of the debiasing loop in one resumable command (judgetrain.loop.run): each round
makes or reads its items, has the current judge evaluate them, builds pairs, continues DPO from the last round's
adapter and scores the result against the base; the round table is printed and written.

    judgetrain loop loop.yaml       # killed at any stage, the same command continues where it stopped

Exit codes: 0 done, 2 a bad config (or another loop's output_dir), else the failing stage's command's code.
"""

# Late imports: judgetrain.loop (inside the functions that use them): `judgetrain --help` starts without the stages'
# libraries.

from __future__ import annotations

import logging
import sys
from pathlib import Path

from judgetrain.cli.args import ConventionParser
from judgetrain.run.layout import ROUND_TABLE_CSV, ROUND_TABLE_MD
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)


def build_parser() -> ConventionParser:
    parser = ConventionParser(prog="judgetrain loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="the loop's YAML config (docs/loop.md)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    from judgetrain.loop.config import load_config
    from judgetrain.loop.run import StageFailed, run_loop

    config = load_config(args.config)  # a bad config raises LoopConfigError: the entry's one line, exit code 2
    try:
        result = run_loop(config)
    except StageFailed as err:
        logger.error("%s; rerun the same command to continue from this stage", err)
        return err.code
    print((Path(config.output_dir) / ROUND_TABLE_MD).read_text(encoding="utf-8"), file=sys.stdout)
    logger.info("round table: %s (and %s, %s)", result["table"], ROUND_TABLE_CSV, ROUND_TABLE_MD)
    return 0
