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

This module sits in the recipe's layer so that the recipe can check suite names at parse; the classes live above.
"""

from __future__ import annotations

from typing import Any

from judgetrain.utils.errors import RecipeError

# judgetrain's own suites, in the order reports list them (their classes: judgetrain.eval.benchmarks)
BUILTIN = ("rmbench", "judgebias", "ideation", "evalbiasbench", "judgebench", "pairwise")
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


def suite_names() -> tuple[str, ...]:
    """Every suite's name: judgetrain's own, then those registered since, in their order."""
    return BUILTIN + tuple(n for n in _CLASSES if n not in BUILTIN)


def registered(name: str) -> Any:
    """The class registered under ``name``, None when its module is not imported (or there is no such suite)."""
    return _CLASSES.get(name)


def check_suite_name(name: str, where: str = "eval_suites") -> None:
    """RecipeError naming the valid suites for a name that is none of them."""
    if name not in suite_names():
        raise RecipeError(f"{where}: unknown suite {name!r}; valid: {', '.join(suite_names())}")


def example_figure(name: str) -> str:
    """A figure of the suite, to show how a metric is named (``total_avg_acc``); ``<figure>`` when not loaded."""
    cls = registered(name)
    return cls.example_figure if cls is not None else "<figure>"
