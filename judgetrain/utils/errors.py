"""The error every stage raises for a run that cannot start as asked; the commands turn it into one line and exit 2."""


class RecipeError(ValueError):
    """A recipe that cannot run: unknown key, bad value, missing file. Raised before any weights load."""


def exception_chain(exc: BaseException | None):
    """``exc`` and the exceptions it was raised from or during, each once (libraries wrap the error that matters)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__
