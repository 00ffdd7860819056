"""`judgetrain memory check MODEL_DIR`: the measured peak of real DPO steps on this CPU beside the dry run's estimate
(judgetrain.bench.memory, docs/scale.md)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from judgetrain.bench.memory import check, llama_model_folder
from judgetrain.checks.memory import BUILTIN_SHAPES, OPTIMIZER_IMPLEMENTATIONS
from judgetrain.cli.args import ConventionParser
from judgetrain.utils.errors import BadInputError


def build_parser() -> ConventionParser:
    parser = ConventionParser(prog="judgetrain memory check", description=main.__doc__)
    parser.add_argument("model", help="a model folder, or with --arch the tokenizer folder for a random model")
    parser.add_argument("--lora_r", type=int, default=None)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--words", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--arch", choices=sorted(BUILTIN_SHAPES), help="measure a random model of this shape")
    parser.add_argument("--layers", type=int, default=None, help="with --arch: fewer layers")
    parser.add_argument("--optimizer", choices=OPTIMIZER_IMPLEMENTATIONS, default="fused",
                        help="the AdamW implementation (default fused: the Trainer's adamw_torch_fused; foreach: what "
                             "adamw_torch runs on CUDA; per-parameter: on a CPU)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """judgetrain memory check MODEL_DIR [--lora_r 16] [--checkpointing] [--layers N --arch NAME] [--optimizer foreach]"""

    parser = build_parser()
    args = parser.parse_args(argv)
    folder = Path(args.model)
    if not (folder.is_dir() if args.arch else (folder / "config.json").is_file()):
        what = "a folder" if args.arch else "a model folder (no config.json)"
        raise BadInputError(f"{args.model}: not {what}; give a model folder, or with --arch the folder of a "
                            "tokenizer")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if args.arch:
            model = llama_model_folder(BUILTIN_SHAPES[args.arch], Path(tmp) / "model", args.model, layers=args.layers)
        print(json.dumps(check(model, lora_r=args.lora_r, checkpointing=args.checkpointing, words=args.words,
                               steps=args.steps, output_dir=str(Path(tmp) / "run"), optimizer=args.optimizer)))
    return 0

