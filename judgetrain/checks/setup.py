"""The run's setup sequence, written once: `judgetrain.train.run_recipe` runs it with the launch's steps
(`LaunchSetup`) and the dry run (`judgetrain.checks.dry_run`) with its offline substitutes (`DryRunSetup` there).

    done = setup(recipe, LaunchSetup(), command)   # Setup(model_path, tokenizer, start, train_dataset, audit, eval_suites)

In order: the remote-code warning, the checks before any load, the model's path, the hub commits every later load
reads, the tokenizer, the output_dir (lock, resume, how the run starts), the training rows with their length audit,
the run recorded with the rows' fingerprint, the eval suites read, checked and audited before step 1.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

from accelerate import PartialState

from judgetrain.checks.preflight import check_before_start
from judgetrain.config.recipe import Recipe, remote_code_routes, remote_code_warning
from judgetrain.data.prepare import load_audited_dataset
from judgetrain.eval.rows import recipe_eval_suites
from judgetrain.models.aliases import resolve_model
from judgetrain.models.loading import load_recipe_tokenizer
from judgetrain.run.revisions import pin_hub_revisions
from judgetrain.run.start import prepare_output_dir, record_run
from judgetrain.utils.fingerprints import data_fingerprint

logger = logging.getLogger("judgetrain.train")


class Setup(NamedTuple):
    """What `setup` made: ``start`` is what the output_dir step returned (the launch: (checkpoint or None, identity,
    plan) after the run is recorded; the dry run: the output_dir's problems)."""

    model_path: str
    tokenizer: Any
    start: Any
    train_dataset: Any
    audit: dict
    eval_suites: Any


class LaunchSetup:
    """The launch's steps of `setup`, one method each."""

    def remote_code(self, recipe: Recipe, warning: str) -> None:
        if PartialState().is_main_process:
            logger.warning(warning)

    def check(self, recipe: Recipe) -> None:
        check_before_start(recipe)  # every predicted failure, before any load

    def model_path(self, recipe: Recipe) -> str:
        return resolve_model(recipe.model_args.model_name_or_path)

    def revisions(self, recipe: Recipe, model_path: str) -> dict:
        return pin_hub_revisions(recipe, model_path)

    def tokenizer(self, recipe: Recipe, model_path: str):
        return load_recipe_tokenizer(model_path, recipe.training_args, recipe.model_args)

    def output_dir(self, recipe: Recipe, revisions: dict):
        return prepare_output_dir(recipe, revisions)

    def train_rows(self, recipe: Recipe, tokenizer) -> tuple[Any, dict]:
        return load_audited_dataset(recipe, tokenizer)

    def record(self, recipe: Recipe, start, train_dataset, audit: dict, command: str | None):
        resume_from, identity, plan = start
        identity["data"] = audit.get("rows_fingerprint") or data_fingerprint(train_dataset)
        out = Path(recipe.training_args.output_dir)
        return resume_from, identity, record_run(out, identity, plan, recipe, command, resume_from)

    def eval_suites(self, recipe: Recipe, tokenizer):
        return recipe_eval_suites(recipe, tokenizer)


def setup(recipe: Recipe, steps: LaunchSetup, command: str | None = None) -> Setup:
    """The setup sequence (see the module doc) with ``steps``' methods."""
    warning = remote_code_warning(remote_code_routes(recipe.training_args, recipe.model_args),
                                  recipe.model_args.model_name_or_path)
    if warning:
        steps.remote_code(recipe, warning)
    steps.check(recipe)
    model_path = steps.model_path(recipe)
    revisions = steps.revisions(recipe, model_path)  # the hub commits every later load reads
    tokenizer = steps.tokenizer(recipe, model_path)
    start = steps.output_dir(recipe, revisions)
    train_dataset, audit = steps.train_rows(recipe, tokenizer)
    start = steps.record(recipe, start, train_dataset, audit, command)
    eval_suites = steps.eval_suites(recipe, tokenizer)  # read, checked and audited before step 1
    return Setup(model_path, tokenizer, start, train_dataset, audit, eval_suites)
