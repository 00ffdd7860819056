"""`judgetrain tiny build [--out DIR] [--seed N]`: build the embedded tiny judge (random init, real tokenizer)."""

from __future__ import annotations

import argparse

from judgetrain.models.tiny import __doc__ as _LIBRARY_DOC
from judgetrain.models.tiny import build_tiny_judge, ensure_tiny_judge


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="judgetrain tiny build", description=_LIBRARY_DOC.split("\n\n")[0])
    parser.add_argument("--out", help="directory to write (default: the cache, printed)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_tiny_judge(args.out, seed=args.seed) if args.out else ensure_tiny_judge(seed=args.seed)
    print(path)
    return 0

