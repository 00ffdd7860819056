"""The command-line parser of a recipe: TRL's `TrlParser` whose errors are `RecipeError`s.

A module of its own because it imports trl at its top (transformers and torch come with it): `judgetrain.config.recipe`
imports it only when a recipe is parsed, so that reading the recipe schema (the exit codes, the dry run's keys) stays
quick.
"""

from __future__ import annotations

from trl import TrlParser

from judgetrain.utils.errors import RecipeError


class RecipeParser(TrlParser):
    """`TrlParser` that raises `RecipeError` naming the option and why, where argparse would print usage and exit."""

    def error(self, message):
        raise RecipeError(f"command line: {message}")
