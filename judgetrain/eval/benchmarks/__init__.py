"""The eval suites, one module per benchmark, each a `Suite` registered by name (`judgetrain.config.suites`).

    suite = get_suite("rmbench")   # the registered class's instance
    suite.request(row, "judge"); suite.figures(records, "judge"); suite.headline; suite.unit

Adding a benchmark is one module with one `Suite` subclass decorated with ``@register`` (docs/evaluation.md, "Adding a
benchmark"); importing it registers it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from judgetrain.config.suites import registered, known_suites
from judgetrain.eval.benchmarks import (evalbiasbench, ideation, judgebench, judgebias,  # noqa: F401 (each registers its suite)
                                   pairwise, rewrites, rmbench)
from judgetrain.eval.benchmarks.base import Suite
from judgetrain.utils.errors import RecipeError

__all__ = ["Suite", "SuiteFacts", "get_suite", "known_suites"]


def get_suite(name: str) -> Suite:
    """The suite registered under ``name`` (RecipeError naming the valid ones for any other)."""
    cls = registered(name)
    if cls is None:
        raise RecipeError(f"unknown eval suite {name!r}; valid: {', '.join(known_suites())}")
    return cls()


class SuiteFacts(Mapping):
    """{suite name: one class attribute} over every registered suite, read when asked (a suite registered later is
    in it): ``SuiteFacts("headline")["rmbench"]`` is RM-Bench's headline figures."""

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def __getitem__(self, name: str) -> Any:
        cls = registered(name)
        if cls is None:
            raise KeyError(name)
        return getattr(cls, self.attr)

    def __iter__(self) -> Iterator[str]:
        return (n for n in known_suites() if registered(n) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)
