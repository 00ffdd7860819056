"""The bad-input family: every error that means "this run (or command) cannot start as asked", raised before any
weights load. Each derives from `BadInputError`; the entry points catch that one class, print one line (the message
says the fix) and exit with `judgetrain.run.state.EXIT_BAD_INPUT` (2).

| error                                     | raised for                                                   |
|-------------------------------------------|--------------------------------------------------------------|
| `RecipeError`                             | a recipe key, value, env entry or option that cannot run     |
| `judgetrain.checks.preflight.PreflightError` | a start-up check (packages, disk, hub offline) that fails (a RecipeError) |
| `judgetrain.data.validate.DataValidationError` | rows that fail validation (source, split, row, field)    |
| `judgetrain.data.pairs.PanelDataError`    | a panel file that cannot be read at all                      |
| `judgetrain.judge.judges.JudgeSpecError`  | a `--judge` / `--judges_file` entry that cannot be used      |
| `judgetrain.trainer.parallelism.ParallelismError` | a launch whose parallelism this machine would not give |
| `MissingFileError`                        | a data source, split, bundled sample or run folder that does not exist |

Each also keeps the builtin base its callers caught before (ValueError, RuntimeError, FileNotFoundError).
"""


class BadInputError(Exception):
    """An input that cannot be used as given; the message names it (file, split, row, field or key) and the fix."""


class RecipeError(BadInputError, ValueError):
    """A recipe that cannot run: unknown key, bad value, missing file. Raised before any weights load."""


class MissingFileError(BadInputError, FileNotFoundError):
    """A file or folder the input names does not exist (a data source, a split's files, a run directory)."""


def exception_chain(exc: BaseException | None):
    """``exc`` and the exceptions it was raised from or during, each once (libraries wrap the error that matters)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__
