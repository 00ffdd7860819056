"""The eval suites' rows, read at the start of a run: validated, capped, length-audited, held as Arrow.

Without this, a suite's rows are read at its first eval (`judgetrain.eval.runner.evaluate`), in every process,
with bad rows an error: a bad validation row, a typo in ``eval_*_source`` or an offline node crash a run after
hours of training. `prepare_eval_rows` reads them before the model loads: each machine's main process first (the
others wait, then read its copy), the recipe's ``on_bad_row`` applied with the rejects written beside the training
rows' (``<output_dir>/rejects/eval_<suite>.jsonl``), the cap applied, the rows written once per machine to
``<output_dir>/eval_rows/<suite>/node-K`` and read back memory-mapped (a `datasets.Dataset` on ``spec.rows``: no
per-rank copy of every row as Python dicts for the whole run). The length audit counts the rows whose sequences
exceed ``max_length`` as the engine tokenises them (`judgetrain.eval.sequences`, no model needed; cut from the left,
or skipped with ``long_rows: skip``) and writes the counts to ``<output_dir>/eval_audit.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from accelerate import PartialState

from judgetrain.config.recipe import PROXY_MODES, Recipe, scoring_modes
from judgetrain.data.prepare import reload_memory_mapped, tokenizer_key
from judgetrain.eval.sequences import SequenceBuilder
from judgetrain.eval.session import Evaluation
from judgetrain.eval.suites import (SuiteSpec, applies, build_requests, check_verdict_tokens, load_suite_dataset,
                                   load_suite_rows, verdict_suites)
from judgetrain.utils.files import read_json, write_json
from judgetrain.utils.fingerprints import code_digest

logger = logging.getLogger(__name__)

AUDIT_FILE = "eval_audit.json"
AUDIT_BATCH = 256  # rows the length audit tokenises together
_GROUP_FIELDS = ("domain", "id", "perturbation_type", "pair_id", "category", "source")  # what the row cap reads
# (suites._group_key)


def suite_dataset(spec: SuiteSpec, *, on_bad_row: str = "error", rejects_path: str | None = None):
    """The suite's rows from its source, validated (``on_bad_row``), after the row cap, as a `datasets.Dataset`."""
    ds = load_suite_dataset(spec, on_bad_row=on_bad_row, rejects_path=rejects_path)
    if spec.max_rows is None or spec.max_rows >= len(ds):
        return ds
    # the cap of load_suite_rows, drawn on the fields it reads only
    fields = [f for f in _GROUP_FIELDS if f in ds.column_names]
    keys = [dict({f: r[f] for f in fields}, __index=i) for i, r in enumerate(ds.select_columns(fields))]
    probe = SuiteSpec(spec.name, max_rows=spec.max_rows, seed=spec.seed, mode=spec.mode, rows=keys)
    return ds.select([r["__index"] for r in load_suite_rows(probe)])


def recipe_specs(recipe: Recipe) -> list[SuiteSpec]:
    """The suites a recipe evaluates during training ([] when it does not evaluate): its evaluation's
    (`Evaluation.from_recipe`: its ``eval_*`` keys, the run's seed for the row cap, a suite of data modes in the format
    the judge is trained on)."""
    script_args, training_args = recipe.script_args, recipe.training_args
    if not script_args.eval_suites or (training_args.eval_strategy == "no" and not training_args.eval_on_start):
        return []
    return Evaluation.from_recipe(recipe).suite_specs()


def recipe_eval_suites(recipe: Recipe, tokenizer) -> list[SuiteSpec]:
    """The suites a recipe evaluates during training, their rows read now (`prepare_eval_rows`); [] when it does
    not evaluate. Give them to the run's `JudgeEvalCallback`."""
    script_args = recipe.script_args
    specs = recipe_specs(recipe)
    if verdict_suites([s.name for s in specs], script_args.eval_scoring):
        check_verdict_tokens(tokenizer)  # before any row is read or weight loaded
    if specs:
        evaluation = Evaluation.from_recipe(recipe)
        prepare_eval_rows(specs, recipe.training_args.output_dir, on_bad_row=script_args.on_bad_row,
                          tokenizer=tokenizer, max_length=evaluation.max_length, scoring=script_args.eval_scoring,
                          long_inputs=evaluation.long_inputs)
    return specs


