"""`judgetrain eval`: score a model, an adapter, a checkpoint or every checkpoint of a run on the eval suites.

    judgetrain eval --model runs/quickstart --eval_suites rmbench --eval_rmbench_source RM-Bench/data
    accelerate launch --num_processes 8 -m judgetrain.cli.eval --model Qwen/Qwen2.5-7B-Instruct \
        --adapter runs/x/checkpoint-500 --eval_suites rmbench judgebias ideation --eval_scoring implicit

The evaluation options are the recipe's keys, by the same names (`judgetrain.config.recipe.EvalArguments`:
``--eval_suites``, ``--eval_max_rows``, ``--eval_scoring`` (one or several modes: ``implicit generate``),
``--eval_generate_max_rows``, ``--eval_generate_max_new_tokens``, ``--eval_batch_tokens``, ``--eval_<suite>_source``,
``--no_eval_prefix_sharing``, ...; hyphens work too, as in every judgetrain command: ``--eval-max-rows``); the rest
say what to evaluate and where to write. ``--model`` is a hub id, a model directory, an adapter directory
(adapter_config.json: its base model is loaded and the adapter applied), or a run directory: then every
``checkpoint-*/`` inside (by step) and the run's final model/adapter are evaluated in turn. Rows are split over the processes of ``accelerate launch`` and gathered;
every row is scored once. Implicit scoring of an adapter uses the base model (adapter disabled) as the reference;
of a full model it needs ``--ref_model`` (without one the score is the plain log-likelihood, recorded as the reading
``loglik_sum`` and never set against a log-ratio). ``--eval_scoring loglik_sum`` / ``loglik_mean`` read the judge's
own likelihood of each response (summed, per token; an adapter on): one reading for a base and a trained judge. The
reference log-probs are cached across the checkpoints of one run when they share the reference.

Writes, per evaluated model, ``<output_dir>/<name>/results.json`` (flat logged keys, nested metrics, engine stats)
and ``<suite>.jsonl`` (per-row scores; ``<suite>.<mode>.jsonl`` for each other mode, ``<suite>.generate.jsonl``
with the texts written), the files the training callback writes per eval step
(`judgetrain.eval.runner.evaluate_and_write`); prints the RM-Bench table (domains x hard/normal/easy/avg).

``--baseline MODEL`` (a hub id, model or adapter directory, as ``--model``) scores that judge first, on the same rows
and in the same modes, into ``<output_dir>/baseline/``; every model evaluated after it gets, beside each figure,
``eval/<suite>[/<mode>]/delta/<metric>`` (trained - baseline) with its ``delta_ci_low``, ``delta_ci_high`` and
``p_value``, and the categories that got worse are named in a warning and in results.json's ``regressions``. A mode
the two judges read otherwise (a base's implicit mode has no reference: its reading is the log-likelihood, the trained
judge's the log-ratio) gets no difference: results.json's ``not_compared`` and the printed table say so.

Every pairwise figure is also computed by the rules that need no judge (`judgetrain.eval.rules`: the shorter response
wins, the longer wins, the first shown wins, and with ``--rules_train_pairs`` the novel-token rule fitted on those
training pairs) on the same rows, logged as ``eval/<suite>/rule/<rule>/<metric>``, and printed beside the judge with
each figure's verdict: learned only where the judge beats the best rule, the interval of the paired difference
excluding 0.
"""

# Late imports: transformers, judgetrain.config, judgetrain.models, torch, peft, rich, judgetrain.utils, accelerate,
# judgetrain.eval, judgetrain.checks, judgetrain.report (inside the functions that use them): each command loads only what it runs, so `judgetrain --help`
# and the light commands (status, cache, report) start without them.

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from judgetrain.cli.args import console, figure_cell, follow_conventions, normalise, refuse_file, unknown_message
from judgetrain.models.loading import load_tokenizer
from judgetrain.run.checkpoints import list_checkpoints
from judgetrain.utils.device import has_accelerator
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)


