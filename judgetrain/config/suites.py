"""The eval suites by name: the one registry.

Each benchmark is one class in its own module of `judgetrain.eval.benchmarks` (its rows, requests, records, unit of
independence, figures and headline); `register` files it here under its ``name`` when that module is imported, and
everything that reads a suite (the recipe's ``eval_suites``, `judgetrain compare`, the report, the model card, the
regression guard, the loop's round table) looks it up by name instead of branching on it. A suite defined elsewhere
(a test's, a team's) registers the same way and is scored, compared and reported like judgetrain's own::

    @register
    class MySuite(Suite):
        name = "mysuite"
        ...

This module sits in the recipe's layer so that the recipe can check suite names (and the eval schedule's metric) at
parse; the classes live above.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from judgetrain.config.directions import greater_is_better
from judgetrain.utils.errors import RecipeError

logger = logging.getLogger(__name__)

# judgetrain's own suites, in the order reports list them (their classes: judgetrain.eval.benchmarks)
BUILTIN = ("rmbench", "judgebias", "ideation", "judgebench", "pairwise", "rewrites", "evalbiasbench")
DEFAULT = ("rmbench", "judgebias", "ideation")  # eval_suites' default: the suites with a bundled sample
_CLASSES: dict[str, Any] = {}


def register(cls: Any) -> Any:
    """Files a suite class under its ``name`` (a class decorator); a second class under a taken name is refused."""
    name = cls.name
    if name in _CLASSES and _CLASSES[name] is not cls:
        raise ValueError(f"eval suite {name!r} is registered twice ({_CLASSES[name].__qualname__}, {cls.__qualname__})")
    _CLASSES[name] = cls
    return cls


def unregister(name: str) -> None:
    """Removes a suite registered at run time (judgetrain's own stay)."""
    if name not in BUILTIN:
        _CLASSES.pop(name, None)


def known_suites() -> tuple[str, ...]:
    """Every suite's name: judgetrain's own, then those registered since, in their order."""
    return BUILTIN + tuple(n for n in _CLASSES if n not in BUILTIN)


def registered(name: str) -> Any:
    """The class registered under ``name``, None when its module is not imported (or there is no such suite)."""
    return _CLASSES.get(name)


def check_suite_name(name: str, where: str = "eval_suites") -> None:
    """RecipeError naming the valid suites for a name that is none of them."""
    if name not in known_suites():
        raise RecipeError(f"{where}: unknown suite {name!r}; valid: {', '.join(known_suites())}")


def example_figure(name: str) -> str:
    """A figure of the suite, to show how a metric is named (``total_avg_acc``); ``<figure>`` when not loaded."""
    cls = registered(name)
    return cls.example_figure if cls is not None else "<figure>"


def suite_names(value: Any) -> Any:
    """eval_suites as a list of names: ``rmbench,judgebias`` split at commas, ``none`` / ``[]`` / ``""`` give []
    (``--eval_suites none`` turns evaluation off). A value that is no list of names is returned as it is."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return value
    names = [part.strip() for item in value for part in str(item).split(",") if part.strip()]
    return [] if [n.lower() for n in names] in (["none"], ["[]"]) else names


def default_eval_strategy(options: dict[str, Any]) -> str:
    """eval_strategy when the recipe leaves it unset: steps with eval_steps, else epoch, when suites are set."""
    if not suite_names(options.get("eval_suites", list(DEFAULT))):
        return "no"
    return "steps" if options.get("eval_steps") else "epoch"


def check_eval_schedule(script_args, training_args, recipe_path=None, greater_given: bool = False) -> None:
    """The eval schedule (TrainingArguments' keys) asks only for what the suites can give: judgetrain has no
    eval_dataset, its evaluation is the suites. metric_for_best_model may be spelt as metrics.jsonl shows it
    (``eval/rmbench/total_avg_acc``), as Trainer looks it up (``eval_rmbench/total_avg_acc``) or without the prefix;
    ``greater_is_better`` follows the figure's direction (`judgetrain.config.directions`: ``style_spread`` lower),
    and a recipe that sets it (``greater_given``) the other way, or names a figure best at a value, is refused.
    ``eval_suites: none`` turns the evaluation off, the baseline before the first step (``eval_on_start``) with it,
    said in one line: a recipe that scores its start (the quickstart) runs without evaluating by that one key."""
    where = f"recipe {recipe_path}: " if recipe_path else ""
    suites = script_args.eval_suites
    if not suites and training_args.eval_on_start:
        training_args.eval_on_start = False
        if os.environ.get("RANK", "0") == "0":  # parsed on every process of a launch: said once
            logger.info("eval_suites is empty: no evaluation, eval_on_start's baseline included")
    if not suites:
        asks = {"eval_strategy": training_args.eval_strategy != "no",
                "load_best_model_at_end": training_args.load_best_model_at_end,
                "save_strategy": training_args.save_strategy == "best"}
        asked = [key for key, on in asks.items() if on]
        if asked:
            value = getattr(training_args, asked[0])
            raise RecipeError(f"{where}{asked[0]}: {getattr(value, 'value', value)} asks for evaluations, but "
                              f"eval_suites is empty: name the suites to score, or drop {asked[0]}")
        return
    metric = training_args.metric_for_best_model
    if metric is None or training_args.eval_strategy == "no":
        return
    name = str(metric).removeprefix("eval/").removeprefix("eval_")
    if name.split("/", 1)[0] not in suites:
        default = " (TrainingArguments' default with load_best_model_at_end)" if metric == "loss" else ""
        raise RecipeError(
            f"{where}metric_for_best_model: {metric!r}{default} is not a figure of the eval suites "
            f"({', '.join(suites)}): name one as metrics.jsonl shows it, e.g. "
            f"eval/{suites[0]}/{example_figure(suites[0])}")
    try:
        greater = greater_is_better(name)
    except ValueError as e:
        raise RecipeError(f"{where}metric_for_best_model: {e}") from None
    if greater_given and bool(training_args.greater_is_better) != greater:
        raise RecipeError(f"{where}greater_is_better: {training_args.greater_is_better}, but {name} is "
                          f"{'higher' if greater else 'lower'}-is-better: drop greater_is_better (it follows the "
                          "figure) or choose another metric_for_best_model")
    training_args.greater_is_better = greater
    training_args.metric_for_best_model = "eval_" + name  # the key Trainer and its callbacks look up
