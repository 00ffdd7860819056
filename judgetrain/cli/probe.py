"""`judgetrain probe`: what a base judge can see before any training (judgetrain.probe): on `judgetrain perturb`'s
items, the share of pairs where the source beats its error copy, where it beats its rewrite, and where a rewrite beats
an error copy of the same source, in every scoring mode and by a linear probe of the frozen hidden states, each with a
95% interval over source samples.

    judgetrain probe --items perturbed/items.jsonl --source recipes.jsonl --spec materials \\
        --model smollm2-135m-instruct --output_dir probe

Writes ``<output_dir>/probe.json`` and logs the table. A missing items file, items without error copies, an unknown
``--types`` entry, a bad source row or a model that cannot load: one line, exit 2, before any weights load.
"""

# Late imports: judgetrain.probe (inside main): `judgetrain --help` and a refused option answer without torch.

from __future__ import annotations

import logging

from judgetrain.cli.args import ConventionParser, refuse_file
from judgetrain.probe import MODES
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)


def build_parser() -> ConventionParser:
    p = ConventionParser(prog="judgetrain probe", description=__doc__.split("\n\n")[0],
                         epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--items", required=True, help="the items `judgetrain perturb` wrote (items.jsonl)")
    p.add_argument("--source", required=True, help="the source samples the items were made from (perturb's --source)")
    p.add_argument("--source_split", default="train", help="split of a hub dataset or folder (default train)")
    p.add_argument("--spec", required=True, help="the spec the items were made by (a YAML file, or a pack)")
    p.add_argument("--model", required=True,
                   help="alias, hub id or folder (model=M,adapter=PATH as `judgetrain judge --judge` takes it)")
    p.add_argument("--output_dir", "--out", required=True, help="where probe.json goes")
    p.add_argument("--types", nargs="+", help="only these perturbation types (default: all the items hold)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="zero-shot scoring modes to read (default: all three)")
    p.add_argument("--layers", type=int, nargs="+",
                   help="hidden layers the probe reads, 1 = the first (default: a third, two thirds and the last)")
    p.add_argument("--l2", type=float, default=1.0, help="the probe's L2 penalty on scaled features (1.0)")
    p.add_argument("--holdout_fraction", type=float, default=0.25,
                   help="share of source samples held out of the probe's fit (0.25); the type-out probe "
                        "deals the samples into 1/share folds")
    p.add_argument("--verdict_cross", type=int, default=1,
                   help="verdict mode: rewrites read against each error copy, drawn with the seed (1; 0: none)")
    p.add_argument("--max_samples", type=int, help="at most this many source samples, drawn with the seed")
    p.add_argument("--seed", type=int, default=0, help="the held-out samples, the draws and the resamples (0)")
    p.add_argument("--n_resamples", type=int, default=1000, help="bootstrap resamples of each interval (1000)")
    p.add_argument("--batch_tokens", type=int, default=8192, help="padded tokens per forward batch (8192)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the model's weights (float32)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    from judgetrain.probe.run import ProbeOptions, prepare, run_probe

    options = ProbeOptions(items=args.items, source=args.source, spec=args.spec, model=args.model,
                           output_dir=args.output_dir, source_split=args.source_split, types=args.types,
                           modes=list(dict.fromkeys(args.modes)), layers=args.layers, l2=args.l2,
                           holdout_fraction=args.holdout_fraction, verdict_cross=args.verdict_cross,
                           max_samples=args.max_samples, seed=args.seed, n_resamples=args.n_resamples,
                           batch_tokens=args.batch_tokens, dtype=args.dtype)
    refuse_file(args.output_dir)
    try:
        probe = prepare(options)
    except ValueError as err:
        raise BadInputError(str(err)) from err
    run_probe(options, probe)  # its BadInputError (the verdict tokens, the layers) is the entry's one line too
    return 0
