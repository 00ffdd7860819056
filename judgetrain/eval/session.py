"""An evaluation, built in one place: what `EvalArguments` ask for, made into the scoring engine, the generator and the
suites. `judgetrain eval` and the per-epoch callback (`judgetrain.eval.callback.JudgeEvalCallback`) both build theirs
from an `Evaluation`:

    evaluation = Evaluation(eval_args, max_length=1024)        # or Evaluation.from_recipe(recipe)
    specs = evaluation.suite_specs()
    engine = evaluation.engine(model, tokenizer)
    generator = evaluation.generator(model, tokenizer)          # None unless generate is among the modes

The generator's room is the rule `generation_room` states once: the prompt keeps the ``max_length`` scoring gives it
and the answer's ``eval_generate_max_new_tokens`` come on top.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from judgetrain.config.recipe import REGRESSION_ACTIONS, EvalArguments, Recipe, scoring_modes
from judgetrain.config.suites import known_suites, registered
from judgetrain.eval.generate import Generator
from judgetrain.eval.scoring import ScoringEngine
from judgetrain.eval.suites import SuiteSpec, suite_specs


@dataclass
class Evaluation:
    """The evaluation `EvalArguments` describe, with what the caller adds to them.

    Args:
        args: the evaluation options (a recipe's ``script_args``, or `judgetrain eval`'s).
        max_length: longest scored sequence (None: the model's context).
        long_inputs: longer inputs: ``truncate_prompt`` (cut from the left) or ``skip``.
        model_revision: the pinned revision of the model's hub repository (a vLLM engine loads the base at it).
        seed: seed of the row cap's sample.
        ideation_mode: the format Ideation is scored in (``implicit`` or ``pairwise``).
    """

    args: EvalArguments = field(default_factory=EvalArguments)
    max_length: int | None = None
    long_inputs: str = "truncate_prompt"
    model_revision: str | None = None
    seed: int = 0
    ideation_mode: str = "implicit"

    def __post_init__(self) -> None:
        if self.args.eval_regression_action not in REGRESSION_ACTIONS:
            raise ValueError(f"regression_action: one of {REGRESSION_ACTIONS}, got "
                             f"{self.args.eval_regression_action!r}")

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> Evaluation:
        """A training run's evaluation: the recipe's ``eval_*`` keys, its ``max_length`` and ``long_rows``, the run's
        seed for the row cap, the pinned ``model_revision``, and a suite whose rows come in data modes in the format
        the judge is trained on (`Suite.trained_mode`: the ``mode`` of a component of ``train_datasets`` in its
        schema)."""
        script_args, training_args = recipe.script_args, recipe.training_args
        components = script_args.train_datasets or []
        trained = [cls().trained_mode(components) for cls in map(registered, known_suites())
                   if cls is not None and cls.takes_mode]
        ideation_mode = next((m for m in trained if m), "implicit")
        return cls(script_args, max_length=training_args.max_length,
                   long_inputs="skip" if script_args.long_rows == "skip" else "truncate_prompt",
                   model_revision=recipe.model_args.model_revision, seed=training_args.seed or 0,
                   ideation_mode=ideation_mode)

    @property
    def modes(self) -> list[str]:
        """The scoring modes, in the order given (``eval_scoring``)."""
        return scoring_modes(self.args.eval_scoring)

    @property
    def generation_room(self) -> int | None:
        """Longest prompt + answer the generator writes: ``max_length`` (the prompt as it is scored) plus
        ``eval_generate_max_new_tokens`` on top; None without a ``max_length`` (the model's context). With
        ``max_length`` alone, a recipe whose prompts nearly fill it (the laptop recipe: 768, prompts ~450 tokens)
        would cut every prompt's rubric away to make room for the answer."""
        return self.max_length + self.args.eval_generate_max_new_tokens if self.max_length else None

    @property
    def regression(self) -> dict[str, float]:
        """The regression guard's margin and alpha (`judgetrain.eval.runner.evaluate_and_write`)."""
        return self.args.regression_kwargs()

    def suite_specs(self) -> list[SuiteSpec]:
        """The suites the arguments name, with their sources, splits, cap and seed (`judgetrain.eval.suites`)."""
        return suite_specs(self.args, seed=self.seed, ideation_mode=self.ideation_mode)

    def engine(self, model: Any, tokenizer: Any, *, ref_model: Any = None, ref_key: str | None = None,
               ref_cache: dict[str, float] | None = None,
               stop_check: Callable[[], bool] | None = None) -> ScoringEngine:
        """The scoring engine of ``model`` (see `ScoringEngine` for the reference options and ``stop_check``)."""
        return ScoringEngine(model, tokenizer, ref_model=ref_model, max_length=self.max_length,
                             long_inputs=self.long_inputs, ref_key=ref_key, ref_cache=ref_cache, stop_check=stop_check,
                             **self.args.engine_kwargs())

    def generator(self, model: Any, tokenizer: Any, *,
                  stop_check: Callable[[], bool] | None = None) -> Generator | None:
        """The generator of generate mode (None when generate is not among the modes), its room `generation_room`."""
        if "generate" not in self.modes:
            return None
        return Generator(model, tokenizer, max_length=self.generation_room, model_revision=self.model_revision,
                         stop_check=stop_check, **self.args.generator_kwargs())
