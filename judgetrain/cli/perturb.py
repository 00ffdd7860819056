"""`judgetrain perturb`: source samples and a perturbation spec -> the perturbed items `judgetrain judge` reads.

    judgetrain perturb --source recipes.jsonl --spec materials --output_dir perturbed
    judgetrain perturb --source answers.jsonl --spec style --model smollm2-135m-instruct --output_dir styled
    judgetrain perturb --source notes.parquet --spec my_domain.yaml --sets dose_error --seed 3 --output_dir notes
    accelerate launch --num_processes 4 -m judgetrain.cli.perturb --source recipes.jsonl --spec materials \\
        --model Qwen/Qwen3-8B --backend vllm --output_dir perturbed

``--spec`` is a YAML file or a pack shipped with judgetrain (materials, style). Rule operators run here; model
rewrites run with ``--model`` (a local model or ``endpoint=URL,model=NAME,key_env=VAR``, as ``judgetrain judge
--judge`` takes it) on the engine of `judgetrain judge`: batched, sharded over processes, resumable (run the same
command again after a kill); without ``--model`` a model operator's ``stand_in`` rule operators make its set, and a
model set without one is left out (said in the log and the summary). Writes ``<output_dir>/items.jsonl`` (the items),
``rejects.jsonl`` (items that failed their checks, with the reason) and ``summary.json`` (per set: items, edits per
item, rejects by reason; per error set the mean change in words of a copy and the accuracy of the shorter, longer
and novel-token rules on its copies against their sources, the novel-token rule fitted on other samples: a figure
near 1 is a tell a judge will learn instead of the error). Bad source rows stop the command before any model loads,
naming file, row and field. An endpoint's key variable, URL and model list are checked before any work, as `judgetrain judge` checks them.
Exit codes: 0 done, 1 an endpoint's retries ran out mid-run, 2 refused (bad spec, bad source rows, an endpoint's
key, URL or model), 143 stopped by a signal.
"""

# Late imports: rich, judgetrain.data, judgetrain.judge, judgetrain.perturb, judgetrain.utils, judgetrain.cli,
# accelerate (inside the functions that use them): each command loads only what it runs, so `judgetrain --help` and
# the light commands (status, cache, report) start without them.

from __future__ import annotations

# The library is imported inside main: `--help` and a refused spec answer at once, and a run of rule operators alone
# never imports accelerate or torch.
import logging
import sys
from dataclasses import replace
from pathlib import Path

from judgetrain.cli.args import ConventionParser, console, refuse_file
from judgetrain.cli.judge import add_batch_options, add_endpoint_options, add_gpu_memory_option, options
from judgetrain.run.state import EXIT_PREEMPTED
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)


