"""`judgetrain train RECIPE --dry-run`: check a recipe without loading weights."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DeepSpeedPlugin

from judgetrain.checks.memory import dry_run_memory
from judgetrain.checks.preflight import preflight
from judgetrain.checks.setup import LaunchSetup, setup
from judgetrain.config.packaged import packaged_names
from judgetrain.config.recipe import Recipe, RecipeError, check_tie_rows
from judgetrain.data.io import resolve_local
from judgetrain.data.lengths import audit_lengths
from judgetrain.data.prepare import build_train_dataset, tie_rows
from judgetrain.eval.rows import audit_eval_lengths, recipe_specs, suite_dataset
from judgetrain.models.aliases import is_alias, resolve_model
from judgetrain.models.loading import load_recipe_tokenizer
from judgetrain.models.tiny import ensure_tiny_judge
from judgetrain.run.state import output_dir_in_use, plan_start
from judgetrain.utils.hub import hub_refusal, hub_unreachable, is_hub_id, is_url

logger = logging.getLogger(__name__)

DEFAULT_AUDIT_ROWS = 64


def dry_run(recipe: Recipe) -> dict:
    """Check a recipe without loading weights: the launch's setup sequence (`judgetrain.checks.setup`) with the
    offline substitutes of `DryRunSetup` (schema already parsed; files, accelerate config, data and lengths on the
    first ``audit_rows`` rows), then the memory estimate and the preflight. Hub sources and tokenizers unreachable
    offline are reported, not fatal."""
    report: dict = {"recipe": "ok", "problems": [], "notes": []}
    steps = DryRunSetup(report, recipe.script_args.audit_rows or DEFAULT_AUDIT_ROWS)
    done = setup(recipe, steps)
    report["eval"] = done.eval_suites
    report["memory"] = _memory(recipe, steps.accelerate, report)
    # what would fail at the start of the run, checked on this machine (a dry run on a login node checks the login
    # node's packages, disk and hub cache: run it where the job runs)
    report["preflight"] = preflight(recipe)
    report["preflight"] += done.start  # the output_dir's problems, found before the audit wrote any rejects there
    for problem in report["preflight"]:
        logger.warning("preflight: %s", problem)
    # the launch's verdict: 2 (refused, as the launch would be: EXIT_BAD_INPUT) when any check would stop it
    report["exit_code"] = 2 if report["preflight"] else 0
    return report


class DryRunSetup(LaunchSetup):
    """The launch's setup steps with the dry run's substitutes: nothing locked, pinned, recorded or loaded but the
    tokenizer; the first ``n`` rows of each source; a hub unreachable offline is a note (the bundled samples, the tiny
    judge's tokenizer) where the launch would fail. Writes what it finds into ``report``."""

    def __init__(self, report: dict, n: int):
        self.report, self.n, self.accelerate, self.long_rows = report, n, None, None

    def remote_code(self, recipe: Recipe, warning: str) -> None:
        logger.warning(warning)
        self.report["notes"].append(warning)

    def check(self, recipe: Recipe) -> None:
        """The accelerate config and the training sources named; the preflight comes last (`dry_run`)."""
        script_args = recipe.script_args
        if script_args.accelerate_config:
            if not Path(script_args.accelerate_config).is_file():
                raise RecipeError(f"accelerate_config {script_args.accelerate_config}: file not found; packaged "
                                  f"configs: {', '.join(packaged_names('accelerate_configs'))}")
            cfg = self.accelerate = load_config_from_file(script_args.accelerate_config)
            self.report["accelerate"] = {"distributed_type": str(cfg.distributed_type),
                                         "num_processes": cfg.num_processes}
            if str(cfg.distributed_type).endswith("DEEPSPEED"):  # a missing package: see "preflight"
                self.report["accelerate"]["deepspeed"] = deepspeed_plugin_config(cfg)
        for i, comp in enumerate(script_args.train_datasets):
            src = str(comp.get("source", "bundled"))
            if not _names_a_source(src):
                raise RecipeError(f"train_datasets[{i}].source {src}: file or folder not found (nor a hub id, "
                                  "owner/name)")

    def model_path(self, recipe: Recipe) -> str:
        model = recipe.model_args.model_name_or_path
        return resolve_model(model) if is_alias(model) else model

    def revisions(self, recipe: Recipe, model_path: str) -> dict:
        return {}

    def tokenizer(self, recipe: Recipe, model_path: str):
        model = recipe.model_args.model_name_or_path
        self.long_rows = recipe.script_args.long_rows
        try:
            tokenizer = super().tokenizer(recipe, model_path)
            self.report["tokenizer"] = model
            return tokenizer
        except RecipeError:
            raise
        except Exception as e:
            if not hub_unreachable(e):
                _raise_refused(e, [("model_name_or_path", model)])
        self.report["notes"].append(
            f"tokenizer of {model} unreachable offline; lengths measured with the tiny judge's tokenizer (approximate, "
            "so long rows are counted, not acted on)")
        self.long_rows = "truncate"  # count only
        return load_recipe_tokenizer(ensure_tiny_judge(), recipe.training_args)

    def output_dir(self, recipe: Recipe, revisions: dict) -> list[str]:
        return output_dir_problems(recipe)

    def train_rows(self, recipe: Recipe, tokenizer) -> tuple[Any, dict]:
        """The first ``n`` rows of each source (offline: the bundled samples of the same datasets), audited with the
        recipe's own action: long_rows=error fails the dry run exactly as it would fail the real run."""
        script_args = recipe.script_args
        try:
            dataset = build_train_dataset(recipe, max_rows_each=self.n)
        except RecipeError:
            raise
        except Exception as e:  # the hub is unreachable offline: audit the bundled samples of the same datasets
            sources = [str(comp.get("source", "bundled")) for comp in script_args.train_datasets]
            if not hub_unreachable(e):
                _raise_refused(e, [(f"train_datasets[{i}].source", s) for i, s in enumerate(sources)])
            self.report["notes"].append(f"a hub source is unreachable ({type(e).__name__}); audited the bundled "
                                        "samples instead")
            logger.warning("Dry run: %s; auditing the bundled samples of the same datasets in its place", e)
            script_args.train_datasets = [dict(c, source="bundled") for c in script_args.train_datasets]
            dataset = build_train_dataset(recipe, max_rows_each=self.n)
        self.report["rows_audited"] = len(dataset)
        _, audit = audit_lengths(dataset, tokenizer, recipe.training_args.max_length, self.long_rows, None,
                                 neutralise=True)
        audit["tie_rows"] = tie_rows(dataset)
        self.report["audit"] = audit
        check_tie_rows(script_args, audit["tie_rows"], recipe.path)  # as the launch refuses them: before any model
        return dataset, audit

    def record(self, recipe: Recipe, start, train_dataset, audit: dict, command: str | None):
        return start

    def eval_suites(self, recipe: Recipe, tokenizer) -> dict:
        return _eval_rows(recipe, tokenizer, self.n, self.report)


def output_dir_problems(recipe: Recipe) -> list[str]:
    """What the launch would refuse about output_dir itself: another run holding its lock, or an earlier run in it
    that this start neither resumes nor overwrites (the same lines the launch gives)."""
    script_args, training_args = recipe.script_args, recipe.training_args

    out = Path(training_args.output_dir)
    busy = output_dir_in_use(out)
    if busy:
        return [busy]
    if script_args.resume or script_args.overwrite_output_dir:
        return []
    try:
        plan_start(out, {}, checkpoint=None, resume_asked=False, force=False, overwrite=False)
    except RecipeError as e:
        return [str(e)]
    return []


def _eval_rows(recipe: Recipe, tokenizer, n: int, report) -> dict:
    """The eval suites the run scores, read and validated as its start reads them (every row, the recipe's
    on_bad_row), lengths on the first ``n`` rows of each: a bad eval row or a wrong eval source fails here."""
    script_args, training_args = recipe.script_args, recipe.training_args

    out: dict = {}
    for spec in recipe_specs(recipe):
        src = spec.source or "bundled"
        if not _names_a_source(src):
            raise RecipeError(f"eval_{spec.name}_source {src}: file or folder not found (nor a hub id, owner/name)")
        try:
            rows = suite_dataset(spec, on_bad_row=script_args.on_bad_row, rejects_path=str(
                Path(training_args.output_dir) / "rejects" / f"eval_{spec.name}.jsonl"))
        except RecipeError:
            raise
        except Exception as e:
            if not hub_unreachable(e):
                _raise_refused(e, [(f"eval_{spec.name}_source", src)])
            report["notes"].append(f"eval_{spec.name}_source {src} unreachable offline ({type(e).__name__}); not checked")
            continue
        spec.rows, spec.max_rows = rows.select(range(min(n, len(rows)))), None
        out[spec.name] = {"rows": len(rows), "audit": audit_eval_lengths(
            spec, tokenizer, training_args.max_length or 1 << 30, "skip" if script_args.long_rows == "skip" else
            "truncate_prompt", script_args.eval_scoring)}
    return out


def _memory(recipe: Recipe, cfg, report) -> dict | None:
    """The per-device memory estimate (judgetrain.checks.memory); a model whose shape is unknown offline is a note."""
    script_args = recipe.script_args

    try:
        return dry_run_memory(recipe, cfg)
    except ValueError as e:
        if script_args.gpu:
            raise RecipeError(f"--gpu {script_args.gpu}: cannot estimate memory: {e}") from None
        report["notes"].append(f"memory estimate skipped: {e}")
        return None


def deepspeed_plugin_config(cfg) -> dict:
    """The DeepSpeed config Accelerate's DeepSpeedPlugin builds from an accelerate config's deepspeed_config (the
    plugin needs no deepspeed package; training does)."""

    ds = dict(cfg.deepspeed_config or {})
    if ds.get("deepspeed_config_file"):
        plugin = DeepSpeedPlugin(hf_ds_config=ds["deepspeed_config_file"])
    else:
        plugin = DeepSpeedPlugin(
            zero_stage=int(ds.get("zero_stage", 2)),
            offload_optimizer_device=ds.get("offload_optimizer_device", "none"),
            offload_param_device=ds.get("offload_param_device", "none"),
            zero3_init_flag=bool(ds.get("zero3_init_flag", False)),
            zero3_save_16bit_model=bool(ds.get("zero3_save_16bit_model", False)),
        )
    return plugin.deepspeed_config


def _raise_refused(error: Exception, fields: list[tuple[str, str]]):
    """A load that the hub answered (no such repository or revision, gated, a missing file) or that failed for
    another reason than an unreachable hub: a RecipeError naming the recipe key whose hub id the error names, with
    the hub's own message. An error that names no hub source of the recipe is raised as it is."""
    answer = hub_refusal(error)
    for key, source in fields if answer is not None else ():
        if is_hub_id(source) and source in f"{error}\n{answer}":
            first = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
            raise RecipeError(f"{key} {source}: the hub refused it ({type(answer).__name__}: {first}): check the "
                              "id (owner/name), its revision and your access to it") from error
    raise error


def _names_a_source(source: str) -> bool:
    """Whether a recipe's source names something to read: "bundled", an existing path, a hub id or an http(s) URL
    (fetched when the rows are read: offline, a note), by the data loaders' own rule
    (`judgetrain.data.io.resolve_local`)."""

    if source == "bundled" or is_url(source):
        return True
    try:
        resolve_local(source, "")
    except FileNotFoundError:
        return False
    return True
