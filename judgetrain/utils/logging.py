"""The one logging set-up of every judgetrain entry point (each command's ``main``, each process of a launch)."""

# Late imports: datasets, transformers (inside the functions that use them): the shared leaves are imported by every
# command, the light ones included: a library comes in with the function that needs it.

from __future__ import annotations

import logging
import sys

from tqdm import tqdm

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class BarSafeHandler(logging.StreamHandler):
    """A stderr handler that writes through `tqdm.write`: a progress bar drawn on the terminal (the training bar of
    transformers' ProgressCallback, a datasets map) is cleared, the line written, the bar drawn again below it, so a
    log line never lands inside a bar's line. Like logging's last-resort handler it writes to ``sys.stderr`` as it is
    when the line is written, not as it was when the handler was made (a stream replaced and closed since, by a
    redirect or a test's capture, would lose every later line)."""

    def __init__(self, stream=None) -> None:
        super().__init__(stream)
        self._given = stream  # a stream named here is kept; without one, sys.stderr at each line

    @property
    def stream(self):
        return self._given if self._given is not None else sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # logging.StreamHandler assigns it; setStream names a stream to keep
        self._given = value

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(tqdm, "_instances", None):  # no bar drawn: a plain line
            super().emit(record)
            return
        try:
            tqdm.write(self.format(record), file=self.stream)
        except (ValueError, OSError):  # a bar left open on a stream since closed: the line is still written
            super().emit(record)
        except Exception:  # noqa: BLE001 - logging's own contract: a failed emit is reported, never raised
            self.handleError(record)


def setup_logging(main: bool = True, *, quiet: bool = False, force: bool = False) -> None:
    """judgetrain's messages at INFO on the main process and WARNING on the others, so each is printed once.

    On the other processes transformers logs errors only and no progress bar is drawn (datasets, transformers and
    the hub's): one copy of each, from the main process, which keeps the libraries' own defaults. ``quiet`` (the
    bench's measured workers): warnings only and no progress bars on every process. A root logger that already has
    handlers (an embedding program, pytest) is left as it is unless ``force`` (a training process, which owns its
    output)."""
    logging.basicConfig(format=FORMAT, level=logging.INFO if main and not quiet else logging.WARNING, force=force,
                        handlers=[BarSafeHandler()])
    if main and not quiet:
        return
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.disable_progress_bar()
