"""`judgetrain judge`: run one or many judges over items and write their evaluations as a panel file.

    judgetrain judge --items items.jsonl --judge tiny-judge --output_dir panel
    judgetrain judge --items iknow-lab/JudgeBias-DPO-RefFree --items_split validation \\
        --judge Qwen/Qwen3-8B --judge model=Qwen/Qwen3-8B,adapter=runs/x/checkpoint-500,name=trained \\
        --judge endpoint=https://api.example.com/v1,model=gpt-4o-mini,key_env=OPENAI_API_KEY --output_dir panel
    accelerate launch --num_processes 8 -m judgetrain.cli.judge --items items.parquet --judges_file judges.yaml \\
        --output_dir panel --backend vllm

Writes ``<output_dir>/evaluations.jsonl``: one row per item x judge in the panel schema `judgetrain pairs build`
reads (``sample_id``, ``perturbation_set``, ``perturbation_category``, ``perturbation_rate``, ``judge_model``,
``prompt``, ``evaluation``), the item's other columns, and ``score`` / ``reason`` (the score parser's reading),
``n_tokens``, ``stopped``; ``summary.json`` (per judge: parse rate, reasons, mean score, tokens/s). Killed at any
moment, the same command continues where the committed batches end (`judgetrain.judge.output`); SIGTERM ends it
with exit code 143 after the batch in flight is dropped. Exit codes: 0 done, 1 crashed (or an endpoint's retries ran
out), 2 refused (bad items, bad judge, an endpoint's key, URL or model refused at start, an endpoint refusing the
first prompts alike: an option of the request, another run's output_dir),
143 stopped by a signal. With ``--backend vllm`` a judge whose engine would not fit ``--gpu_memory_utilization`` x the
GPU's memory (weights + one full-context key/value cache) is refused (exit 2) before any model loads.
"""

# Late imports: judgetrain.judge, rich, judgetrain.utils, accelerate, judgetrain.cli, judgetrain.config,
# judgetrain.data, judgetrain.run (inside the functions that use them): each command loads only what it runs, so
# `judgetrain --help` and the light commands (status, cache, report) start without them.

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from judgetrain.cli.args import ConventionParser, console, refuse_file
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging
from judgetrain.utils.numbers import check_scale

logger = logging.getLogger(__name__)

FORCED_MAX_NEW_TOKENS = 4  # after the forced prefix: the score (4, ., 5) and one more


