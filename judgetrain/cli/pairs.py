"""`judgetrain pairs build`: anchor-consensus, direction-aware DPO pairs from a judge panel's evaluations
(judgetrain.data.pairs), with the statistics table of the dataset card."""

# Late imports: rich (inside the functions that use them): each command loads only what it runs, so `judgetrain
# --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import logging

from judgetrain.cli.args import ConventionParser, console, refuse_file
from judgetrain.data.pairs import PanelDataError, build_pairs
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)


def stats_table(stats: dict):
    """The card's statistics table (plus rejects and skipped samples) as a rich Table."""
    from rich.table import Table

    table = Table(title="DPO pairs", show_header=True)
    table.add_column("Metric")
    table.add_column("Value")
    total = stats["total_pairs"]
    table.add_row("Total pairs", f"{total:,}")
    table.add_row("Train / Validation", f"{stats['train_pairs']:,} / {stats['validation_pairs']:,}")
    table.add_row("Error / Representational",
                  f"{stats['error_pairs']:,} ({stats['error_share']:.0%}) / "
                  f"{stats['represent_pairs']:,} ({stats['represent_share']:.0%})")
    table.add_row("Unique samples", f"{stats['unique_samples']:,} "
                  f"(train {stats['train_samples']}, validation {stats['validation_samples']})")
    if total and stats.get("score_delta_mean") == stats.get("score_delta_mean"):  # NaN: verdict pairs have no scores
        table.add_row("Score delta", f"mean={stats['score_delta_mean']:.2f}, median={stats['score_delta_median']:g}")
    for judge, counts in stats.get("rejects_by_judge", {"all": stats.get("rejects_by_reason", {})}).items():
        detail = ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items())) or "0"
        table.add_row(f"Rejects: {judge}", detail)
    if stats.get("endpoint_rejected_rows"):  # no evaluation to read: the endpoint refused the prompt
        table.add_row("Prompts an endpoint refused", f"{stats['endpoint_rejected_rows']:,}")
    if "skipped_samples" in stats:  # anchor consensus alone
        table.add_row("Skipped samples (anchor)", f"{stats['skipped_samples']} "
                      f"(< {stats['options']['min_represent_evals']} representational scores)")
    return table


def build_parser() -> ConventionParser:
    parser = ConventionParser(
        prog="judgetrain pairs build",
        description="Build anchor-consensus, direction-aware DPO pairs (JudgeBias-DPO-RefFree schema) "
                    "from a judge panel's evaluations.",
    )
    parser.add_argument("--evaluations", required=True, help="jsonl / json / parquet table of judge evaluations")
    parser.add_argument("--output_dir", "--out", required=True,
                        help="output directory (train/validation parquet, stats, rejects)")
    parser.add_argument("--min_delta", type=float, default=0.5, help="minimum score gap of a pair (default 0.5)")
    parser.add_argument("--represent_anchor_margin", type=float, default=1.5,
                        help="drop represent pairs whose chosen score is more than this below the anchor (1.5)")
    parser.add_argument("--error_anchor_margin", type=float, default=2.0,
                        help="drop error pairs whose rejected score is more than this below the anchor (2.0)")
    parser.add_argument("--max_pairs", type=int, default=5, help="at most this many pairs per sample per set (5)")
    parser.add_argument("--min_represent_evals", type=int, default=3,
                        help="skip samples with fewer representational scores for the anchor (3)")
    parser.add_argument("--anchor_sets", choices=("rates", "represent"), default="rates",
                        help="anchor over the representational rate sets (card, default) or every represent set")
    add_split_and_score_options(parser)
    return parser


def add_split_and_score_options(parser: ConventionParser, scores_for: str = "") -> None:
    """The options every pair builder shares: the held-out share and its seed, and how an evaluation's score is read
    (``scores_for``: the form that reads scores, named in the help when not every form does)."""
    parser.add_argument("--validation_fraction", type=float, default=0.1, help="share of samples held out (0.1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, nargs=2, default=(0.5, 5.5), metavar=("LO", "HI"),
                        help=f"{scores_for}accepted overall score range, inclusive (0.5 5.5)")
    parser.add_argument("--score_key", default="overall_score", help=f"{scores_for}JSON key of the overall score")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        refuse_file(args.output_dir)
        stats = build_pairs(
            args.evaluations, args.output_dir, min_delta=args.min_delta,
            represent_anchor_margin=args.represent_anchor_margin, error_anchor_margin=args.error_anchor_margin,
            max_pairs=args.max_pairs, min_represent_evals=args.min_represent_evals,
            validation_fraction=args.validation_fraction, seed=args.seed, scale=tuple(args.scale),
            score_key=args.score_key, anchor_sets=args.anchor_sets,
        )
    except (PanelDataError, ValueError) as err:
        raise BadInputError(str(err)) from err
    return show_stats(stats, args.output_dir)


def show_stats(stats: dict, out: str) -> int:
    """Print the statistics table; the exit code: 1 when no pair was built, else 0."""
    console().print(stats_table(stats))
    if stats["total_pairs"] == 0:
        logger.error("no pairs were built; see %s/stats.json and rejects.jsonl", out)
        return 1
    return 0