def build_parser() -> ConventionParser:
    p = ConventionParser(prog="judgetrain perturb", description=__doc__.split("\n\n")[0],
                         epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--source", required=True, help="JSONL / JSON / parquet file, folder, or hub dataset (owner/name)")
    p.add_argument("--source_split", default="train", help="split of a hub dataset or folder (default train)")
    p.add_argument("--source_revision", help="branch, tag or commit of a hub dataset")
    p.add_argument("--spec", required=True, help="perturbation spec: a YAML file, or a pack (materials, style)")
    p.add_argument("--sets", nargs="+", help="only these sets of the spec (default: all)")
    p.add_argument("--seed", type=int, help="the draw of rule edits, and of sampled rewrites with --do_sample "
                                            "(default: the spec's seed); finished greedy rewrites are kept")
    p.add_argument("--output_dir", required=True, help="where items.jsonl, rejects.jsonl and summary.json go")
    p.add_argument("--on_bad_row", choices=("error", "skip"), default="error",
                   help="bad source rows: stop naming them (default), or skip them to the rejects file, counted")
    p.add_argument("--rejects_path", help="where skipped source rows go (default <output_dir>/source_rejects.jsonl)")
    g = p.add_argument_group("model rewrites (the options of judgetrain judge)")
    g.add_argument("--model", help="the rewriting model: an alias, hub id or folder, or key=value pairs "
                                   "(model=M,adapter=PATH,name=N or endpoint=URL,model=NAME,key_env=VAR,name=N)")
    g.add_argument("--max_new_tokens", type=int, default=512, help="tokens per rewrite at most (default 512)")
    g.add_argument("--max_length", type=int, help="longest prompt + rewrite (default: the model's context)")
    g.add_argument("--backend", choices=("auto", "transformers", "vllm"), default="auto")
    add_gpu_memory_option(g)
    add_batch_options(g)
    g.add_argument("--chunk_size", type=int, default=64, help="rewrites per process per committed batch")
    g.add_argument("--do_sample", action="store_true", help="sample (default greedy)")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top_p", type=float, default=1.0)
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight for an endpoint, per process")
    g.add_argument("--trust_remote_code", action="store_true", help="allow the model's own Python code (off)")
    add_endpoint_options(g)
    p.set_defaults(force_score_prefix=False, score_key="overall_score", scale=(0.5, 5.5))
    return p


RULE_COLUMNS = ("shorter", "longer", "novel_token")  # judgetrain.perturb.shortcuts.CHECKED (imported late there)


def summary_table(summary: dict):
    from rich.table import Table

    table = Table(title=f"judgetrain perturb: {summary['spec']} (seed {summary['seed']}), per set")
    for col in ("set", "category", "method", "items", "rejected", "edits/item", "words +/-", *RULE_COLUMNS,
                "rejects"):
        table.add_column(col, justify="left" if col in ("set", "category", "method", "rejects") else "right")
    for name, s in summary["sets"].items():
        edits, rules = s["edits_per_item"], s.get("rules") or {}
        table.add_row(name, s["category"], s["method"], f"{s['items']:,}", f"{s['rejected']:,}",
                      "-" if edits is None else f"{edits['mean']:.2f} ({edits['min']}-{edits['max']})",
                      f"{s['token_change']:+.2f}" if "token_change" in s else "-",
                      *(f"{rules[r]:.3f}" if r in rules else "-" for r in RULE_COLUMNS),
                      ", ".join(f"{k} {v}" for k, v in s["rejects"].items()))
    return table


def main(argv: list[str] | None = None) -> int:
    from judgetrain.data.validate import DataValidationError
    from judgetrain.judge.endpoint import EndpointError, RequestRefused
    from judgetrain.judge.judges import JudgeSpecError, parse_judge, preflight_endpoints
    from judgetrain.perturb.build import perturb, plan
    from judgetrain.perturb.source import read_samples
    from judgetrain.perturb.spec import SpecError, load_spec, select_sets
    from judgetrain.utils.launcher import die_with_launcher

    die_with_launcher()
    args = build_parser().parse_args(argv)
    out = Path(args.output_dir)
    from judgetrain.judge.resume import launch_rank

    setup_logging(launch_rank() == 0)
    try:  # everything that can be refused is, before any model loads
        spec = select_sets(load_spec(args.spec, seed=args.seed), args.sets)
        refuse_file(out)
        rewriter = parse_judge(args.model, "--model") if args.model else None
        if rewriter is not None:  # judge's endpoint rules: key variable, URL and GET /models, before any work
            # greedy rewrites do not depend on the seed: --seed redraws rule edits, finished rewrites are kept
            opts = replace(options(args), seed=spec.seed if args.do_sample else 0)
            rewriter = preflight_endpoints([rewriter], opts)[0]
        samples, read = read_samples(args.source, spec, split=args.source_split, on_bad_row=args.on_bad_row,
                                     rejects_path=args.rejects_path or str(out / "source_rejects.jsonl"),
                                     revision=args.source_revision)
        models = any(p.method == "model" for p in plan(spec, samples, with_model=rewriter is not None)[0])
        state = None
        if not models and launch_rank() != 0:
            return 0  # rule operators only: the main process writes everything, the others have nothing to do
        if models:
            state = process_state()
        result = perturb(spec, samples, out, rewriter=rewriter if models else None, opts=opts if models else None,
                         state=state)
    except (DataValidationError, SpecError, JudgeSpecError, FileNotFoundError, ValueError) as err:
        raise BadInputError(str(err)) from err
    except EndpointError as err:  # mid-run, as judge: the rewrites committed stay; a refused key or model is exit 2
        message = f"{err}; the rewrites committed stay, run the same command to continue"
        if err.status in (401, 403, 404) or isinstance(err, RequestRefused):
            raise BadInputError(message) from err
        print(f"judgetrain perturb: {message}", file=sys.stderr)
        return 1
    if result["status"] == "stopped":
        return EXIT_PREEMPTED
    if "summary" in result:
        console().print(summary_table(result["summary"]))
        logger.info("wrote %s (%d items from %d samples), %s (%d rejected), %s", result["items"], result["n_items"],
                    len(samples), result["rejects"], result["n_rejected"], out / "summary.json")
        if read["rejected"]:
            logger.warning("%d source row(s) skipped as bad, see %s", read["rejected"], read["rejects_path"])
    return 0


def process_state():
    """accelerate's process state (one process, or each of an ``accelerate launch``), CPU-only where judge runs so."""
    from accelerate import PartialState

    from judgetrain.cli.eval import _cpu_only

    state = PartialState(cpu=_cpu_only())
    setup_logging(state.is_main_process)
    return state


if __name__ == "__main__":
    from judgetrain.cli import run_command

    sys.exit(run_command("perturb", sys.argv[1:]))
