"""`judgetrain tiny build [--output_dir DIR] [--seed N]`: build the embedded tiny judge (random init, real
tokenizer)."""

from __future__ import annotations


from judgetrain.cli.args import ConventionParser, refuse_file
from judgetrain.models.tiny import __doc__ as _LIBRARY_DOC
from judgetrain.models.tiny import build_tiny_judge, ensure_tiny_judge
from judgetrain.utils.errors import BadInputError


def build_parser() -> ConventionParser:
    parser = ConventionParser(prog="judgetrain tiny build", description=_LIBRARY_DOC.split("\n\n")[0])
    parser.add_argument("--output_dir", "--out", help="directory to write (default: the cache, printed)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        refuse_file(args.output_dir or ".")
    except ValueError as err:
        raise BadInputError(str(err)) from err
    path = build_tiny_judge(args.output_dir, seed=args.seed) if args.output_dir else ensure_tiny_judge(seed=args.seed)
    print(path)
    return 0