def prepare_eval_rows(specs: list[SuiteSpec], output_dir: str | Path, *, on_bad_row: str = "error",
                      tokenizer: Any = None, max_length: int | None = None, scoring: str | list[str] = "implicit",
                      long_inputs: str = "truncate_prompt", state: Any = None) -> dict[str, Any]:
    """Read every suite's rows now (see the module doc) and keep them on the specs (``spec.rows``, a memory-mapped
    Dataset; ``spec.max_rows`` then None, as after the first eval). All processes call it together. Returns the
    length audit ({suite: counts}), also written to ``<output_dir>/eval_audit.json`` by the main process."""

    state = state or PartialState()
    out = Path(output_dir)
    audit: dict[str, Any] = {}
    keys: dict[str, str] = {}
    earlier = _earlier_audit(out / AUDIT_FILE, read_json) if state.is_main_process else {}
    for spec in specs:
        if spec.rows is not None:
            continue
        ds = None
        with state.main_process_first():  # the main process reads (and downloads) first; the others hit its cache
            if state.is_local_main_process:
                ds = suite_dataset(spec, on_bad_row=on_bad_row,
                                   rejects_path=str(out / "rejects" / f"eval_{spec.name}.jsonl"))
        quiet = logging.getLogger(reload_memory_mapped.__module__)
        level = quiet.level
        quiet.setLevel(logging.WARNING)  # its lines speak of training rows
        try:
            spec.rows, fingerprint, reused = reload_memory_mapped(ds, out / "eval_rows" / spec.name, state)
        finally:
            quiet.setLevel(level)
        spec.max_rows = None
        if state.is_main_process:
            logger.info("Eval rows [%s]: %d rows %s %s (memory-mapped)", spec.name, len(spec.rows),
                        "kept in" if reused else "written to", out / "eval_rows" / spec.name)
            if tokenizer is not None and max_length:
                key = _audit_key(fingerprint, tokenizer, max_length, long_inputs, scoring)
                kept = (earlier.get("suites") or {}).get(spec.name)
                if key and (earlier.get("keys") or {}).get(spec.name) == key and isinstance(kept, dict):
                    audit[spec.name] = kept  # the same rows, tokenizer and settings as the start that counted them
                    logger.info("Eval audit [%s]: %d rows, %d longer than max_length=%d, longest %d tokens (counted at "
                                "an earlier start of the same rows and tokenizer: not tokenised again)", spec.name,
                                kept.get("rows", 0), kept.get("too_long", 0), max_length, kept.get("longest", 0))
                else:
                    audit[spec.name] = audit_eval_lengths(spec, tokenizer, max_length, long_inputs, scoring)
                if key:
                    keys[spec.name] = key
    if state.is_main_process and audit:
        write_json(out / AUDIT_FILE, {"max_length": max_length, "long_inputs": long_inputs, "suites": audit,
                                      "keys": keys})
    return audit


def _earlier_audit(path: Path, read_json) -> dict:
    """The counts an earlier start wrote; a torn file (truncated, zero-filled) is named and counted again."""
    value = read_json(path)
    if value is None and path.exists():
        logger.warning("%s is torn (not a JSON object): the eval lengths are counted again", path)
    return value or {}


def _audit_key(fingerprint: str | None, tokenizer: Any, max_length: int, long_inputs: str, scoring) -> str | None:
    """What an eval length audit's counts depend on: the rows (their fingerprint), the tokenizer, max_length, the
    long-input action, the scoring modes and the code that builds the sequences; None when the rows or the
    tokenizer cannot be told apart."""

    tok = tokenizer_key(tokenizer)
    if not fingerprint or not tok:
        return None
    code = code_digest("eval/sequences.py", "eval/suites.py", "eval/rows.py")  # the code that builds what it counts
    parts = [fingerprint, tok, max_length, long_inputs, scoring_modes(scoring), code]
    return hashlib.sha256(json.dumps(parts, default=str).encode("utf-8")).hexdigest()


def audit_eval_lengths(spec: SuiteSpec, tokenizer: Any, max_length: int, long_inputs: str = "truncate_prompt",
                       scoring: str | list[str] = "implicit") -> dict[str, int]:
    """How many of the suite's rows the engine would cut or skip at ``max_length`` (tokenised as it scores them),
    over every mode of ``scoring`` (a mode or a list, as eval_scoring; generate writes after the judge prompts)."""

    modes = scoring_modes(scoring)
    kinds = [m for m in modes if m in PROXY_MODES and applies(spec.name, m)] + (
        ["judge"] if "generate" in modes and "judge" not in modes else []) + (
        ["verdict"] if "verdict" in modes and applies(spec.name, "verdict") else [])
    counts = {"rows": 0, "too_long": 0, "longest": 0}
    sequences = SequenceBuilder(tokenizer, max_length=1 << 30)  # nothing cut: each sequence's whole length
    for start in range(0, len(spec.rows), AUDIT_BATCH):  # a batch of rows at a time: each prompt tokenised once
        batch = list(spec.rows.select(range(start, min(start + AUDIT_BATCH, len(spec.rows))))) \
            if hasattr(spec.rows, "select") else spec.rows[start:start + AUDIT_BATCH]
        longest = [0] * len(batch)
        for kind in kinds:
            requests = [build_requests(spec, row, kind) for row in batch]
            owner = [i for i, built in enumerate(requests) for _ in built]  # the row of each request
            for s in sequences.build([r for built in requests for r in built])[0]:
                longest[owner[s.row]] = max(longest[owner[s.row]], len(s.ids))
        counts["rows"] += len(batch)
        counts["longest"] = max([counts["longest"], *longest])
        counts["too_long"] += sum(n > max_length for n in longest)
    action = "skipped" if long_inputs == "skip" else "cut from the left (the prompt)"
    logger.info("Eval audit [%s]: %d rows, %d longer than max_length=%d (%s at each eval), longest %d tokens",
                spec.name, counts["rows"], counts["too_long"], max_length, action, counts["longest"])
    return counts
