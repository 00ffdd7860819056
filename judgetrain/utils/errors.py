"""The error every stage raises for a run that cannot start as asked; the commands turn it into one line and exit 2."""


class RecipeError(ValueError):
    """A recipe that cannot run: unknown key, bad value, missing file. Raised before any weights load."""