def build_parser():
    """The recipe's evaluation options (`EvalArguments`), then the options of this command alone."""
    from transformers import HfArgumentParser

    from judgetrain.config.recipe import EvalArguments, mapping_options

    p = mapping_options(HfArgumentParser(EvalArguments, prog="judgetrain eval", description=__doc__.split("\n\n")[0],
                                         allow_abbrev=False))
    p.add_argument("--model", required=True, help="hub id, model/adapter dir, run dir with checkpoint-*/, or tiny-judge")
    p.add_argument("--adapter", help="peft adapter directory applied on --model")
    p.add_argument("--model_revision", help="branch, tag or commit of the weights and tokenizer that load from the hub "
                   "(--model, or the base an adapter names; default: the revision the adapter recorded, else main)")
    p.add_argument("--adapter_revision", help="branch, tag or commit of a hub adapter (--adapter)")
    p.add_argument("--ref_model", help="reference model for implicit scoring of a full (non-adapter) model")
    p.add_argument("--baseline", help="a judge to compare with (hub id, model or adapter dir): scored first on the same "
                   "rows; each model's figures then carry their paired difference against it")
    p.add_argument("--ideation_mode", choices=("implicit", "pairwise"), default="implicit")
    p.add_argument("--seed", type=int, default=0, help="seed of the row cap sample")
    p.add_argument("--max_length", type=int, help="longest scored sequence (default: the model's context)")
    p.add_argument("--long_inputs", choices=("truncate_prompt", "skip"), default="truncate_prompt",
                   help="longer inputs: cut the prompt from the left (response end kept) or skip the row; counted")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--output_dir", default="judgetrain_eval", help="where results.json and per-row scores go")
    p.add_argument("--on_bad_row", choices=("error", "skip"), default="error",
                   help="bad suite rows: stop naming them (default), or skip them to <output_dir>/rejects-<suite>.jsonl, "
                        "counted")
    p.add_argument("--trust_remote_code", action="store_true", help="allow the model's own Python code (off by default)")
    p.add_argument("--cpu_allocator", choices=("keep", "system"), default="system",
                   help="on CPUs: keep (the large tensors of a batch stay in the heap for the next, not mapped and "
                        "unmapped each batch) or system (the C library's default); see the recipe key")
    p.add_argument("--rules_train_pairs", help="training pairs (chosen = the source, rejected = its error copy: "
                   "`judgetrain pairs known --form response`'s train.parquet) the novel-token rule is fitted on; "
                   "without it that rule is absent (the shorter, longer and first-shown rules need no training items)")
    p.add_argument("--reference_logprobs", help="the eval_reference.json an evaluation of the base model alone wrote "
                   "(same suites, dtype and length rule): implicit scoring of an adapter on that base subtracts its "
                   "log-probs instead of scoring the base again; sequences it lacks are scored")
    return follow_conventions(p)


def parse_args(argv: list[str] | None):
    """(EvalArguments, the other options). An unknown option, an old spelling (``--suites``, ``--max-rows``: now the
    recipe's names) included, exits with code 2 naming the option to use."""
    from judgetrain.config.recipe import RENAMED_EVAL_FLAGS

    parser = build_parser()
    argv = normalise(parser, list(sys.argv[1:] if argv is None else argv))
    eval_args, args, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if unknown:
        parser.error(unknown_message(parser, unknown, RENAMED_EVAL_FLAGS))
    return eval_args, args


# ----------------------------------------------------------------------------------------------- targets
def _is_model_dir(path: Path) -> bool:
    return (path / "adapter_config.json").is_file() or (path / "config.json").is_file()


def find_targets(model: str) -> list[str]:
    """The model(s) to evaluate: a run dir gives its checkpoints by step, then its final model if it has one."""
    path = Path(model)
    if not path.is_dir():
        return [model]
    ckpts = [p for p in list_checkpoints(path) if _is_model_dir(p)]
    if not ckpts:
        return [str(path)]
    return [str(p) for p in ckpts] + ([str(path)] if _is_model_dir(path) else [])


def _resolve(name: str) -> str:
    try:
        from judgetrain.models.aliases import resolve_model
    except ImportError:
        return name
    return resolve_model(name)


def _dtype(name: str):
    import torch

    return "auto" if name == "auto" else getattr(torch, name)


