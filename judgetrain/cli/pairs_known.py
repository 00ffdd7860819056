"""`judgetrain pairs known`: DPO pairs whose direction is known by construction, from `judgetrain perturb`'s items
(judgetrain.perturb.known): the pairwise form (the source against each copy in both orders, no judge needed), the
response form (the question, the source chosen against its error copy, and against its rewrite as a tie: the
implicit-reward judge) or the pointwise
form (a panel's evaluations of the items ranked against the source's score)."""

# Late imports: judgetrain.perturb, judgetrain.data, judgetrain.cli (inside the functions that use them): each
# command loads only what it runs, so `judgetrain --help` and the light commands start without them.

from __future__ import annotations

import logging

from judgetrain.cli.args import ConventionParser, refuse_file
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)


def build_parser() -> ConventionParser:
    from judgetrain.cli.pairs import add_split_and_score_options
    from judgetrain.perturb.known import FORMS, TIES

    p = ConventionParser(prog="judgetrain pairs known", description=__doc__.split("\n\n")[0])
    p.add_argument("--form", choices=FORMS, default="pairwise",
                   help="pairwise: verdict pairs, source against copy in both orders; response: the question, source "
                        "chosen against error copy; pointwise: ranked evaluations")
    p.add_argument("--items", help="pairwise, response: the items `judgetrain perturb` wrote (items.jsonl)")
    p.add_argument("--source", help="pairwise, response: the source samples of the items (perturb's --source)")
    p.add_argument("--source_split", default="train", help="split of a hub dataset or folder (default train)")
    p.add_argument("--spec", help="pairwise, response: the spec the items were made by (a YAML file, or a pack)")
    p.add_argument("--evaluations", help="pointwise: the evaluations of the items, the original set included")
    p.add_argument("--output_dir", "--out", required=True,
                   help="output directory (train/validation parquet, stats, rejects)")
    p.add_argument("--ties", choices=TIES, default="tie",
                   help="a representational copy: a tie verdict / a tie pair (column tie, trained by a recipe's "
                        "tie_model) / a score at the source's (tie, the default), or no pair (drop)")
    p.add_argument("--min_delta", type=float, default=0.5, help="pointwise: minimum score gap of a pair (0.5)")
    p.add_argument("--tie_margin", type=float, default=0.5,
                   help="pointwise: a representational copy's score this near the source's is a tie (0.5)")
    p.add_argument("--max_pairs", type=int, default=5, help="pointwise: at most this many pairs per sample and set (5)")
    add_split_and_score_options(p, scores_for="pointwise: ")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    from judgetrain.data.validate import DataValidationError
    from judgetrain.perturb.known import known_pairs

    try:
        refuse_file(args.output_dir)
        samples = None
        if args.form in ("pairwise", "response"):
            if not (args.items and args.source and args.spec):
                parser.error(f"the {args.form} form needs --items, --source and --spec")
            from judgetrain.perturb.source import read_samples
            from judgetrain.perturb.spec import load_spec

            samples, _ = read_samples(args.source, load_spec(args.spec), split=args.source_split)
        elif not args.evaluations:
            parser.error("the pointwise form needs --evaluations")
        stats = known_pairs(args.output_dir, form=args.form, items=args.items, samples=samples, evaluations=args.evaluations,
                            ties=args.ties, min_delta=args.min_delta, tie_margin=args.tie_margin,
                            max_pairs=args.max_pairs, validation_fraction=args.validation_fraction, seed=args.seed,
                            score_key=args.score_key, scale=tuple(args.scale))
    except DataValidationError as err:  # one line, and no --on_bad_row advice: this command takes none
        raise BadInputError(f"{err.problems[0].describe()} ({err.n_bad_rows} bad row(s)): fix the items") from err
    except (ValueError, FileNotFoundError) as err:
        raise BadInputError(str(err)) from err
    from judgetrain.cli.pairs import show_stats

    return show_stats(stats, args.output_dir)
