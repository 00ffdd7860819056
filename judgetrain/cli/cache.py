"""`judgetrain cache list | clear | path`: the models judgetrain built into its cache."""

from __future__ import annotations

import shutil

from judgetrain.cli.args import ConventionParser
from judgetrain.models.cache import NOT_ENTRIES, list_entries
from judgetrain.models.cache import __doc__ as _LIBRARY_DOC
from judgetrain.utils.files import cache_root


def build_parser() -> ConventionParser:
    parser = ConventionParser(prog="judgetrain cache", description=_LIBRARY_DOC.split("\n\n")[0])
    parser.add_argument("action", choices=["list", "clear", "path"], help="list the entries, remove them, or print the root")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    root = cache_root()
    if args.action == "path":
        print(root)
    elif args.action == "list":
        entries = list_entries()
        if not entries:
            print(f"{root}: empty")
        for e in entries:
            print(f"{e['entry']:48s} {e['bytes'] / 1e6:9.1f} MB  {e['state']}")
    else:
        n = 0
        if root.is_dir():
            for p in root.iterdir():
                if p.is_dir() and p.name not in NOT_ENTRIES:
                    shutil.rmtree(p, ignore_errors=True)
                    n += 1
                elif p.suffix == ".lock":
                    p.unlink(missing_ok=True)
        print(f"removed {n} entries from {root}")
    return 0