def build_parser() -> ConventionParser:
    p = ConventionParser(prog="judgetrain judge", description=__doc__.split("\n\n")[0],
                         epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--items", required=True, help="JSONL / JSON / parquet file, folder, or hub dataset (owner/name)")
    p.add_argument("--items_split", default="train", help="split of a hub dataset or folder (default train)")
    p.add_argument("--items_revision", help="branch, tag or commit of a hub dataset")
    p.add_argument("--judge", action="append", default=[],
                   help="a model (alias, hub id, folder) or key=value pairs: model=M,adapter=PATH,name=N or "
                        "endpoint=URL,model=NAME,key_env=VAR,name=N (repeatable)")
    p.add_argument("--judges_file", help="YAML list of judges (mappings with the --judge keys)")
    p.add_argument("--output_dir", required=True, help="where the shards, evaluations.jsonl and summary.json go")
    p.add_argument("--force_score_prefix", action="store_true",
                   help="start the judge's turn with judge mode's JSON prefix up to \"overall_score\": , its first "
                        "token one of the score tokens (for judges that do not write the format themselves)")
    p.add_argument("--max_new_tokens", type=int,
                   help=f"tokens written per evaluation (default 512; {FORCED_MAX_NEW_TOKENS} with --force_score_prefix)")
    p.add_argument("--max_length", type=int, help="longest prompt + evaluation (default: the model's context)")
    p.add_argument("--backend", choices=("auto", "transformers", "vllm"), default="auto",
                   help="generation engine of local judges (auto: vLLM with CUDA when installed). On vLLM no "
                        "transformers copy of the weights is loaded: the engine reads the model (and an adapter, as a "
                        "LoRA request) from disk")
    add_gpu_memory_option(p)
    add_batch_options(p)
    p.add_argument("--chunk_size", type=int, default=64,
                   help="items per process per committed batch: what a kill can cost at most (default 64)")
    p.add_argument("--do_sample", action="store_true", help="sample (default greedy)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight per endpoint judge and process")
    add_endpoint_options(p)
    p.add_argument("--on_bad_row", choices=("error", "skip"), default="error",
                   help="bad items: stop naming them (default), or skip them to the rejects file, counted")
    p.add_argument("--rejects_path", help="where skipped items go (default <output_dir>/rejects.jsonl)")
    p.add_argument("--score_key", default="overall_score", help="JSON key of the overall score")
    p.add_argument("--scale", type=float, nargs=2, default=(0.5, 5.5), metavar=("LO", "HI"),
                   help="accepted score range, inclusive (as judgetrain pairs build)")
    p.add_argument("--trust_remote_code", action="store_true", help="allow the model's own Python code (off)")
    return p


def batch_tokens_arg(value: str) -> int | None:
    """``--batch_tokens``: a number of tokens, or ``auto`` (None)."""
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of tokens or auto, got {value!r}") from None


def add_batch_options(p) -> None:
    """``--batch_tokens`` and ``--max_batch_size`` of local generation, on ``p`` (a parser or group): `options` reads
    them."""
    p.add_argument("--batch_tokens", type=batch_tokens_arg, default=None,
                   help="batch size x (prompt + max_new_tokens) per generate call, or auto (default): from the memory "
                        "left after the model loads and its key/value cache per token (half the GPU's free memory; "
                        "on a CPU 32768, less when memory is short); the choice is logged")
    p.add_argument("--max_batch_size", type=int, default=32, help="prompts per generate call at most")


def add_gpu_memory_option(p) -> None:
    """``--gpu_memory_utilization`` of a vLLM engine, on ``p`` (a parser or group): `options` reads it."""
    p.add_argument("--gpu_memory_utilization", type=float, default=0.85,
                   help="a local model on vLLM (a judge; perturb's rewriting model): the share of the GPU's memory "
                        "its engine may take (default 0.85: nothing else of the model is on the GPU, and 0.15 is left "
                        "to this process's CUDA context and what an earlier judge's engine may leave cached; vLLM's "
                        "own default is 0.9; judges-file key "
                        "gpu_memory_utilization). Checked before any model loads: weights + one full-context "
                        "key/value cache must fit in it")


def add_endpoint_options(p) -> None:
    """The retry options of endpoint judges (`judgetrain judge`, and `judgetrain perturb`'s model rewrites)."""
    p.add_argument("--endpoint_timeout_s", type=float, default=120.0,
                   help="endpoint judges: seconds to wait for one response (default 120; judges-file key timeout_s)")
    p.add_argument("--endpoint_max_retries", type=int, default=30,
                   help="endpoint judges: retries per prompt of a 429, 5xx, timeout or dropped connection (default 30; "
                        "judges-file key max_retries)")
    p.add_argument("--endpoint_wait_budget_s", type=float, default=600.0,
                   help="endpoint judges: seconds a prompt may wait for its server between retries in all, long enough "
                        "for a server restart (default 600; judges-file key wait_budget_s)")
    p.add_argument("--retry_rejected", action="store_true",
                   help="endpoint judges: generate again the rows the server refused (reason endpoint_rejected), on "
                        "a resume too (judges-file key retry_rejected)")


def options(args: argparse.Namespace):
    from judgetrain.judge.options import Options

    force = args.force_score_prefix
    backend = args.backend
    if force and backend == "vllm":
        raise ValueError("--force_score_prefix restricts the first token to the score tokens on the transformers "
                         "backend only; use --backend transformers (or auto)")
    if force and backend == "auto":
        backend = "transformers"
    max_new = args.max_new_tokens or (FORCED_MAX_NEW_TOKENS if force else 512)
    for name in ("chunk_size", "batch_tokens", "max_batch_size", "concurrency"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1")
    check_scale(args.scale)
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError(f"--gpu_memory_utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    if args.endpoint_max_retries < 0 or not args.endpoint_timeout_s > 0 or not args.endpoint_wait_budget_s >= 0:
        raise ValueError("--endpoint_max_retries and --endpoint_wait_budget_s must be at least 0, --endpoint_timeout_s "
                         "more than 0")
    return Options(max_new_tokens=max_new, max_length=args.max_length, batch_tokens=args.batch_tokens,
                   max_batch_size=args.max_batch_size, chunk_size=args.chunk_size, backend=backend,
                   do_sample=args.do_sample, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                   force_score_prefix=force, score_key=args.score_key, scale=tuple(args.scale), dtype=args.dtype,
                   concurrency=args.concurrency, trust_remote_code=args.trust_remote_code,
                   endpoint_timeout_s=args.endpoint_timeout_s, endpoint_max_retries=args.endpoint_max_retries,
                   endpoint_wait_budget_s=args.endpoint_wait_budget_s,
                   gpu_memory_utilization=args.gpu_memory_utilization,
                   retry_rejected=args.retry_rejected)


def summary_table(summary: dict):
    from rich.table import Table

    table = Table(title="judgetrain judge: per judge")
    for col in ("judge", "rows", "parse rate", "mean score", "stopped", "tokens/s", "reasons"):
        table.add_column(col, justify="left" if col in ("judge", "reasons") else "right")
    for judge, s in summary.items():
        table.add_row(judge, f"{s['rows']:,}", "-" if s["parse_rate"] is None else f"{s['parse_rate']:.2f}",
                      "-" if s["mean_score"] is None else f"{s['mean_score']:.2f}", f"{s['stopped']:,}",
                      "-" if s["tokens_per_s"] is None else f"{s['tokens_per_s']:.1f}",
                      ", ".join(f"{k} {v}" for k, v in s["reasons"].items()))
    return table


def finished_already(args: argparse.Namespace) -> int | None:
    """0 when the output_dir already holds every evaluation of this command (`judgetrain.judge.resume`: decided
    before torch, transformers or accelerate are imported, the summary printed again); None to start in full."""
    from judgetrain.judge.judges import JudgeSpecError, judge_specs
    from judgetrain.judge.output import REJECTS
    from judgetrain.judge.resume import launch_rank, nothing_left

    out = Path(args.output_dir)
    main = launch_rank() == 0
    setup_logging(main)
    try:
        opts, specs = options(args), judge_specs(args.judge, args.judges_file)
    except (JudgeSpecError, ValueError):
        return None  # the full start refuses it, with the same message
    done = nothing_left(out, args.items, specs, opts, on_bad_row=args.on_bad_row,
                        rejects_path=args.rejects_path or str(out / REJECTS), main=main)
    if done is None:
        return None
    if main:
        print_result(done["summary"], done["evaluations"], done["n_items"] * len(specs), out,
                     done["n_rejected"], done["rejects_path"])
    return 0


def print_result(summary: dict, evaluations: str, rows: int, out: Path, n_rejected: int, rejects_path) -> None:
    console().print(summary_table(summary))
    rejected = f"; {n_rejected} item(s) rejected, see {rejects_path}" if n_rejected else ""
    logger.info("wrote %s (%d rows) and %s%s", evaluations, rows, out / "summary.json", rejected)


def main(argv: list[str] | None = None) -> int:
    from judgetrain.utils.launcher import die_with_launcher

    die_with_launcher()  # torchrun's workers live in sessions of their own: a killed launcher must not leave them
    args = build_parser().parse_args(argv)
    if (code := finished_already(args)) is not None:
        return code
    from accelerate import PartialState

    from judgetrain.cli.eval import _cpu_only
    from judgetrain.config.recipe import RecipeError
    from judgetrain.data.validate import DataValidationError
    from judgetrain.judge.endpoint import EndpointError, RequestRefused
    from judgetrain.judge.fit import preflight_vllm
    from judgetrain.judge.items import read_items
    from judgetrain.judge.judges import JudgeSpecError, judge_specs, preflight_endpoints, preflight_local
    from judgetrain.judge.output import REJECTS
    from judgetrain.judge.runner import run_panel
    from judgetrain.run.state import EXIT_PREEMPTED

    state = PartialState(cpu=_cpu_only())
    setup_logging(state.is_main_process)
    out = Path(args.output_dir)
    try:  # everything that can be refused is, before any model loads
        opts = options(args)
        specs = preflight_endpoints(judge_specs(args.judge, args.judges_file), opts)
        preflight_local(specs)  # each local judge's weights can load: a refused run writes nothing
        refuse_file(out)
        preflight_vllm(specs, opts)  # vLLM judges: the engine can run (adapter, installed) and fits the GPU
        item_set = read_items(args.items, split=args.items_split, on_bad_row=args.on_bad_row,
                              rejects_path=args.rejects_path or str(out / REJECTS), revision=args.items_revision)
        result = run_panel(item_set, specs, opts, out, state)
    except (DataValidationError, JudgeSpecError, RecipeError, FileNotFoundError, ValueError) as err:
        raise BadInputError(str(err)) from err
    except EndpointError as err:  # mid-run: the answers received are committed; a refusal (key, model) is exit 2
        message = f"{err}; the evaluations committed stay, run the same command to continue"
        if err.status in (401, 403, 404) or isinstance(err, RequestRefused):
            raise BadInputError(message) from err
        print(f"judgetrain judge: {message}", file=sys.stderr)
        return 1
    if result["status"] == "stopped":
        return EXIT_PREEMPTED
    if state.is_main_process:
        print_result(result["summary"], result["evaluations"], len(item_set.items) * len(specs), out,
                     item_set.n_rejected, item_set.rejects_path)
    return 0


if __name__ == "__main__":
    from judgetrain.cli import run_command

    sys.exit(run_command("judge", sys.argv[1:]))