def load_target(target: str, adapter: str | None, args: argparse.Namespace):
    """(model, tokenizer, base name) for one target; an adapter dir loads its base and applies the adapter."""
    from transformers import AutoModelForCausalLM

    kw = dict(dtype=_dtype(args.dtype), trust_remote_code=args.trust_remote_code)
    revision = getattr(args, "model_revision", None)
    target = _resolve(target)
    adapter_dir = adapter
    base = target
    if adapter_dir is None and (Path(target) / "adapter_config.json").is_file():
        adapter_dir = target
        config = json.loads((Path(target) / "adapter_config.json").read_text())
        base = _resolve(config["base_model_name_or_path"])
        revision = revision or config.get("revision")  # the base revision PEFT recorded when it was trained
    at = {"revision": revision} if revision else {}
    model = AutoModelForCausalLM.from_pretrained(base, **kw, **at)
    own = adapter_dir and (Path(adapter_dir) / "tokenizer_config.json").is_file()
    tok_dir = adapter_dir if own else base
    tokenizer = load_tokenizer(tok_dir, trust_remote_code=args.trust_remote_code, revision=None if own else revision)
    if not getattr(tokenizer, "chat_template", None):
        logger.warning("the tokenizer of %s has no chat template: conversational rows are scored as plain text (message "
                       "contents joined, roles dropped), as for a base model. Use an instruct model's tokenizer to score "
                       "in chat format.", tok_dir)
    if adapter_dir:
        from peft import PeftModel

        trained_on = json.loads((Path(adapter_dir) / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if trained_on and Path(str(trained_on)).name != Path(str(base)).name:
            # e.g. a tiny-judge build with another fingerprint: the adapter's deltas mean nothing on other weights
            logger.warning("adapter %s was trained on %s, but is applied to %s: scores are not those of the trained "
                           "model", adapter_dir, trained_on, base)
        adapter_at = getattr(args, "adapter_revision", None)
        model = PeftModel.from_pretrained(model, adapter_dir, **({"revision": adapter_at} if adapter_at else {}))
    return model, tokenizer, base


def _name(target: str, root: str, n_targets: int) -> str:
    """Output folder name: the checkpoint's name, "final" for a run dir's own model, else the model's name."""
    if target != root:
        return Path(target).name
    if n_targets > 1:
        return "final"
    return Path(target).name if Path(target).is_dir() else target.replace("/", "__")


# ----------------------------------------------------------------------------------------------- output
def print_table(name: str, results: dict[str, Any], doc: dict[str, Any]) -> None:
    """The suites' own tables and the other figures, each named with the mode and reading it is (``doc``: the
    evaluation's results.json)."""
    from rich.table import Table

    from judgetrain.config.recipe import mode_label
    from judgetrain.eval.benchmarks import get_suite
    from judgetrain.eval.rules import is_rule_key
    from judgetrain.report.headline import key_mode

    readings, bare = doc.get("readings") or {}, doc.get("scoring")

    out = console()
    tabled = set()
    for suite_name, r in results.items():
        figures = get_suite(suite_name).table(r.metrics)
        if figures is None:
            continue
        tabled.add(suite_name)
        table = Table(title=f"{figures.title}: {name}" + (f" ({mode_label(bare, readings.get(bare))})" if bare else ""))
        for i, col in enumerate(figures.columns):
            table.add_column(col, justify="left" if i == 0 else "right")
        for row in figures.rows:
            table.add_row(*row)
        table.add_row(*figures.total, style="bold")
        out.print(table)
        for note in figures.notes:
            out.print(note)
    other = {k: v for name_, r in results.items() for k, v in r.flat().items()
             if (name_ not in tabled or k.split("/")[2] in r.modes)  # a tabled suite's bare figures are in its table
             and not is_rule_key(k)}  # the rules' figures: their own table
    if other:
        table = Table(title=f"Checks: {name}")
        table.add_column("metric")
        table.add_column("mode: reading")
        table.add_column("value", justify="right")
        for k, v in other.items():
            mode = key_mode(k, bare)
            table.add_row(k, mode_label(mode, readings.get(mode)) if mode else "-", figure_cell(k, v))
        out.print(table)


def print_rules(name: str, doc: dict[str, Any]) -> None:
    """The table of the judge's figures beside the rules that need no judge (`judgetrain.eval.rules.rule_table` of
    the evaluation's results.json document)."""
    from rich.table import Table

    from judgetrain.eval.rules import LEARNED_RULE, rule_table

    columns, rows = rule_table(doc)
    if not rows:
        return
    table = Table(title=f"The judge beside the rules that need no judge: {name}")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i in (0, len(columns) - 1) else "right")
    for row in rows:
        table.add_row(*row)
    out = console()
    out.print(table)
    out.print(f"Learned: {LEARNED_RULE}.")


def _cpu_only() -> bool:
    """True without an accelerator: accelerate then needs ``cpu=True`` to join the processes of a multi-process
    launch (``accelerate launch --multi_gpu --num_processes 2`` or ``torchrun`` on a CPU box) over gloo."""

    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    return not has_accelerator()


def refuse(args: argparse.Namespace) -> None:
    """Refuses (`BadInputError`, one line: the fix) the command's own options that cannot run, before any weights
    load: an output_dir that is a file, a model, adapter, reference or baseline that cannot load here."""
    from judgetrain.checks.preflight import model_problem

    try:
        refuse_file(args.output_dir)
    except ValueError as err:
        raise BadInputError(str(err)) from None
    run_dir = Path(args.model).is_dir() and list_checkpoints(Path(args.model))  # its checkpoints are the models
    problem = next(filter(None, (model_problem(name, option) for option, name in (
        ("--model", None if run_dir else args.model), ("--adapter", args.adapter), ("--ref_model", args.ref_model),
        ("--baseline", args.baseline)) if name)), None)
    if problem:
        raise BadInputError(problem)
    if args.reference_logprobs and not Path(args.reference_logprobs).is_file():
        raise BadInputError(f"--reference_logprobs {args.reference_logprobs}: no such file (a base evaluation's "
                            "eval_reference.json)")


def load_rows(specs: list, args: argparse.Namespace) -> None:
    """Each suite's rows read once, its cap applied (every checkpoint is scored on the same rows); bad rows refused,
    or with ``--on_bad_row skip`` written to ``<output_dir>/rejects-<suite>.jsonl`` and counted. Rows that cannot be
    read are a `BadInputError` naming them."""
    from judgetrain.eval.suites import load_suite_dataset, load_suite_rows

    try:
        for spec in specs:
            if args.on_bad_row == "skip":
                spec.rows = [dict(r) for r in load_suite_dataset(
                    spec, on_bad_row="skip", rejects_path=str(Path(args.output_dir) / f"rejects-{spec.name}.jsonl"))]
            spec.rows = load_suite_rows(spec)
            spec.max_rows = None
    except (ValueError, FileNotFoundError) as err:  # DataValidationError is a ValueError
        raise BadInputError(f"cannot load eval data: {err}") from err


def training_tokens(args: argparse.Namespace):
    """The novel-token rule fitted on ``--rules_train_pairs`` (None without it); a file that cannot be read, or rows
    that are not response pairs, are a `BadInputError` naming the file and row."""
    if not args.rules_train_pairs:
        return None
    from judgetrain.eval.rules import read_training_pairs

    try:
        return read_training_pairs(args.rules_train_pairs)
    except BadInputError as err:
        raise BadInputError(f"--rules_train_pairs: {err}") from None
    except (ValueError, FileNotFoundError) as err:
        raise BadInputError(f"--rules_train_pairs {args.rules_train_pairs}: {err}") from None


def evaluation_of(eval_args, args: argparse.Namespace):
    """The `judgetrain.eval.session.Evaluation` of this command's options."""
    from judgetrain.eval.session import Evaluation

    return Evaluation(eval_args, max_length=args.max_length, long_inputs=args.long_inputs,
                      model_revision=getattr(args, "model_revision", None), seed=args.seed,
                      ideation_mode=args.ideation_mode)


def runs(args: argparse.Namespace) -> list[tuple[str, str, str | None, bool]]:
    """(name, target, adapter, baseline?) of each model evaluated: the baseline first (its per-item figures are kept
    for the others), then each target of ``--model``. An alias that cannot be had here is a `BadInputError`."""
    try:
        root = _resolve(args.model)
    except ValueError as err:  # e.g. its package is not installed: say how
        raise BadInputError(str(err)) from None
    targets = find_targets(root)
    return ([("baseline", args.baseline, None, True)] if args.baseline else []) + [
        (_name(target, root, len(targets)), target, args.adapter, False) for target in targets]


def load_checked(target: str, adapter: str | None, args: argparse.Namespace, verdict: bool):
    """`load_target`, with a model that cannot load, and a tokenizer without the verdict tokens, refused in one line."""
    from judgetrain.eval.suites import check_verdict_tokens

    try:
        model, tokenizer, base = load_target(target, adapter, args)
        if verdict:
            check_verdict_tokens(tokenizer)
    except BadInputError:
        raise
    except (OSError, ValueError, KeyError) as err:  # missing dir, no weights, bad adapter_config: say which
        raise BadInputError(f"cannot load model {target}" + (f" with adapter {adapter}" if adapter else "")
                            + f": {type(err).__name__}: {err}") from err
    return model, tokenizer, base


def load_reference(args: argparse.Namespace, device):
    """The ``--ref_model`` of implicit scoring of a full model, on ``device`` (None without one)."""
    if not args.ref_model:
        return None
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(_resolve(args.ref_model), dtype=_dtype(args.dtype),
                                                trust_remote_code=args.trust_remote_code).to(device)


def evaluate_target(evaluation, specs: list, run: tuple, args: argparse.Namespace, state, shared: dict):
    """Score one model (``run``: name, target, adapter, baseline?) on ``specs`` and write its files. ``shared``:
    what the models evaluated in turn share (the reference model and its cache, the baseline's figures)."""
    from judgetrain.eval.reference import read_base_reference
    from judgetrain.eval.runner import evaluate_and_write
    from judgetrain.eval.suites import verdict_suites

    name, target, adapter, _ = run
    verdict = bool(verdict_suites([s.name for s in specs], evaluation.modes))
    model, tokenizer, base = load_checked(target, adapter, args, verdict)
    model.to(state.device)
    engine = evaluation.engine(model, tokenizer, ref_model=shared["ref_model"], ref_cache=shared["ref_cache"],
                               ref_key=("ref:" + args.ref_model) if args.ref_model else "base:" + base)
    if args.reference_logprobs and engine.has_reference and not engine.scores_its_own_reference:
        shared["ref_cache"].update(read_base_reference(args.reference_logprobs, engine))
    generator = evaluation.generator(model, tokenizer)
    try:
        return evaluate_and_write(engine, specs, Path(args.output_dir) / name, state=state, modes=evaluation.modes,
                                  generator=generator, model=target, adapter=adapter, baseline=shared["baseline"],
                                  novel=shared["novel"], baseline_readings=shared["baseline_readings"],
                                  cpu_allocator=shared["cpu_allocator"], **evaluation.regression)
    finally:
        if generator is not None:  # a vLLM engine per model evaluated: each goes before the next starts
            generator.close()


def report(name: str, results: dict, doc: dict, args: argparse.Namespace, state) -> None:
    """The warning naming the categories worse than the baseline, and the tables (main process)."""
    if not state.is_main_process:
        return
    if doc.get("regressions"):
        logger.warning("%s: %d categories worse than the baseline %s (%s): %s", name, len(doc["regressions"]),
                       args.baseline, doc["worse_rule"], ", ".join(doc["regressions"]))
    print_table(name, results, doc)
    for why in doc.get("not_compared") or []:
        console().print(f"not compared with the baseline: {why}")
    print_rules(name, doc)


def main(argv: list[str] | None = None) -> int:
    """`judgetrain eval`. Bad input raises `BadInputError` (the `judgetrain` entry prints its one line, exit 2)."""
    from accelerate import PartialState

    from judgetrain.config.recipe import remote_code_warning
    from judgetrain.eval.runner import current_items
    from judgetrain.utils.allocator import apply_cpu_allocator
    from judgetrain.utils.launcher import die_with_launcher
    from judgetrain.utils.numbers import nan_to_none

    die_with_launcher()  # torchrun's workers live in sessions of their own: a killed launcher must not leave them
    eval_args, args = parse_args(argv)  # an EvalArguments value refused (an unknown suite): RecipeError
    state = PartialState(cpu=_cpu_only())
    setup_logging(state.is_main_process)
    warning = remote_code_warning(["--trust_remote_code"] if args.trust_remote_code else [], args.model)
    if warning and state.is_main_process:
        logger.warning(warning)
    refuse(args)
    allocator = apply_cpu_allocator(args.cpu_allocator, state.device.type == "cpu")
    evaluation = evaluation_of(eval_args, args)
    specs = evaluation.suite_specs()
    load_rows(specs, args)
    novel = training_tokens(args)  # read and checked before any model loads
    # shared by the models: the reference and its cache (keys name the reference weights and the tokens), the baseline
    shared = {"ref_model": load_reference(args, state.device), "ref_cache": {}, "baseline": None,
              "novel": novel, "baseline_readings": None, "cpu_allocator": allocator}
    summary = {}
    for run in runs(args):
        results, doc = evaluate_target(evaluation, specs, run, args, state, shared)
        if run[3]:
            shared["baseline"] = current_items(results, evaluation.modes)
            shared["baseline_readings"] = doc["readings"]  # a mode the baseline reads otherwise is not differenced
        summary[run[0]] = doc["metrics"]
        report(run[0], results, doc, args, state)
    if state.is_main_process:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / "summary.json").write_text(json.dumps(nan_to_none(summary), indent=1))
    state.wait_for_everyone()
    return 0


if __name__ == "__main__":
    from judgetrain.cli import run_command

    sys.exit(run_command("eval", sys.argv[1:]))
